"""Where verl puts the trainer ranks and the rollout replicas: ``tensorhub.trainer_placement`` /
``tensorhub.rollout_placement`` on the placement groups of verl's resource pools.

verl 0.9.1 asks Ray for one placement group per resource pool, bundles of ``{CPU, GPU}`` only, so on a cluster
the trainer and the replicas land wherever Ray finds GPUs. A TensorHub job names where each goes, in the
forms of ``hub_placement``: ``label:KEY=VALUE`` (every bundle gets a Ray label selector: nodes started with
``ray start --labels KEY=VALUE``) or ``resource:NAME`` (every bundle asks for a sliver of the custom resource
NAME: nodes started with ``ray start --resources '{"NAME": 1}'``).

The settings travel as ``TENSORHUB_TRAINER_PLACEMENT`` / ``TENSORHUB_ROLLOUT_PLACEMENT`` in the job's runtime
environment (``placement_env``, added by ``patches/verl_0_9_1_runtime_env_settings`` from the job's config), so
that every process that creates a pool (verl's task runner, fully_async's rollouter) sees them;
``patches/verl_0_9_1_pool_placement`` applies them to each placement group by the pool its name starts with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tensorhub_verl.verl.config import pool_placement

ENV = {"trainer": "TENSORHUB_TRAINER_PLACEMENT", "rollout": "TENSORHUB_ROLLOUT_PLACEMENT"}
"""The runtime-environment variable that carries each role's placement."""
TRAINER_POOLS = ("global_pool", "trainer_pool")
"""verl's pools of trainer ranks: v1 ``separate_async`` (``global_pool``), fully_async (``trainer_pool``)."""
ROLLOUT_POOL = "rollout_pool_"
"""A standalone replica's pool: ``rollout_pool_<rank>`` (reward and teacher replicas: ``rollout_pool_reward_``,
``rollout_pool_teacher_``, left where Ray puts them)."""
RESOURCE_SLIVER = 1e-4
"""What each bundle asks of a placement's custom resource: enough to require the node, too little to count."""


def pool_role(group_name: str | None) -> str | None:
    """'trainer', 'rollout' or None for a placement group named by verl (``<pool name>verl_group_...:<i>``)."""
    name = group_name or ""
    if name.startswith(TRAINER_POOLS):
        return "trainer"
    if name.startswith(ROLLOUT_POOL) and not name.startswith((ROLLOUT_POOL + "reward_", ROLLOUT_POOL + "teacher_")):
        return "rollout"
    return None


def placement_env(tensorhub: Mapping[str, Any] | None) -> dict[str, str]:
    """The variables for the job's runtime environment from its ``tensorhub`` config (placements not 'any')."""
    env = {}
    for role, name in ENV.items():
        value = (tensorhub or {}).get(f"{role}_placement") or "any"
        pool_placement(value, f"tensorhub.{role}_placement")
        if value != "any":
            env[name] = str(value)
    return env


def placed_group_args(group_name: str | None, bundles: list[dict],
                      environ: Mapping[str, str] | None = None) -> tuple[list[dict], list[dict] | None]:
    """``bundles`` and the ``bundle_label_selector`` for verl's placement group ``group_name`` under this
    process's placement settings (unchanged bundles and None where none applies)."""
    role = pool_role(group_name)
    text = (os.environ if environ is None else environ).get(ENV[role]) if role else None
    if not text:
        return bundles, None
    kind, key, value = pool_placement(text, ENV[role])
    if kind == "label":
        return bundles, [{key: value} for _ in bundles]
    if kind == "resource":
        return [{**bundle, key: RESOURCE_SLIVER} for bundle in bundles], None
    return bundles, None


__all__ = ["ENV", "RESOURCE_SLIVER", "placed_group_args", "placement_env", "pool_role"]
