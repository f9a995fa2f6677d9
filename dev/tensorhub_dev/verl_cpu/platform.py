"""A CPU platform for verl 0.9.1, so that its trainers run on a machine with no accelerator.

verl resolves one platform per process (``verl.plugin.platform.get_platform``): auto-detection falls
back to ``nvidia`` when nothing is found, and NCCL then fails. This module registers a platform named
``cpu`` in verl's ``PlatformRegistry``; it is chosen by **one setting**, verl's own ``VERL_PLATFORM=cpu``,
which Ray passes on to every worker it starts on the node (workers inherit the raylet's environment).

What a CPU "device" means here:
- ``device_name`` is ``cpu`` and collectives run over ``gloo`` (FSDP2 over gloo works on CPU).
- Ray resource pools still ask for ``GPU`` bundles, one per worker: Ray is started with that many
  *logical* GPUs (``ray_kwargs.ray_init.num_gpus``), which are scheduling slots, not devices.
- The rest (RNG, allocator, profiling, IPC) is a no-op or the CPU equivalent.

verl code paths that are CUDA-only even with this platform are fixed by the version-pinned patches in
``tensorhub_dev.verl_cpu.patches``, which ``plugin`` applies only when this platform is selected.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from tensorhub_verl.settings import PLATFORM_ENV, PLATFORM_NAME, cpu_platform_selected


class CpuDeviceModule(ModuleType):
    """``torch.cpu`` plus what verl calls on ``torch.cuda`` that ``torch.cpu`` lacks.

    Memory figures are process-wide host facts (psutil), caches and IPC are no-ops, and the RNG state is
    torch's global CPU generator, so verl's memory logging and RNG save/restore keep working.
    """

    def __init__(self) -> None:
        super().__init__("tensorhub_dev.verl_cpu.device")

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def memory_allocated(device=None) -> int:
        return _rss_bytes()

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device=None) -> None:
        return None


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


_DEVICE_MODULE = CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface on plain CPUs (torch's CPU build, gloo collectives)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a GPU job whose CPU-only actors probe first must not pick it. VERL_PLATFORM selects it.
        return cpu_platform_selected()

    def current_device(self) -> torch.device:
        # verl passes this straight to ``.to(...)`` / ``device=``; the int 0 would mean "accelerator 0".
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding logical GPUs; nothing on a CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # verl's vLLM server processes are spawned by Ray with these; keep the CPU choice in them too.
        return {PLATFORM_ENV: PLATFORM_NAME}

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None


__all__ = ["PLATFORM_ENV", "PLATFORM_NAME", "PlatformCPU", "cpu_platform_selected"]
