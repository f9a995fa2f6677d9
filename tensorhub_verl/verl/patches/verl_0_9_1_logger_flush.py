"""verl 0.9.1: the separate_async trainer passes ``flush=True`` to a ``logging.Logger`` call.

Why: ``trainer/ppo/v1/trainer_separate_async.py:181-185`` (in ``PPOTrainerSeparateAsync._setup``) logs with
``flush=True`` (a ``print`` keyword); ``Logger._log`` rejects it with ``TypeError`` whenever INFO is
enabled, so every run with ``actor_rollout_ref.hybrid_engine=False`` (all separate_async recipes, on GPUs too)
dies at set-up. Guard: while a trainer whose config selects ``tensorhub`` runs ``_setup``, the module's logger is an
adapter that drops the keyword; any other job runs ``_setup`` with verl's logger, unchanged.
"""

from __future__ import annotations

import functools
import logging

from tensorhub_verl.verl.patches.guards import job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.ppo.v1.trainer_separate_async"


class _DropFlush(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def describe() -> str:
    return "trainer_separate_async's logger ignores the print-only flush= keyword in tensorhub jobs"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def _setup(self, *args, **kwargs):
            if not job_uses_tensorhub(getattr(self, "config", None)):
                return original(self, *args, **kwargs)
            verl_logger = module.logger
            module.logger = _DropFlush(verl_logger, {})
            try:
                return original(self, *args, **kwargs)
            finally:
                module.logger = verl_logger

        return _setup

    return replace_once(module.PPOTrainerSeparateAsync, "_setup", wrap)
