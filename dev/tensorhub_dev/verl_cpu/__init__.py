"""verl on a machine with no GPU: the CPU harness the tests, the demo and the CPU recipes run verl's trainers on.

verl 0.9.1 has no CPU platform, and a few of its code paths are CUDA-only even with one. This package holds what
makes its trainers run on plain CPUs, apart from the product (which never imports it):

- ``platform``: a verl platform named ``cpu`` (gloo collectives, logical Ray GPUs as scheduling slots);
- ``job_check``: the settings a CPU job needs, checked before any worker starts;
- ``patches``: the verl fixes that only the CPU platform needs (the process group's backend string, the FSDP
  engines' device registry, the critic's attention implementation, the job check at the trainer's start).

It is chosen by **one setting**, verl's own ``VERL_PLATFORM=cpu``: the ``verl.plugins`` entry point of dev/
(``plugin``, loaded by every ``import verl`` where dev/ is installed) registers the platform and the patches in
that case only, and does nothing otherwise. Importing this package itself has no side effect.
"""
