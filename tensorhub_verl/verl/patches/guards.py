"""When a patched verl function takes its TensorHub path instead of verl's own.

Installing tensorhub_verl registers every patch at ``import verl`` (the ``verl.plugins`` entry point), so each
replacement decides at call time, from what the call can see, whether this job uses TensorHub: the job's
config selecting ``checkpoint_engine.backend == 'tensorhub'``, or verl running on tensorhub_verl's CPU
platform (``VERL_PLATFORM=cpu``, which only this package provides). A job that uses neither gets verl's behaviour.
"""

from __future__ import annotations

from typing import Any

from tensorhub_verl.settings import cpu_platform_selected
from tensorhub_verl.verl import BACKEND_NAME
from tensorhub_verl.verl.trainer_modes import config_value

BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
"""Where a verl job's config (a DictConfig or the plain dict verl hands its loggers) names its backend."""


def job_uses_tensorhub(job_config: Any) -> bool:
    """Whether the job's whole config selects the ``tensorhub`` checkpoint engine."""
    return config_value(job_config, BACKEND_KEY) == BACKEND_NAME


def engine_uses_tensorhub(engine_config: Any) -> bool:
    """Whether a checkpoint-engine config (``...rollout.checkpoint_engine``) selects ``tensorhub``."""
    return config_value(engine_config, "backend") == BACKEND_NAME


__all__ = ["BACKEND_KEY", "cpu_platform_selected", "engine_uses_tensorhub", "job_uses_tensorhub"]
