"""verl 0.9.1: the separate_async trainer passes ``flush=True`` to a ``logging.Logger`` call.

Why: ``trainer/ppo/v1/trainer_separate_async.py:181-185`` logs with ``flush=True`` (a ``print`` keyword);
``Logger._log`` rejects it with ``TypeError`` whenever INFO is enabled, so every run with
``actor_rollout_ref.hybrid_engine=False`` (all separate_async recipes, on GPUs too) dies at set-up. The
module's logger is wrapped in an adapter that drops the keyword; nothing else changes.
"""

from __future__ import annotations

import logging

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.ppo.v1.trainer_separate_async"


class _DropFlush(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def describe() -> str:
    return "trainer_separate_async's logger ignores the print-only flush= keyword"


def apply(module) -> bool:
    if isinstance(module.logger, _DropFlush):
        return False
    module.logger = _DropFlush(module.logger, {})
    return True
