"""verl 0.9.1 fixes that only verl's CPU platform needs (``VERL_PLATFORM=cpu``), in the product's patch format
(``tensorhub_verl.verl.patches``: ``VERL_VERSIONS``, ``TARGET``, ``describe()``, ``apply(module)``). ``plugin``
registers them on the CPU platform only."""

CPU_MARK = "_tensorhub_cpu_patch"
"""The replacement mark of these patches: a function the product's patches also wrap gets both wrappers."""
