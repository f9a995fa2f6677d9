"""Versions in the rollout's dtype: the trainer casts as it stages (``tensorhub.rollout_dtype``), whole tensors
and FSDP2 row shards alike, and a reader whose buffers differ only in dtype is told both dtypes and the fix.
A real embedded hub and real ROS transfers; the trainer's weights are plain tensors (verl's per-tensor generator
shape); the FSDP2 case runs two real ranks over gloo."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError, DtypeMismatch
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.digest import DIGEST_KEY
from tensorhub_verl.verl.dtypes import published_dtype, rollout_dtype
from tests.verl.conftest import free_port
from tests.verl.fakes import weights_for

pytestmark = pytest.mark.timeout(240)


def _th(hub_url, **extra):
    return {"hub_address": hub_url, "keep_versions": 2, "chunk_mb": 1, "fetch_timeout_s": 120.0,
            "unpublish_timeout_s": 30.0, **extra}


def _job_key(hub_url):
    """The trainer's job key (``hub_actor.job_credentials``: set once Ray is up in this session): its NIXL
    holders serve only readers of its job."""
    from tensorhub_verl.verl.hub_actor import job_credentials

    return job_credentials(TensorHubVerlConfig(hub_address=hub_url))[1]


def _master(hub_url, job, **extra):
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    return TensorHubCheckpointEngine(bucket_size=1, is_master=True, job=job, node="n0", **_th(hub_url, **extra))


def test_rollout_dtype_names_and_what_is_cast():
    assert rollout_dtype("bfloat16") is rollout_dtype("bf16") is torch.bfloat16
    assert rollout_dtype("half") is torch.float16 and rollout_dtype("fp32") is torch.float32
    assert rollout_dtype(None) is None and rollout_dtype("auto") is None
    assert published_dtype(torch.float32, torch.bfloat16) is torch.bfloat16
    assert published_dtype(torch.int64, torch.bfloat16) is torch.int64  # integer buffers stay as they are
    assert published_dtype(torch.float32, None) is torch.float32
    with pytest.raises(ConfigError, match=r"tensorhub.rollout_dtype must be one of .* got 'fp8'"):
        TensorHubVerlConfig(rollout_dtype="fp8")
    assert TensorHubVerlConfig(rollout_dtype="bf16").published_dtype is torch.bfloat16


@pytest.mark.parametrize("staging", ["cpu", "none"])
def test_fp32_master_publishes_bf16_and_moves_half_the_bytes(hub, staging):
    master = {n: t.float() for n, t in weights_for(1, dtype=torch.float32).items()}
    master["step"] = torch.tensor([7], dtype=torch.int64)
    engine = _master(hub.url, f"cast-{staging}", staging=staging, rollout_dtype="bfloat16", verify_digests=True)
    reader = th.connect(hub.url, worker=f"rollout-{staging}", location={"node": "n1"}, job_key=_job_key(hub.url))
    try:
        metrics = asyncio.run(engine.send_weights(iter(master.items()), global_steps=1))
        manifest = reader.manifest("policy", 1)
        assert {t.name: t.dtype for t in manifest.tensors} == {**{n: "bfloat16" for n in master if n != "step"},
                                                               "step": "int64"}
        fp32_bytes = sum(t.numel() * t.element_size() for t in master.values())
        assert metrics["tensorhub/publish_bytes"] == manifest.nbytes < 0.51 * fp32_bytes
        into = manifest.allocate()
        reader.fetch("policy", 1, into=into, hold=False)
        expected = {n: t.to(published_dtype(t.dtype, torch.bfloat16), copy=True) for n, t in master.items()}
        assert all(torch.equal(into[n], expected[n]) for n in master)
        # verify_digests compares what the rollouts serve: the cast tensors.
        assert metrics[DIGEST_KEY] == tensor_digests(expected)
        # The cast bytes are a copy: the next optimizer step on the master weights changes nothing published.
        for t in master.values():
            if t.is_floating_point():
                t.add_(1)
        reader.fetch("policy", 1, into=into, hold=False)
        assert all(torch.equal(into[n], expected[n]) for n in master)
        # The next version publishes the same way (the ring holds both).
        fresh = {n: t.clone() for n, t in master.items()}  # as FSDP's gathers yield (staging 'none' holds ints)
        asyncio.run(engine.send_weights(iter(fresh.items()), global_steps=2))
        assert engine.held_versions() == [1, 2]
    finally:
        reader.close()
        engine.close()


def test_a_reader_of_another_dtype_is_told_both_dtypes_and_the_setting(hub):
    engine = _master(hub.url, "nocast", staging="cpu")  # no rollout_dtype: published as the parameters are
    reader = th.connect(hub.url, worker="rollout-fp16", location={"node": "n1"}, job_key=_job_key(hub.url))
    try:
        asyncio.run(engine.send_weights(iter(weights_for(1, dtype=torch.bfloat16).items()), global_steps=1))
        manifest = reader.manifest("policy", 1)
        into = {t.name: torch.zeros(t.shape, dtype=torch.float16) for t in manifest.tensors}
        with pytest.raises(DtypeMismatch, match=r"buffer is float16, version 1 of 'policy' \(hf\) was published in "
                                                r"bfloat16; only the dtype differs, nothing was read.*"
                                                r"actor_rollout_ref.rollout.dtype=float16") as info:
            reader.fetch("policy", 1, into=into, hold=False)
        assert (info.value.buffer_dtype, info.value.published_dtype) == ("float16", "bfloat16")
        assert all(not t.any() for t in into.values())  # nothing moved
        first = manifest.tensors[0]  # ranged reads (a TP rank's slices) check the same
        with pytest.raises(DtypeMismatch, match="only the dtype differs"):
            reader.fetch_slices("policy", 1, into={first.name: torch.zeros((2, *first.shape[1:]),
                                                                           dtype=torch.float16)},
                                slices={first.name: (0, 0, 2)})
        # A shape difference is still reported as what it is, not as a dtype problem.
        with pytest.raises(Exception, match="buffer is \\[1\\]") as other:
            reader.fetch("policy", 1, into={**manifest.allocate(), first.name: torch.zeros(1)}, hold=False)
        assert not isinstance(other.value, DtypeMismatch)
    finally:
        reader.close()
        engine.close()


# ------------------------------------------------------------------------------------------- FSDP2 shards
class _Engine:
    """What ``local_shards`` reads of verl's FSDP engine: its ``module``."""

    def __init__(self, module):
        self.module = module

    def get_per_tensor_param(self):  # pragma: no cover - local_shards applies, the fallback is never taken
        raise AssertionError("shards expected")


