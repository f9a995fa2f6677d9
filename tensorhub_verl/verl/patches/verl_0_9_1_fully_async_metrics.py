"""verl 0.9.1: the fully async trainer logs TensorHub's per-update metrics.

Why: ``FullyAsyncTrainer._fit_update_weights`` awaits ``checkpoint_manager.update_weights`` and drops what it
returns, so ``tensorhub/*`` (stall, pull time, bytes, peer share, version lag) never reach the job's logger in
fully_async runs, while separate_async logs them. After each sync the updater's metrics are logged at the
same step as verl's own ``timing_s/param_sync``. Other backends are untouched.
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.experimental.fully_async_policy.fully_async_trainer"


def describe() -> str:
    return "FullyAsyncTrainer logs the tensorhub/* metrics of each weight sync"


def _classes(actor_class) -> list[type]:
    """The user class and Ray's modified copy of it: ``ray.remote`` copies each method into the class it
    ships to the actor process when the module executes, before a post-import patch can run."""
    classes = [getattr(actor_class, "__ray_actor_class__", actor_class)]
    metadata = getattr(actor_class, "__ray_metadata__", None)
    if metadata is not None and getattr(metadata, "modified_class", None) is not None:
        classes.append(metadata.modified_class)
    return classes


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        async def _fit_update_weights(self, *args, **kwargs):
            result = await original(self, *args, **kwargs)
            updater = getattr(getattr(self, "checkpoint_manager", None), "_tensorhub_updater", None)
            if result is not None and updater is not None and updater.last_metrics:
                self.logger.log(data=dict(updater.last_metrics), step=self.current_param_version)
            return result

        return _fit_update_weights

    return replace_once(_classes(module.FullyAsyncTrainer), "_fit_update_weights", wrap)
