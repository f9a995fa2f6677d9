"""verl 0.9.1: the agent-loop and reward-loop workers spread over the nodes ``tensorhub.helper_placement`` allows.

Why: ``experimental/agent_loop/agent_loop.py`` and ``experimental/reward_loop/reward_loop.py`` spread their workers
round-robin over every alive node of ``ray.nodes()`` (a soft affinity each), so on a cluster they land on rollout
and trainer hosts alike. The replacement of each module's ``ray`` (``pool_placement.PlacedNodes``: the same
module, ``nodes()`` narrowed) makes them spread the workers over the placed nodes only.

Guard: only where the job's runtime environment carries ``TENSORHUB_HELPER_PLACEMENT`` (a TensorHub job's
``helper_placement``, set by ``verl_0_9_1_runtime_env_settings``); elsewhere ``nodes()`` is Ray's.
"""

from __future__ import annotations

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGETS = ("verl.experimental.agent_loop.agent_loop", "verl.experimental.reward_loop.reward_loop")


def describe() -> str:
    return "the agent-loop and reward-loop workers spread over the nodes tensorhub.helper_placement allows"


def apply(module) -> bool:
    from tensorhub_verl.verl.pool_placement import PlacedNodes

    return replace_once(module, "ray", PlacedNodes)
