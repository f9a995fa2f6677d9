"""Version-pinned fixes to verl, applied at import of the ``tensorhub`` backend.

Each patch is one small module named for the verl version it was written against (``verl_0_9_1_*.py``).
It exposes ``VERL_VERSIONS`` (the versions it is known to fit), ``describe()``, ``TARGET`` (the verl
module it changes; or ``TARGETS``, several modules it changes alike) and ``apply(module)`` (idempotent: False
when already applied). Every replacement checks at call time that the job uses TensorHub (``guards``) and
otherwise runs verl's code, so installing the package changes nothing for jobs with another checkpoint engine.

``apply_all`` applies each patch that fits the installed verl as soon as its target module is imported (now, if
it already is; see ``on_import``), and logs one line per application; a patch for another verl version is
skipped with a warning, so that an upgrade of verl shows up in the log instead of as a silent behaviour change.
The Ray-placement patches are registered only where a placement is asked for: in a process whose environment
carries ``TENSORHUB_TRAINER_PLACEMENT`` / ``_ROLLOUT_PLACEMENT`` / ``_HELPER_PLACEMENT`` (a TensorHub job's
runtime environment carries them when its config sets ``tensorhub.*_placement``), and the task runner's by
``python -m tensorhub_verl.verl.main_ppo``. ``apply_patches`` applies any list of patch modules the same way
(the developer tools' CPU harness uses it for its own). ``patches/verl/apply_patches.py`` at the repository root
runs the same check from a shell.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tensorhub_verl.verl.patches.on_import import when_imported
from tensorhub_verl.verl.pool_placement import ENV

logger = logging.getLogger("tensorhub_verl.verl.patches")

_PREFIX = "tensorhub_verl.verl.patches."
PATCH_MODULES = tuple(_PREFIX + name for name in (
    "verl_0_9_1_manager_update_weights",
    "verl_0_9_1_engine_holders",
    "verl_0_9_1_version_labels",
    "verl_0_9_1_balancer_rotation",
    "verl_0_9_1_trainer_shards",
    "verl_0_9_1_logger_flush",
    "verl_0_9_1_refuse_naive_modes",
    "verl_0_9_1_fully_async_metrics",
    "verl_0_9_1_file_logger_append",
    "verl_0_9_1_runtime_env_settings",
))
"""Applied in every process that loads the backend."""
PLACEMENT_MODULES = tuple(_PREFIX + name for name in (
    "verl_0_9_1_pool_placement",
    "verl_0_9_1_helper_loop_placement",
))
"""Applied only in a process whose environment carries a placement (``placement_asked``)."""
ENTRY_MODULES = (_PREFIX + "verl_0_9_1_task_runner_placement",)
"""Applied only by ``python -m tensorhub_verl.verl.main_ppo`` (``tensorhub_verl.verl.main_ppo``)."""
PLACEMENT_ENV = tuple(ENV.values())
"""The variables that ask for the placement patches (``pool_placement.placement_env`` sets them from a job's
config; a shell may set them too)."""


@dataclass(frozen=True, slots=True)
class PatchResult:
    name: str
    applied: bool
    reason: str


def installed_verl_version() -> str:
    import verl

    return verl.__version__


def placement_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's environment asks for a trainer, rollout or helper placement."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip() not in ("", "any") for name in PLACEMENT_ENV)


def apply_all(verl_version: str | None = None, *, now: bool = False,
              environ: Mapping[str, str] | None = None) -> list[PatchResult]:
    """Applies every patch of the backend that fits ``verl_version`` (default: the installed one) when its target
    is imported, the placement patches only where ``placement_asked``; with ``now`` the targets are imported at
    once (for the preflight check)."""
    asked = placement_asked(environ)
    results = apply_patches(PATCH_MODULES + (PLACEMENT_MODULES if asked else ()), verl_version, now=now)
    if not asked:
        results += check_patches(PLACEMENT_MODULES, verl_version, "fits; registered only where a placement is set")
    return results + check_patches(ENTRY_MODULES, verl_version,
                                   "fits; applied by python -m tensorhub_verl.verl.main_ppo")


def check_patches(modules: Iterable[str], verl_version: str | None, fits: str) -> list[PatchResult]:
    """Whether each patch fits ``verl_version``, without applying it (``fits``: the reason when it does)."""
    version = verl_version or installed_verl_version()
    results = []
    for module_name in modules:
        patch = importlib.import_module(module_name)
        name = module_name.rsplit(".", 1)[-1]
        ok = version in patch.VERL_VERSIONS
        results.append(PatchResult(name, ok, fits if ok else _unfit(patch, version)))
    return results


def apply_patches(modules: Iterable[str], verl_version: str | None = None, *,
                  now: bool = False) -> list[PatchResult]:
    """Applies each patch module of ``modules`` that fits ``verl_version`` when its target is imported (with
    ``now``: imports the targets at once)."""
    version = verl_version or installed_verl_version()
    results = []
    for module_name in modules:
        patch = importlib.import_module(module_name)
        name = module_name.rsplit(".", 1)[-1]
        if version not in patch.VERL_VERSIONS:
            reason = _unfit(patch, version)
            logger.warning("tensorhub_verl: NOT applying verl patch %s (%s)", name, reason)
            results.append(PatchResult(name, False, reason))
            continue
        targets = getattr(patch, "TARGETS", None) or (patch.TARGET,)  # a patch may fix one thing in several modules
        for target in targets:
            if now:
                importlib.import_module(target)
            when_imported(target, lambda module, patch=patch, name=name: _apply(patch, name, module, version))
        results.append(PatchResult(name, True, "applied" if now else f"applied when {', '.join(targets)} "
                                                                     f"is imported"))
    return results


def _unfit(patch, version: str) -> str:
    return f"written for verl {', '.join(patch.VERL_VERSIONS)}, installed verl is {version}"


def _apply(patch, name: str, module, version: str) -> None:
    if patch.apply(module):
        # WARNING, not INFO: verl sets the root logger to WARNING, and a changed verl code path must be
        # visible in every worker's log.
        logger.warning("tensorhub_verl: applied verl patch %s (verl %s): %s", name, version, patch.describe())
