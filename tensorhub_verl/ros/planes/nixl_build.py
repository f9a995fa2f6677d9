"""Which NIXL build to import: NIXL ships one wheel per CUDA major (``nixl-cu12``, ``nixl-cu13``), each a
differently named module with the same API. The one that matches torch's CUDA runtime is used, so that NIXL and
torch load the same CUDA libraries; a CPU build of torch takes whichever is installed (cu12 first, as
``requirements/constraints.txt`` pins it)."""

from __future__ import annotations

import importlib
from types import ModuleType

_CANDIDATES = ("nixl_cu12", "nixl_cu13")


def preferred_modules(cuda_version: str | None) -> tuple[str, ...]:
    """Module names to try, best first, for torch's ``torch.version.cuda`` (None on a CPU build)."""
    if cuda_version:
        major = f"nixl_cu{cuda_version.split('.')[0]}"
        return (major, *(m for m in _CANDIDATES if m != major))
    return _CANDIDATES


def nixl_api() -> ModuleType:
    """NIXL's ``_api`` module (``nixl_agent``, ``nixl_agent_config``) from the best installed build.
    Raises ImportError naming every build tried and what to install, never a silent None."""
    import torch

    tried = []
    for name in preferred_modules(torch.version.cuda):
        try:
            return importlib.import_module(f"{name}._api")
        except ImportError as e:
            tried.append(f"{name}: {e}")
    raise ImportError("NIXL is required for TensorHub's NIXL data plane and no build imports ("
                      + "; ".join(tried) + "); pip install nixl-cu12 (CPU or CUDA 12) or nixl-cu13 (CUDA 13)")


def nixl_installed() -> bool:
    """Whether some NIXL build is importable (for tests that need one)."""
    return any(importlib.util.find_spec(name) is not None for name in _CANDIDATES)


__all__ = ["nixl_api", "nixl_installed", "preferred_modules"]
