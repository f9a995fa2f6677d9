"""Which of verl's trainer modes move weights through the configured checkpoint engine (verl 0.9.1).

verl's v1 ``sync`` and ``colocate_async`` modes build their rollout replicas on the trainer's GPUs and force
the ``naive`` backend for them (``trainer/ppo/v1/trainer_base.py:382``); only the modes with standalone
rollout replicas use ``checkpoint_engine.backend``. Selecting TensorHub in a mode that ignores it is refused
with the modes that work, instead of training without it.
"""

from __future__ import annotations

from typing import Any

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl import BACKEND_NAME

MODES_USING_BACKEND = ("separate_async",)
"""v1 trainer modes whose standalone replicas use the configured backend (``+tensorhub=...`` works)."""
MODES_FORCING_NAIVE = ("sync", "colocate_async")
OTHER_ENTRY_POINTS = "verl.experimental.fully_async_policy.fully_async_main (fully_async)"


def config_value(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b.c`` for a DictConfig, a dict or an object, or ``default`` where a part is missing."""
    node = config
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        if node is None:
            return default
    return node


def check_trainer_mode(config: Any) -> None:
    """Raises ConfigError when TensorHub is selected in a trainer mode that would not use it."""
    if config_value(config, "actor_rollout_ref.rollout.checkpoint_engine.backend") != BACKEND_NAME:
        return
    if not config_value(config, "trainer.use_v1", True):
        raise ConfigError("+tensorhub=... needs verl's v1 trainer (trainer.use_v1=True): the legacy trainer "
                          "syncs weights in-process and never uses a checkpoint engine")
    mode = config_value(config, "trainer.v1.trainer_mode", "sync")
    if mode in MODES_FORCING_NAIVE:
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode} forces verl's 'naive' checkpoint engine, so +tensorhub=... would be "
            f"silently unused. Use trainer.v1.trainer_mode={' or '.join(MODES_USING_BACKEND)} with "
            f"actor_rollout_ref.hybrid_engine=False "
            f"(trainer and rollouts on separate devices), or {OTHER_ENTRY_POINTS}; or drop +tensorhub=...")


__all__ = ["MODES_FORCING_NAIVE", "MODES_USING_BACKEND", "check_trainer_mode"]
