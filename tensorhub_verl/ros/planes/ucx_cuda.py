"""What UCX needs to move CUDA memory, checked before the NIXL plane registers any: a transport list that keeps
its CUDA transports, and the driver's libraries that its CUDA module loads.

UCX touches GPU memory only through ``cuda_copy`` (copies between host and device, and within a process) and
``cuda_ipc`` (another process's memory on the same node); ``UCX_TLS`` without them (``tcp`` alone, say) leaves UCX
treating device addresses as host memory, which crashes its thread rather than failing a read. Its CUDA module
(``libuct_cuda``) links ``libcuda.so.1`` and ``libnvidia-ml.so.1``: both come with the NVIDIA driver, not with
NIXL or torch, and a container started without the driver's "utility" libraries lacks the second. Without
them UCX silently skips its CUDA transports, with the same result. Each problem is reported with its fix.
"""

from __future__ import annotations

import ctypes
from typing import Callable

CUDA_TRANSPORTS = ("cuda_copy", "cuda_ipc")
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
SUGGESTED_TLS = "cuda_copy,cuda_ipc,sm,tcp,self"


def tls_problem(ucx_tls: str | None) -> str | None:
    """Why ``UCX_TLS`` (its value, None when unset) cannot move CUDA memory, or None when it can.

    Accepted: unset or empty (UCX picks from every transport), a list naming ``all``, ``cuda`` or ``cuda_copy``,
    or an exclusion list (``^...``) that excludes neither ``cuda`` nor ``cuda_copy``."""
    if not ucx_tls or not ucx_tls.strip():
        return None
    value = ucx_tls.strip()
    names = {n.strip() for n in value.lstrip("^").split(",") if n.strip()}
    if value.startswith("^"):
        gone = names & {"cuda", "cuda_copy"}
        if not gone:
            return None
        return (f"UCX_TLS={value} excludes {', '.join(sorted(gone))}: UCX then cannot touch CUDA memory; "
                f"remove it from the exclusion list, or unset UCX_TLS")
    if names & {"all", "cuda", "cuda_copy"}:
        return None
    return (f"UCX_TLS={value} names no CUDA transport ({', '.join(CUDA_TRANSPORTS)}): UCX then treats CUDA memory "
            f"as host memory and its thread crashes on the first read; unset UCX_TLS or add them, e.g. "
            f"UCX_TLS={SUGGESTED_TLS}")


def missing_libraries(load: Callable[[str], object] = ctypes.CDLL) -> list[str]:
    """The driver libraries of ``DRIVER_LIBRARIES`` that cannot be loaded, each with the loader's reason."""
    missing = []
    for name in DRIVER_LIBRARIES:
        try:
            load(name)
        except OSError as e:
            missing.append(f"{name} ({e})")
    return missing


def cuda_memory_problems(ucx_tls: str | None, load: Callable[[str], object] = ctypes.CDLL) -> list[str]:
    """Everything that keeps UCX from moving CUDA memory in this process (empty: nothing known)."""
    problems = [p] if (p := tls_problem(ucx_tls)) else []
    if missing := missing_libraries(load):
        problems.append("UCX's CUDA transports need the NVIDIA driver's libraries, and these do not load: "
                        + "; ".join(missing) + ". Run where the driver's libraries are on the loader's path "
                        "(a container needs the driver capabilities 'compute,utility', e.g. "
                        "NVIDIA_DRIVER_CAPABILITIES=compute,utility), or use the TCP plane "
                        "(transport='tcp'), which moves CUDA memory through pinned host buffers")
    return problems


__all__ = ["CUDA_TRANSPORTS", "DRIVER_LIBRARIES", "SUGGESTED_TLS", "cuda_memory_problems", "missing_libraries",
           "tls_problem"]