def _tiny_model(dtype, tied: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).to(dtype)


def _rank_main(rank: int, world: int, port: int, hub_url: str, out: dict, tied: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.fsdp import fully_shard

        from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

        model = _tiny_model(torch.bfloat16, tied)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        engine = TensorHubCheckpointEngine(bucket_size=1, is_master=rank == 0, job="fsdp", node="n0",
                                           **_th(hub_url, rollout_dtype="float32", verify_digests=True))
        metrics = asyncio.run(engine.send_weights(_Engine(model), global_steps=1))
        out[rank] = {k: v for k, v in metrics.items() if k != DIGEST_KEY} | {"digests": metrics.get(DIGEST_KEY)}
        dist.barrier()
        out[f"done{rank}"] = True
        while "read" not in out:  # hold the version until the test read it
            time.sleep(0.05)
        engine.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_fsdp2_row_shards_are_published_in_the_rollout_dtype(hub, tied):
    """bf16 trainer, fp32 rollout (the direction vLLM's CPU build can serve): every rank casts its rows. With tied
    embeddings FSDP2 keeps the head and the embedding one parameter, so every rank's head rows are its embedding
    rows (the same memory): every rank leaves the head out and the version's row shards agree on it."""
    world = 2
    full = {n: t.float() for n, t in _tiny_model(torch.bfloat16, tied).state_dict().items()
            if not (tied and n == "lm_head.weight")}
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.start_processes(_rank_main, args=(world, free_port(), hub.url, out, tied), nprocs=world,
                                 join=False, start_method="spawn")
        reader = th.connect(hub.url, worker="rollout-fsdp", location={"node": "n1"})
        try:
            deadline = time.monotonic() + 150
            while not all(f"done{r}" in out for r in range(world)):
                assert time.monotonic() < deadline, "the ranks did not publish"
                assert all(p.is_alive() or p.exitcode == 0 for p in ctx.processes)
                time.sleep(0.1)
            manifest = reader.manifest("policy", 1)
            assert manifest.row_shards == world
            assert {t.dtype for t in manifest.tensors} == {"float32"}
            assert [t.name for t in manifest.tensors] == list(full)
            into = manifest.allocate()
            stats = reader.fetch("policy", 1, into=into, hold=False)
            assert all(torch.equal(into[n], full[n]) for n in full)  # bf16 -> fp32 is exact
            assert sorted(stats.sources) == ["fsdp-actor-0", "fsdp-actor-1"]
            assert out[0]["digests"] == tensor_digests(full)  # rank 0 digests the gathered tensors, cast
            assert out[0]["tensorhub/publish_bytes"] + out[1]["tensorhub/publish_bytes"] == manifest.nbytes
        finally:
            out["read"] = True
            reader.close()
            ctx.join(60)
