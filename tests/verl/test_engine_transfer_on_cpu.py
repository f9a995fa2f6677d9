"""The trainer side of the ``tensorhub`` checkpoint engine (``send_weights``), and its refusal of verl's
copy-based rollout path. Verl's training engine is replaced by a deterministic per-tensor generator (the
shape of ``engine.get_per_tensor_param()``); the real FSDP trainer runs in ``test_verl_trainer_on_cpu``.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.verl.fakes import weights_for

pytestmark = pytest.mark.timeout(240)


def _th(hub_url, **extra):
    return {"hub_address": hub_url, "keep_versions": 2, "chunk_mb": 1, "fetch_timeout_s": 180.0,
            "unpublish_timeout_s": 30.0, **extra}


def test_non_master_ranks_drive_the_generator_but_publish_nothing():
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    engine = TensorHubCheckpointEngine(bucket_size=1, is_master=False, job="t", node="n0",
                                       hub_address="http://127.0.0.1:9")  # never contacted
    consumed = []

    def gen():
        for name, t in weights_for(1).items():
            consumed.append(name)  # an FSDP gather: every rank must reach it
            yield name, t

    assert asyncio.run(engine.send_weights(gen(), global_steps=1)) == {}
    assert consumed == list(weights_for(1)) and engine.held_versions() == []


def test_staging_none_refuses_live_parameters(hub):
    from tensorhub_verl.errors import ConfigError
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    engine = TensorHubCheckpointEngine(bucket_size=1, is_master=True, job="alias", node="n0", **_th(hub.url,
                                                                                                  staging="none"))
    live = {"w": torch.ones(64, 64)}
    asyncio.run(engine.send_weights(iter(live.items()), global_steps=1))
    live["w"].add_(1.0)  # the optimizer step, in place
    with pytest.raises(ConfigError, match="shares memory with 'w' of held version 1"):
        asyncio.run(engine.send_weights(iter(live.items()), global_steps=2))
    param = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(ConfigError, match="live nn.Parameter"):
        asyncio.run(engine.send_weights(iter([("p", param)]), global_steps=3))
    assert engine.held_versions() == [1]  # the refused versions left nothing behind
    engine.close()


def test_rollout_workers_hold_no_copy_and_refuse_verls_receive_path():
    from tensorhub_verl.errors import ConfigError
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    engine = TensorHubCheckpointEngine(bucket_size=1, job="r", node="n0", hub_address="http://127.0.0.1:9")

    async def drain():
        return [item async for item in engine.receive_weights(global_steps=1)]

    with pytest.raises(ConfigError, match="updates rollout engines in place"):
        asyncio.run(drain())
    assert engine.held_versions() == []


def test_the_trainer_publishes_to_every_region_of_a_hub_of_regions():
    """``tensorhub.hub_address`` as a REGION=URL list: the trainer rank connects through ``connect`` to a
    ``RegionalClient`` and publishes every version to every region; a reader of either region reads it."""
    import tensorhub_verl as th
    from tensorhub_verl.ros.client.regional_client import RegionalClient
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    hubs = [th.start_hub(plane="tcp"), th.start_hub(plane="tcp")]
    spec = f"dc0/r0={hubs[0].url},dc0/r1={hubs[1].url}"
    engine = TensorHubCheckpointEngine(bucket_size=1, is_master=True, job="regions", node="t0",
                                       **_th(spec, relay_fanout=1, transport="tcp"))
    reader = None
    try:
        asyncio.run(engine.send_weights(iter(weights_for(1).items()), global_steps=1))
        assert isinstance(engine._client, RegionalClient) and sorted(engine._client._clients) == ["dc0/r0", "dc0/r1"]
        reader = th.connect(spec, "rollout-0", location={"dc": "dc0", "rack": "r0", "node": "n1"}, chunk_bytes=1 << 20,
                            transport="tcp", relay_fanout=1)
        stats = reader.fetch("policy", "latest")
        assert all(torch.equal(stats.buffers[name], t) for name, t in weights_for(1).items())
        assert reader.home.hub_url == hubs[0].url and set(engine._client._clients["dc0/r1"].versions("policy")) == {1}
    finally:
        if reader is not None:
            reader.close()
        engine.close()
        for hub in hubs:
            hub.stop()
