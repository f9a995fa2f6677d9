"""verl 0.9.1: a v1 trainer mode that would silently drop the ``tensorhub`` backend refuses to start.

Why: ``trainer/ppo/v1/trainer_base.py:382`` forces ``checkpoint_engine.backend = "naive"`` for the
replicas it builds, so in the ``sync`` and ``colocate_async`` modes ``+tensorhub=...`` changes nothing and
the user believes TensorHub moved the weights. ``PPOTrainer.__init__`` now checks the config first and
raises ``ConfigError`` naming the modes that use the configured engine.
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.ppo.v1.trainer_base"


def describe() -> str:
    return "v1 trainer modes that force the naive checkpoint engine refuse backend 'tensorhub' at start"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def __init__(self, config, *args, **kwargs):
            from tensorhub_verl.verl.trainer_modes import check_trainer_mode

            check_trainer_mode(config)
            original(self, config, *args, **kwargs)

        return __init__

    return replace_once(module.PPOTrainer, "__init__", wrap)
