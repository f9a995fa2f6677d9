"""How the updater reaches one replica's engine ranks: verl's vLLM server actors, one per node of a replica.

Each server's ``collective_rpc`` (returning results, see ``patches/verl_0_9_1_engine_holders``) runs a
``th_*`` method of ``TensorHubWorkerExtension`` on every engine rank of its node. Identity is passed in:
``setup`` gives node ``i`` of replica ``r`` the worker id of rollout rank ``i`` of replica ``r`` and the
location labels of the Ray node its server runs on (``node_location``; the config's for labels the node does not
give), with ``node`` defaulting to the server's address.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.identity import ROLLOUT_ROLE, make_identity
from tensorhub_verl.verl.node_location import actor_node, worker_location
from tensorhub_verl.vllm.engine_updater import EngineUpdater

STATUS_POLL_S = 0.05
"""How often the updater asks the engines whether their pull finished. A status call is one cheap RPC that
vLLM runs between engine steps; a blocking wait inside the engine would stop its generation."""


class ReplicaEngines:
    """The engine ranks of one verl rollout replica, through its server actors."""

    def __init__(self, replica: Any) -> None:
        self.replica_rank: int = replica.replica_rank
        self.servers = list(replica.servers)
        if not self.servers:
            raise TransferFailed(f"replica {self.replica_rank} has no running servers yet")
        self._replica = replica

    @property
    def key(self) -> tuple:
        """Identifies these server processes: a replica restarted under the same rank needs a new setup."""
        return (self.replica_rank, *(str(getattr(s, "_actor_id", id(s))) for s in self.servers))

    def rpc(self, method: str, kwargs: dict, timeout: float) -> list:
        """``method(**kwargs)`` on every engine rank of the replica (blocking; results in server, then rank
        order): the ``Rpc`` that ``EngineUpdater`` drives, run in a thread by the async updater."""
        import ray

        refs = [s.collective_rpc.remote(method, timeout=timeout, kwargs=kwargs) for s in self.servers]
        return [r for results in ray.get(refs, timeout=timeout) for r in (results or [])]

    def updater(self, rpc_timeout_s: float) -> EngineUpdater:
        """The one sequence that moves all ranks of an engine to a version together (pull, poll, apply or
        abort everywhere), here across every node of the replica."""
        return EngineUpdater(self.rpc, rpc_timeout_s=rpc_timeout_s, poll_s=STATUS_POLL_S)

    async def setup(self, config: TensorHubVerlConfig, hub_url: str, job: str) -> list[dict]:
        """Connects every rank to the hub as a holder of its own parameters (idempotent in the engines)."""
        addresses = await asyncio.wait_for(asyncio.gather(
            *(s.get_server_address.remote() for s in self.servers)), config.apply_timeout_s)
        from tensorhub_verl.verl.hub_actor import job_credentials

        # Through Ray to the engines' processes (never a command line): the hub token and the job's key.
        token, job_key = await asyncio.to_thread(job_credentials, config)
        nodes = await asyncio.wait_for(asyncio.gather(*(actor_node(s) for s in self.servers)),
                                       config.apply_timeout_s)
        results = []
        for index, (server, (address, _port), (labels, _ip)) in enumerate(zip(self.servers, addresses, nodes)):
            identity = make_identity(role=ROLLOUT_ROLE, rank=index, replica=self.replica_rank, job=job,
                                     location=worker_location(config.location, labels, address))
            results += await asyncio.wait_for(server.collective_rpc.remote(
                "th_setup", timeout=config.apply_timeout_s,
                kwargs={"hub_url": hub_url, "model": config.model, "worker": identity.worker,
                        "location": identity.location, "token": token, "staging": config.rollout_staging,
                        "client_config": {**config.client_settings(), "job_key": job_key},
                        "fetch_timeout_s": config.fetch_timeout_s,
                        # A hub of regions serves no deltas: its engines read full versions.
                        "delta": "off" if config.uses_regions() else config.delta}), config.apply_timeout_s)
        return results

    async def flip_report(self, serving: int | None, pull: int | None, outcome: str | None,
                          min_replica_fraction: float, timeout: float) -> dict:
        """Reports the replica for the fleet flip from its first node (the replica's name at the hub is that node's
        worker id); its engine rank 0 sends it (``th_flip_report``) and its answer is returned."""
        answers = await asyncio.wait_for(self.servers[0].collective_rpc.remote(
            "th_flip_report", timeout=timeout, kwargs={"serving": serving, "pull": pull, "outcome": outcome,
                                                       "min_replica_fraction": min_replica_fraction}), timeout)
        answer = next((a for a in answers if a), None)
        if answer is None:
            raise TransferFailed(f"replica {self.replica_rank}: no engine rank answered the flip report")
        return answer

    async def hold_admission(self, hold: bool, timeout: float) -> int:
        """Holds (or releases) new requests: a held replica leaves verl's load balancer, so that no new request is
        routed to it, and its servers' gates close (``th_hold_admission``) for any request already on its way;
        requests in flight go on. A release opens the gates, then puts the replica back into rotation. Returns the
        requests that met a held gate since the previous call."""
        if hold:
            await self._rotation(False, timeout)
        answers = await asyncio.wait_for(asyncio.gather(
            *(s.th_hold_admission.remote(hold) for s in self.servers)), timeout)
        if not hold:
            await self._rotation(True, timeout)
        return sum(int(a.get("held_back", 0)) for a in answers)

    async def _rotation(self, serving: bool, timeout: float) -> None:
        """Adds the replica to (or removes it from) the load balancer that routes verl's requests to it, through
        the balancer's own ``add_servers`` / ``remove_servers`` (``patches/verl_0_9_1_balancer_rotation``)."""
        from tensorhub_verl.verl.patches.verl_0_9_1_balancer_rotation import balancer_of

        balancer = balancer_of(self._replica)
        if balancer is None:
            return
        address = self._replica._server_address
        call = balancer.add_servers.remote({address: self._replica._server_handle}) if serving \
            else balancer.remove_servers.remote([address])
        await asyncio.wait_for(call, timeout)

    async def after_apply(self, version: int, timeout: float) -> None:
        """What verl's server adapter does after a weight update: drop KV computed with the old weights and
        tag the server with the step."""
        await asyncio.wait_for(asyncio.gather(*(s.clear_kv_cache.remote() for s in self.servers)), timeout)
        await asyncio.wait_for(asyncio.gather(*(s.set_global_steps.remote(version) for s in self.servers)), timeout)


__all__ = ["ReplicaEngines"]
