"""send_weights / receive_weights of the ``tensorhub`` backend across real processes, real ROS transfers.

The trainer and the rollouts are separate Ray worker processes; the hub runs in the test process.
Bytes are compared by SHA-256 of every tensor. Verl's training engine is replaced by a deterministic
per-tensor generator (the shape of ``engine.get_per_tensor_param()``), since FSDP training needs GPUs.
"""

from __future__ import annotations

import asyncio

import pytest
import ray
import torch

from tests.verl.fakes import RolloutStub, TrainerStub, digest, weights_for

pytestmark = pytest.mark.timeout(240)


def _th(hub_url, **extra):
    return {"hub_address": hub_url, "keep_versions": 2, "chunk_mb": 1, "fetch_timeout_s": 180.0,
            "unpublish_timeout_s": 30.0, **extra}


@pytest.mark.parametrize("staging", ["cpu", "none"])
def test_versions_arrive_byte_exact_and_spread_from_peers(ray_local, hub, staging):
    cfg = _th(hub.url, staging=staging)
    trainer = TrainerStub.remote(cfg, job=f"x{staging}")
    a, b = RolloutStub.remote(cfg, job=f"x{staging}"), RolloutStub.remote(cfg, job=f"x{staging}")
    nbytes = sum(t.numel() * t.element_size() for t in weights_for(1).values())

    metrics = ray.get(trainer.update_weights.remote(global_steps=1))
    assert metrics["tensorhub/publish_bytes"] == nbytes
    # verl's default manager path: receive_weights pulls inline, then yields the held buffers.
    assert ray.get(a.receive_digest.remote(1)) == digest(weights_for(1).items())

    for v in (2, 3):
        ray.get(trainer.update_weights.remote(global_steps=v))
        result = ray.get(a.pull.remote(v, replica=0, rank=0))
        assert result.bytes == nbytes and set(result.sources) == {f"x{staging}-actor-0"}
        assert ray.get(a.receive_digest.remote(v)) == digest(weights_for(v).items())
    assert ray.get(trainer.held_versions.remote()) == [2, 3]  # keep_versions=2: v1 was unpublished
    assert ray.get(a.held_versions.remote()) == [2, 3]

    # The trainer leaves: v3 is now only on rollout A, and B gets every byte from it.
    ray.get(trainer.close.remote())
    result = ray.get(b.pull.remote(3, replica=1, rank=0))
    assert result.bytes == nbytes
    assert set(result.sources) == {f"x{staging}-rollout-0-0"}, result.sources
    assert ray.get(b.receive_digest.remote(3)) == digest(weights_for(3).items())
    for actor in (a, b):
        ray.get(actor.close.remote())


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
