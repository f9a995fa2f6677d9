"""verl 0.9.1: each rollout replica knows the load balancer that routes requests to it, so that the updater can take
a replica held by ``tensorhub.max_version_lag`` out of rotation and put it back.

Why: verl routes every new request through one balancer actor (``GlobalRequestLoadBalancer``: sticky sessions, else
the server with the fewest requests in flight), created by ``LLMServerManager._init_global_load_balancer`` and
known only to the server manager and its clients; the replicas and the checkpoint manager never see it. A held
replica's gate parks the requests the balancer still sends it until the next update releases it, and a
separate_async batch that waits for them holds back that update. verl's own way to take a server out of rotation
is the balancer's ``remove_servers`` / ``add_servers`` (its separate_async trainer calls them for hybrid replicas);
this patch only hands the balancer to each replica it routes to (``BALANCER_ATTR``), and the updater calls those
two methods (``tensorhub_verl.verl.engines.ReplicaEngines.hold_admission``). The attribute travels with the replica
objects through Ray (fully_async's trainer gets its replicas from the rollouter).

Guard: the balancer is handed over only when the job's config selects ``checkpoint_engine.backend == 'tensorhub'``.
"""

from __future__ import annotations

from typing import Any

from tensorhub_verl.verl.patches.guards import job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.workers.rollout.llm_server"
BALANCER_ATTR = "th_balancer"
"""The attribute of a verl ``RolloutReplica`` that holds the balancer routing requests to it."""


def describe() -> str:
    return "LLMServerManager hands its load balancer to each replica it routes to (a held replica leaves rotation)"


def balancer_of(replica: Any) -> Any | None:
    """The load balancer actor routing requests to ``replica``; None where this patch did not run (another verl
    version, a replica built outside verl's server manager)."""
    return getattr(replica, BALANCER_ATTR, None)


def apply(module) -> bool:
    def wrap(original):
        async def _init_global_load_balancer(self):
            await original(self)
            if job_uses_tensorhub(self.config):
                # fully_async keeps its hybrid replicas apart until it adds them to the same balancer
                for replica in [*self.rollout_replicas, *getattr(self, "hybrid_replicas", {}).values()]:
                    setattr(replica, BALANCER_ATTR, self.global_load_balancer)

        return _init_global_load_balancer

    return replace_once(module.LLMServerManager, "_init_global_load_balancer", wrap)
