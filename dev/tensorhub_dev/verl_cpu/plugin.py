"""The ``verl.plugins`` entry point of dev/ (``tensorhub_cpu``): on ``VERL_PLATFORM=cpu`` it registers verl's CPU
platform and applies the CPU patches; anywhere else it does nothing.

``import verl`` loads every plugin of the group before any verl module resolves its platform, so the platform is
registered in each process in time (Ray's workers and verl's vLLM processes import verl themselves). The patches
apply through the product's patch machinery (``tensorhub_verl.verl.patches.apply_patches``), each when its verl
module is imported.
"""

from __future__ import annotations

from tensorhub_verl.settings import cpu_platform_selected

PATCH_MODULES = tuple(f"tensorhub_dev.verl_cpu.patches.{name}" for name in (
    "verl_0_9_1_cpu_process_group",
    "verl_0_9_1_cpu_engine_registry",
    "verl_0_9_1_critic_attention",
    "verl_0_9_1_cpu_job_check",
))
"""The verl patches only the CPU platform needs."""


def load() -> None:
    """Registers the CPU platform and its patches when this process runs verl on the CPU platform."""
    if not cpu_platform_selected():
        return
    from tensorhub_dev.verl_cpu import platform  # noqa: F401  registers the platform named 'cpu'
    from tensorhub_verl.verl.patches import apply_patches

    apply_patches(PATCH_MODULES)


load()

__all__ = ["PATCH_MODULES", "load"]
