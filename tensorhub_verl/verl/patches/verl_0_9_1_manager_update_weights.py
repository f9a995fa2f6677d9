"""verl 0.9.1: route ``CheckpointEngineManager.update_weights`` to the TensorHub updater.

Why: verl 0.9.1 hard-codes one sync sequence for every non-naive backend (abort all replicas, release
KV cache, build a process group over all workers, transfer, resume). For ``tensorhub`` that pause is
unnecessary: rollouts keep generating while they pull, and each pauses only for its own apply.
verl offers no hook to swap the sequence, and the separate-async and fully-async trainers construct
``CheckpointEngineManager`` directly, so the method itself is wrapped. Other backends take verl's
original path unchanged.
"""

from __future__ import annotations

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.checkpoint_engine.base"


def describe() -> str:
    return "CheckpointEngineManager.update_weights uses TensorHubUpdater when backend == 'tensorhub'"


def apply(base) -> bool:
    """Wraps the method of ``base`` (``verl.checkpoint_engine.base``); returns False if it was already wrapped."""
    from verl.utils.ray_utils import auto_await

    def wrap(original):
        # auto_await keeps functools.wraps' __wrapped__: the coroutine function underneath.
        original_coro = getattr(original, "__wrapped__", None)
        if original_coro is None:
            from tensorhub_verl.errors import ConfigError

            raise ConfigError("verl's CheckpointEngineManager.update_weights is not auto_await-wrapped as in 0.9.1; "
                              "this patch does not fit the installed verl")

        @auto_await
        async def update_weights(self, global_steps: int = None):
            from tensorhub_verl.verl import BACKEND_NAME

            if self.backend != BACKEND_NAME:
                return await original_coro(self, global_steps=global_steps)
            return await updater_for(self).update_weights(global_steps)

        update_weights.__doc__ = original.__doc__
        update_weights.__wrapped_original__ = original
        return update_weights

    return replace_once(base.CheckpointEngineManager, "update_weights", wrap)


def updater_for(manager):
    """The manager's TensorHubUpdater, created on first use. It reads ``manager.replicas`` at every update,
    so verl's add_replicas/remove_replicas (elastic scaling) take effect without a group rebuild."""
    updater = getattr(manager, "_tensorhub_updater", None)
    if updater is None:
        from tensorhub_verl.verl.updater import TensorHubUpdater, config_from_engine_config

        updater = TensorHubUpdater(config=config_from_engine_config(manager.config), actor_wg=manager.actor_wg,
                                   replicas=lambda: manager.replicas)
        manager._tensorhub_updater = updater
    return updater
