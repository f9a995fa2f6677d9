"""verl 0.9.1: the actor worker hands the ``tensorhub`` engine its training engine, so every rank publishes
its own FSDP shard.

Why: for checkpoint-engine backends verl's ``ActorRolloutRefWorker.update_weights`` passes
``get_per_tensor_param()``, a generator of full tensors that gathers each one with ``full_tensor()``: one
rank ends up with the whole model, and the version leaves the trainer through one NIC. verl already hands
the engine itself to its ``delta_sharded`` backend; this does the same for ``tensorhub``, which then
publishes each rank's local shard (``tensorhub_verl.verl.shards``) or falls back to the generator. Other
backends take verl's path unchanged.
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.workers.engine_workers"


def describe() -> str:
    return "ActorRolloutRefWorker.update_weights gives the tensorhub engine the training engine (per-rank shards)"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)  # keeps verl's @register dispatch attributes
        async def update_weights(self, global_steps: int = None, mode: str = "auto"):
            from tensorhub_verl.verl import BACKEND_NAME

            backend = mode if mode != "auto" else self.config.rollout.checkpoint_engine.backend
            if backend != BACKEND_NAME:
                return await original(self, global_steps=global_steps, mode=mode)
            metrics = await self.checkpoint_engine.send_weights(self.actor.engine, global_steps=global_steps)
            return metrics or {}

        return update_weights

    return replace_once(module.ActorRolloutRefWorker, "update_weights", wrap)
