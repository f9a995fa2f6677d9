"""Rollout staging on the GPU must fit beside vLLM's memory budget.

vLLM sizes its KV cache so that the engine uses ``gpu_memory_utilization`` of the GPU; a ``gpu`` staging copy of a
rank's parameters is allocated later, outside that budget. An engine whose staging would not fit refuses it at
setup, naming the bytes and the ``gpu_memory_utilization`` that leaves room, instead of failing with an
out-of-memory error in the middle of a pull.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tensorhub_verl.errors import ConfigError

GIB = 1 << 30
RESERVE_BYTES = 1 << 30
"""Kept free beside the staging copy: the CUDA caching allocator's rounding and the data plane's own buffers."""


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def check_gpu_staging(need_bytes: int, free_bytes: int, total_bytes: int, utilization: float,
                      reserve_bytes: int = RESERVE_BYTES) -> None:
    """Raises ConfigError unless ``need_bytes`` of staging plus ``reserve_bytes`` fit in ``free_bytes`` (what vLLM
    left of the GPU's ``total_bytes`` at ``utilization``)."""
    if need_bytes + reserve_bytes <= free_bytes:
        return
    short = need_bytes + reserve_bytes - free_bytes
    fits = utilization - short / total_bytes
    advice = (f"set gpu_memory_utilization to at most {fits:.2f}" if fits > 0 else
              "no gpu_memory_utilization leaves room for it")
    raise ConfigError(f"rollout_staging='gpu' needs {need_bytes / GIB:.2f} GiB (+{reserve_bytes / GIB:.2f} GiB "
                      f"reserve) on this GPU beside vLLM's gpu_memory_utilization={utilization:.2f} share, but only "
                      f"{free_bytes / GIB:.2f} GiB of {total_bytes / GIB:.2f} GiB is free: {advice}, or use "
                      f"rollout_staging='cpu' (pinned host memory) or 'none' (no copy)")


def check_engine_gpu_staging(params: dict[str, torch.Tensor], utilization: float) -> int:
    """``check_gpu_staging`` for an engine rank's CUDA parameters, on their device now; returns the bytes."""
    device = next(iter(params.values())).device
    need = tensor_bytes(params.values())
    free, total = torch.cuda.mem_get_info(device)
    check_gpu_staging(need, free, total, utilization)
    return need


__all__ = ["RESERVE_BYTES", "check_engine_gpu_staging", "check_gpu_staging", "tensor_bytes"]
