"""Version-pinned fixes to verl, applied at import of the ``tensorhub`` backend.

Each patch is one small module named for the verl version it was written against (``verl_0_9_1_*.py``).
It exposes ``VERL_VERSIONS`` (the versions it is known to fit), ``describe()``, ``TARGET`` (the verl
module it changes; or ``TARGETS``, several modules it changes alike) and ``apply(module)`` (idempotent: False when already applied), and may set
``CPU_ONLY = True`` (applied only on verl's CPU platform, ``VERL_PLATFORM=cpu``). Every other replacement
checks at call time that the job uses TensorHub (``guards``) and otherwise runs verl's code, so installing the
package changes nothing for jobs with another checkpoint engine. ``apply_all`` applies
each patch that fits the installed verl as soon as its target module is imported (now, if it already is;
see ``on_import``), and logs one line per application; a patch for another verl version is skipped with a
warning, so that an upgrade of verl shows up in the log instead of as a silent behaviour change.
``patches/verl/apply_patches.py`` at the repository root runs the same check from a shell.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from tensorhub_verl.settings import cpu_platform_selected
from tensorhub_verl.verl.patches.on_import import when_imported

logger = logging.getLogger("tensorhub_verl.verl.patches")

_PREFIX = "tensorhub_verl.verl.patches."
PATCH_MODULES = tuple(_PREFIX + name for name in (
    "verl_0_9_1_manager_update_weights",
    "verl_0_9_1_engine_holders",
    "verl_0_9_1_version_labels",
    "verl_0_9_1_trainer_shards",
    "verl_0_9_1_logger_flush",
    "verl_0_9_1_refuse_naive_modes",
    "verl_0_9_1_fully_async_metrics",
    "verl_0_9_1_file_logger_append",
    "verl_0_9_1_critic_attention",
    "verl_0_9_1_cpu_process_group",
    "verl_0_9_1_cpu_engine_registry",
    "verl_0_9_1_runtime_env_settings",
    "verl_0_9_1_pool_placement",
    "verl_0_9_1_task_runner_placement",
    "verl_0_9_1_helper_loop_placement",
))


@dataclass(frozen=True, slots=True)
class PatchResult:
    name: str
    applied: bool
    reason: str


def installed_verl_version() -> str:
    import verl

    return verl.__version__


def apply_all(verl_version: str | None = None, *, now: bool = False) -> list[PatchResult]:
    """Applies every patch that fits ``verl_version`` (default: the installed one) when its target is
    imported; with ``now`` the targets are imported at once (for the preflight check)."""
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
        if getattr(patch, "CPU_ONLY", False) and not cpu_platform_selected():
            results.append(PatchResult(name, True, "not needed here"))
            continue
        targets = getattr(patch, "TARGETS", None) or (patch.TARGET,)  # a patch may fix one thing in several modules
        for target in targets:
            if now:
                importlib.import_module(target)
            when_imported(target, lambda module, patch=patch, name=name: _apply(patch, name, module, version))
        results.append(PatchResult(name, True, "applied" if now else f"applied when {', '.join(targets)} "
                                                                     f"is imported"))
    return results


def _apply(patch, name: str, module, version: str) -> None:
    if patch.apply(module):
        # WARNING, not INFO: verl sets the root logger to WARNING, and a changed verl code path must be
        # visible in every worker's log.
        logger.warning("tensorhub_verl: applied verl patch %s (verl %s): %s", name, version, patch.describe())
