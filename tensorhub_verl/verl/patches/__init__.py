"""Version-pinned fixes to verl, applied at import of the ``tensorhub`` backend.

Each patch is one small module named for the verl version it was written against
(``verl_0_9_1_*.py``) and exposes ``VERL_VERSIONS`` (the versions it is known to fit), ``describe()``
and ``apply(module)`` (idempotent). ``apply_all`` applies those whose versions match the installed verl
and logs one line per patch; a patch for another verl version is skipped with a warning, so that an
upgrade of verl shows up in the log instead of as a silent behaviour change.
``patches/verl/apply_patches.py`` at the repository root runs the same check from a shell.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

logger = logging.getLogger("tensorhub_verl.verl.patches")

PATCH_MODULES = ("tensorhub_verl.verl.patches.verl_0_9_1_manager_update_weights",)


@dataclass(frozen=True, slots=True)
class PatchResult:
    name: str
    applied: bool
    reason: str


def installed_verl_version() -> str:
    import verl

    return verl.__version__


def apply_all(verl_version: str | None = None) -> list[PatchResult]:
    """Applies every patch that fits ``verl_version`` (default: the installed one)."""
    version = verl_version or installed_verl_version()
    results = []
    for module_name in PATCH_MODULES:
        patch = importlib.import_module(module_name)
        name = module_name.rsplit(".", 1)[-1]
        if version not in patch.VERL_VERSIONS:
            reason = f"written for verl {', '.join(patch.VERL_VERSIONS)}, installed verl is {version}"
            logger.warning("tensorhub_verl: NOT applying verl patch %s (%s)", name, reason)
            results.append(PatchResult(name, False, reason))
            continue
        fresh = patch.apply()
        if fresh:
            # WARNING, not INFO: verl sets the root logger to WARNING, and a changed verl code path must be
            # visible in every worker's log.
            logger.warning("tensorhub_verl: applied verl patch %s (verl %s): %s", name, version, patch.describe())
        results.append(PatchResult(name, True, "applied" if fresh else "already applied"))
    return results
