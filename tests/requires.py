"""Optional dependencies of the suite: present unless a core-only install is being tested.

``pytest.importorskip`` turns a broken install into a run of silent skips. The suite expects the full install
(``scripts/setup.sh``: verl, vLLM and the dev extras), so a missing module fails collection with its
``ImportError``; only ``TENSORHUB_CORE_ONLY=1`` (a check of the core package alone) turns the tests that need
one into skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

CORE_ONLY_ENV = "TENSORHUB_CORE_ONLY"


def core_only() -> bool:
    """Whether this run tests a core-only install (``TENSORHUB_CORE_ONLY=1``)."""
    return os.environ.get(CORE_ONLY_ENV, "").strip().lower() in ("1", "true", "yes")


def require(module_name: str, reason: str | None = None) -> ModuleType:
    """Imports ``module_name``; in a core-only run a missing module skips the caller instead of failing it."""
    if core_only():
        return pytest.importorskip(module_name, reason=reason)
    return importlib.import_module(module_name)


__all__ = ["CORE_ONLY_ENV", "core_only", "require"]
