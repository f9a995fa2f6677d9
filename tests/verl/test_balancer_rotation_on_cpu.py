"""A replica held by ``tensorhub.max_version_lag`` leaves verl's load balancer: while it is held verl routes no new
request to it and every request completes on the others; once released it is routed to again.

verl 0.9.1's real parts: the server manager's ``_init_global_load_balancer`` (patched:
``verl_0_9_1_balancer_rotation``) creating the real ``GlobalRequestLoadBalancer`` actor, and fully_async's real
client (``FullyAsyncLLMServerClient``) routing through it. The servers are verl's real submission gate, patched,
without an engine (``fakes.GateServer``); the real loop runs in test_verl_trainer_on_cpu (slow)."""

from __future__ import annotations

import asyncio

import pytest
import ray

from tests.requires import require

require("verl")

pytestmark = pytest.mark.timeout(120)


def _job_config():
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "name": "vllm", "response_length": 9, "full_determinism": False, "router_config_path": None,
        "checkpoint_engine": {"backend": "tensorhub", "engine_kwargs": {"tensorhub": {}}}}},
        "async_training": {"partial_rollout": True}})


class _Replica:
    """What verl's ``RolloutReplica`` gives the server manager and the updater: its rank, servers and address."""

    def __init__(self, rank: int, server):
        self.replica_rank, self.servers = rank, [server]
        self._server_handle, self._server_address = server, f"127.0.0.1:{9000 + rank}"


async def _manager(config, replicas):
    import tensorhub_verl.verl.checkpoint_engine  # noqa: F401  registers the patches
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = object.__new__(LLMServerManager)  # what LLMServerManager.create sets before the balancer
    manager.config, manager.rollout_config, manager._load_balancer_cls = config, config.actor_rollout_ref.rollout, None
    manager.rollout_replicas = replicas
    manager.server_handles = [r._server_handle for r in replicas]
    manager.server_addresses = [r._server_address for r in replicas]
    await manager._init_global_load_balancer()
    return manager


def test_a_held_replica_gets_no_new_request_and_the_others_serve_them_all(ray_local):
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    from tensorhub_verl.verl.config import TensorHubVerlConfig
    from tensorhub_verl.verl.updater import TensorHubUpdater
    from tests.verl.fakes import GateServer

    config = _job_config()
    replicas = [_Replica(r, GateServer.remote(r, config)) for r in (0, 1)]
    ray.get([r.servers[0].requests.remote() for r in replicas], timeout=120)  # started (each imports verl)
    updater = TensorHubUpdater(config=TensorHubVerlConfig.from_mapping({"max_version_lag": 1, "apply_timeout_s": 60}),
                               actor_wg=None, replicas=lambda: replicas)

    async def burst(client, tag: str, n: int = 8):
        outs = await asyncio.wait_for(asyncio.gather(*(
            client.generate(f"{tag}-{i}", prompt_ids=[5, 6], sampling_params={}) for i in range(n))), 30)
        return [o.stop_reason for o in outs]

    def arrived():
        return [ray.get(r.servers[0].requests.remote()) for r in replicas]

    async def scenario():
        manager = await _manager(config, replicas)
        client = manager.get_client(client_cls=FullyAsyncLLMServerClient)
        updater.served = {0: 5, 1: 2}  # replica 1 is 3 versions behind v5: held
        held = await updater._bound_staleness(replicas, 5)
        assert held["tensorhub/replicas_held"] == 1.0
        assert await burst(client, "held") == ["completed"] * 8  # every request served, by replica 0 alone
        assert arrived() == [8, 0]
        updater.served = {0: 5, 1: 5}  # it applied v5: released, and routed to again
        released = await updater._bound_staleness(replicas, 5)
        assert released["tensorhub/replicas_held"] == 0.0
        assert await burst(client, "released") == ["completed"] * 8
        assert arrived()[1] > 0, arrived()

    asyncio.run(scenario())
