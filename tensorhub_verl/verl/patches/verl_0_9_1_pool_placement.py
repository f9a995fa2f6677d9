"""verl 0.9.1: the trainer's and the replicas' placement groups go where ``tensorhub.trainer_placement`` /
``tensorhub.rollout_placement`` say.

Why: ``single_controller/ray/base.py`` ``RayResourcePool.get_placement_groups`` asks Ray for bundles of
``{CPU, GPU}`` only, so on a multi-node cluster the trainer ranks and the rollout replicas land wherever Ray finds
GPUs; verl has no setting for which node a pool uses. The replacement of the module's ``placement_group`` (the
one call that makes a pool's groups) adds a Ray label selector or a custom resource to each bundle of a trainer
or rollout pool's group (``pool_placement.placed_group_args``).

Guard: only where the job's runtime environment carries a placement (``TENSORHUB_TRAINER_PLACEMENT`` /
``TENSORHUB_ROLLOUT_PLACEMENT``, set from a TensorHub job's config by ``verl_0_9_1_runtime_env_settings``); every
other placement group, and every other job, gets verl's call unchanged.
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.single_controller.ray.base"


def describe() -> str:
    return "verl's resource pools place trainer and rollout bundles by tensorhub.trainer/rollout_placement"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def placement_group(bundles, *args, name: str = "", **kwargs):
            from tensorhub_verl.verl.pool_placement import placed_group_args

            placed, selector = placed_group_args(name, list(bundles))
            if selector is not None:
                kwargs["bundle_label_selector"] = selector
            return original(placed, *args, name=name, **kwargs)

        return placement_group

    return replace_once(module, "placement_group", wrap)
