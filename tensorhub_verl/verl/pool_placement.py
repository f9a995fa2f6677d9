"""Where verl puts the trainer ranks and the rollout replicas: ``tensorhub.trainer_placement`` /
``tensorhub.rollout_placement`` on the placement groups of verl's resource pools.

verl 0.9.1 asks Ray for one placement group per resource pool, bundles of ``{CPU, GPU}`` only, so on a cluster
the trainer and the replicas land wherever Ray finds GPUs. A TensorHub job names where each goes, in the
forms of ``hub_placement``: ``label:KEY=VALUE`` (every bundle gets a Ray label selector: nodes started with
``ray start --labels KEY=VALUE``) or ``resource:NAME`` (every bundle asks for a sliver of the custom resource
NAME: nodes started with ``ray start --resources '{"NAME": 1}'``).

``tensorhub.helper_placement`` does the same for verl's helper actors: its task runner (``helper_actor_options``,
applied by ``patches/verl_0_9_1_task_runner_placement``) and the agent-loop and reward-loop workers, which verl
spreads round-robin over every node with a soft affinity (``helper_nodes`` narrows the nodes it spreads them over:
``patches/verl_0_9_1_helper_loop_placement``).

The settings travel as ``TENSORHUB_TRAINER_PLACEMENT`` / ``TENSORHUB_ROLLOUT_PLACEMENT`` in the job's runtime
environment (``placement_env``, added by ``patches/verl_0_9_1_runtime_env_settings`` from the job's config), so
that every process that creates a pool (verl's task runner, fully_async's rollouter) sees them;
``patches/verl_0_9_1_pool_placement`` applies them to each placement group by the pool its name starts with.
The placement patches are registered only in processes whose environment carries one of these variables
(``patches.placement_asked``): a job that places nothing runs verl's placement code untouched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tensorhub_verl.verl.config import pool_placement

ENV = {"trainer": "TENSORHUB_TRAINER_PLACEMENT", "rollout": "TENSORHUB_ROLLOUT_PLACEMENT",
       "helper": "TENSORHUB_HELPER_PLACEMENT"}
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


def helper_actor_options(text: str | None) -> dict:
    """Ray actor options for a helper placement ``text`` (``tensorhub.helper_placement``): a label selector, a
    sliver of a custom resource, or nothing ('any', None)."""
    if not text:
        return {}
    kind, key, value = pool_placement(text, ENV["helper"])
    if kind == "label":
        return {"label_selector": {key: value}}
    if kind == "resource":
        return {"resources": {key: RESOURCE_SLIVER}}
    return {}


def helper_nodes(nodes: list[dict], environ: Mapping[str, str] | None = None) -> list[dict]:
    """Of Ray's node table (``ray.nodes()``), the nodes the helper placement of this process's environment allows
    (all of them without one; all of them too when none does, so that verl still finds a node and Ray's
    scheduler, not an empty list, reports the problem)."""
    text = (os.environ if environ is None else environ).get(ENV["helper"])
    if not text:
        return nodes
    kind, key, value = pool_placement(text, ENV["helper"])
    if kind == "label":
        placed = [n for n in nodes if (n.get("Labels") or {}).get(key) == value]
    elif kind == "resource":
        placed = [n for n in nodes if (n.get("Resources") or {}).get(key, 0) > 0]
    else:
        placed = nodes
    return placed or nodes


class PlacedNodes:
    """Stands for the ``ray`` module in a verl module that spreads helpers over ``ray.nodes()``: the same module,
    with ``nodes()`` narrowed by ``helper_nodes``."""

    def __init__(self, ray_module: Any) -> None:
        self._ray = ray_module

    def nodes(self) -> list[dict]:
        return helper_nodes(self._ray.nodes())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)


__all__ = ["ENV", "RESOURCE_SLIVER", "PlacedNodes", "helper_actor_options", "helper_nodes", "placed_group_args",
           "placement_env", "pool_role"]
