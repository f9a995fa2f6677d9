"""verl on a machine with no GPU: the CPU harness the tests, the demo and the CPU recipes run verl's trainers on.

verl 0.9.1 has no CPU platform, and a few of its code paths are CUDA-only even with one. This package holds what
makes its trainers run on plain CPUs, apart from the product (which never imports it):

- ``platform``: a verl platform named ``cpu`` (gloo collectives, logical Ray GPUs as scheduling slots);
- ``job_check``: the settings a CPU job needs, checked before any worker starts;
- ``patches``: the verl fixes that only the CPU platform needs (the process group's backend string, the FSDP
  engines' device registry, the critic's attention implementation, the job check at the trainer's start).

It is chosen by **one setting**, verl's own ``VERL_PLATFORM=cpu``: the ``verl.plugins`` entry point of dev/
(``plugin``, loaded by every ``import verl`` where dev/ is installed) registers the platform and the patches in
that case only, and does nothing otherwise. Where dev/ is only on the path, not installed (an offline install:
the tests find it through ``tests/conftest.py``), ``with_plugin`` names the plugin in verl's own
``VERL_USE_EXTERNAL_MODULES``, which every ``import verl`` imports before any platform is resolved (and fails
without: every process of such a job must find dev/); the demo's job sets it. Importing this package itself has no
side effect.
"""

from __future__ import annotations

from collections.abc import Mapping

PLUGIN_MODULE = "tensorhub_dev.verl_cpu.plugin"
"""The module that registers the harness (dev/'s ``verl.plugins`` entry point ``tensorhub_cpu``)."""
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
"""verl's variable of modules to import at ``import verl`` (comma-separated)."""


def with_plugin(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the harness's plugin added to ``VERL_USE_EXTERNAL_MODULES`` (once)."""
    modules = [m for m in environ.get(EXTERNAL_MODULES_ENV, "").split(",") if m]
    return {**environ, EXTERNAL_MODULES_ENV: ",".join(modules if PLUGIN_MODULE in modules else
                                                      [*modules, PLUGIN_MODULE])}


__all__ = ["EXTERNAL_MODULES_ENV", "PLUGIN_MODULE", "with_plugin"]
