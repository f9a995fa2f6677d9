"""Run a function right after a module is first imported (or now, if it already is).

verl's modules bind each other's functions by name at import (``from verl.utils.distributed import
initialize_global_process_group_ray``), so a patch must reach a module before anyone reads from it, yet
importing every target eagerly at ``import verl`` would pull heavy modules (trainers, Ray workers) into
processes that never use them. A post-import hook does both.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from types import ModuleType
from typing import Callable

logger = logging.getLogger("tensorhub_verl.verl.patches")

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


def when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Calls ``hook(module)`` once ``module_name`` is imported: now if it already is, else right after."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _hooks.setdefault(module_name, []).append(hook)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
            return
    hook(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of a hooked module so the hooks run after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = self._loader  # later reloads and introspection see the real loader
        self._loader.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self._name, [])
        for hook in hooks:
            hook(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


__all__ = ["when_imported"]
