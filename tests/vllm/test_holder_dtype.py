"""EngineHolder with versions in the rollout's dtype, against a real hub and real ROS clients, no vLLM
(parameters are plain tensors in the vLLM layout, as in test_holder.py): the trainer's staging casts its master
weights to the engine's dtype; a version in another dtype is refused before anything moves, and the engine keeps
serving what it served. Also what unpublishing the old version costs inside the stall (``preserved_bytes``)."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.wire.manifest import row_range
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.verl.publisher import Publisher
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.layout import DecoderShape, hf_views, layout_name, vllm_param_shapes

pytestmark = pytest.mark.vllm

SHAPE = DecoderShape(arch="qwen2", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                     num_kv_heads=1, head_dim=32, vocab_size=100, tie_word_embeddings=True, qkv_bias=True)
LAYOUT = layout_name("qwen2", 1, 0)
LOC = {"dc": "dc0", "rack": "r0"}


def master(v: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trainer's weights of version ``v`` in its own (master) dtype."""
    from tests.vllm.test_layout import _random_hf

    return {n: t.to(dtype) for n, t in _random_hf(SHAPE, seed=v).items()}


def serves(params, v: int, master_dtype: torch.dtype, engine_dtype: torch.dtype) -> bool:
    """The parameters hold version ``v`` exactly as the trainer's cast made it."""
    ref = hf_to_vllm({n: t.to(engine_dtype) for n, t in master(v, master_dtype).items()}, SHAPE)
    return all(params[n].dtype == engine_dtype and torch.equal(params[n], ref[n]) for n in ref)


def make_holder(hub, worker, dtype, staging="none", model="policy"):
    client = th.connect(hub.url, worker=worker, location={**LOC, "node": worker})
    params = {n: torch.zeros(s, dtype=dtype) for n, s in vllm_param_shapes(SHAPE).items()}

    def load(weights):  # vLLM's loaders copy_ into the parameters: the cast happens there
        for name, t in hf_to_vllm(dict(weights), SHAPE).items():
            params[name].copy_(t)

    h = EngineHolder(client, HolderConfig(model=model, layout=LAYOUT, staging=staging, fetch_timeout_s=30),
                     params, load, hf_views=hf_views(params, SHAPE))
    return h, params, client


def trainer_publisher(client, model, dtype, keep=2):
    return Publisher(client, model=model, keep=keep, staging="cpu", chunk_bytes=1 << 20, unpublish_timeout_s=30,
                     dtype=dtype)


def publish(publisher, version, tensors):
    publisher.begin(version)
    for name, t in tensors.items():
        publisher.add(name, t)
    return publisher.finish()


@pytest.mark.parametrize("staging", ["none", "cpu"])
@pytest.mark.parametrize("master_dtype,engine_dtype", [(torch.float32, torch.bfloat16),
                                                       (torch.bfloat16, torch.float16)])
def test_the_trainer_publishes_in_the_engines_dtype(hub, master_dtype, engine_dtype, staging):
    model = f"cast-{str(master_dtype)[6:]}-{str(engine_dtype)[6:]}-{staging}"
    trainer = th.connect(hub.url, worker=f"trainer-{model}", location={**LOC, "node": "t"})
    publisher = trainer_publisher(trainer, model, engine_dtype)
    h, params, client = make_holder(hub, f"eng-{model}", engine_dtype, staging=staging, model=model)
    try:
        for v in (1, 2):
            stats = publish(publisher, v, master(v, master_dtype))
            assert stats.bytes == trainer.manifest(model, v).nbytes
            assert {t.dtype for t in trainer.manifest(model, v).tensors} == {str(engine_dtype)[6:]}
            res = h.update(v)
            assert res.version == v and res.source_layout == "hf" and serves(params, v, master_dtype,
                                                                                   engine_dtype)
            assert res.bytes == stats.bytes  # the engine read the version once, in its own dtype
        if master_dtype == torch.float32:
            assert stats.bytes == sum(t.numel() for t in master(2, master_dtype).values()) * 2  # half of fp32
    finally:
        h.close()
        client.close()
        publisher.close()
        trainer.close()


def test_a_version_in_another_dtype_is_refused_before_anything_moves(hub):
    model = "refused"
    trainer = th.connect(hub.url, worker="trainer-refused", location={**LOC, "node": "t"})
    cast = trainer_publisher(trainer, model, torch.bfloat16)
    fresh, fresh_params, fresh_client = make_holder(hub, "eng-fresh", torch.bfloat16, model=model)
    h, params, client = make_holder(hub, "eng-refuses", torch.bfloat16, model=model)
    try:
        publish(cast, 1, master(1, torch.float32))
        h.update(1)
        trainer.publish(model, 2, master(2, torch.float32))  # a publisher that did not cast
        before = {n: t.clone() for n, t in params.items()}
        with pytest.raises(errors.DtypeMismatch) as info:
            h.update(2)
        message = str(info.value)
        assert "the buffer is bfloat16" in message and "was published in float32" in message
        assert "actor_rollout_ref.rollout.dtype=bfloat16" in message and "keeps serving v1" in message
        assert not isinstance(info.value, holder_engine_state_lost())
        assert h.served == 1 and not h.broken and all(torch.equal(before[n], params[n]) for n in params)
        assert "eng-refuses" in trainer.versions(model, layout=LAYOUT)[1]  # still a holder of what it serves
        # An engine that never got a version keeps its initial weights, and is not broken.
        with pytest.raises(errors.DtypeMismatch, match="keeps serving its initial weights"):
            fresh.update(2)
        assert fresh.served is None and not fresh.broken and not any(t.any() for t in fresh_params.values())
        # The workaround the message names: a staged pull through the engine's loader, which casts.
        staged, staged_params, staged_client = make_holder(hub, "eng-staged", torch.bfloat16, staging="cpu",
                                                           model=model)
        try:
            assert staged.update(2).version == 2 and serves(staged_params, 2, torch.float32, torch.bfloat16)
        finally:
            staged.close()
            staged_client.close()
    finally:
        for x, c in ((h, client), (fresh, fresh_client)):
            x.close()
            c.close()
        cast.close()
        trainer.close()


def holder_engine_state_lost():
    from tensorhub_verl.vllm.holder import EngineStateLost

    return EngineStateLost


def test_unpublishing_the_last_copy_preserves_it_inside_the_stall_and_says_how_much(hub):
    """A trainer that drops the version an engine still serves leaves the engine the last reliable copy: its next
    apply copies it to CPU (reported as preserved_bytes)."""
    model = "preserve-full"
    trainer = th.connect(hub.url, worker="trainer-full", location={**LOC, "node": "t"},
                         config=th.ClientConfig.from_fields(preserve_on_unpublish=False))
    h, params, client = make_holder(hub, "eng-last-copy", torch.float32, model=model)
    try:
        trainer.publish(model, 1, master(1, torch.float32))
        assert h.update(1).preserved_bytes == 0
        trainer.unpublish(model, 1)
        trainer.publish(model, 2, master(2, torch.float32))
        res = h.update(2)
        # One copy: the params hold v1 in 'hf' and in the engine's layout; once the first is archived, the
        # archive is the reliable copy of the version and the second is dropped without one.
        assert res.preserved_bytes == sum(t.numel() * t.element_size() for t in master(1, torch.float32).values())
    finally:
        h.close()
        client.close()
        trainer.close()


def test_no_copy_in_the_pause_while_the_trainers_shard_group_holds_the_version(hub):
    """Two FSDP-style row shards (one client per rank) keep holding v1 while the engine moves to v2: the complete
    group is a reliable copy, so the engine copies nothing in its stall."""
    model = "preserve-shards"
    ranks = [th.connect(hub.url, worker=f"trainer-rank{r}", location={**LOC, "node": "t"},
                        config=th.ClientConfig.from_fields(preserve_on_unpublish=False)) for r in range(2)]
    h, params, client = make_holder(hub, "eng-shards", torch.float32, model=model)

    def publish_rows(v):
        full = master(v, torch.float32)
        specs = {n: (tuple(t.shape), t.dtype) for n, t in full.items()}
        for r, c in enumerate(ranks):
            pieces = {n: t if t.dim() == 0 else t[slice(*row_range(t.shape[0], r, 2))] for n, t in full.items()}
            c.publish_shard(model, v, pieces, specs=specs, rank=r, ranks=2, group="trainer")
        return full

    try:
        keep = [publish_rows(1)]
        h.update(1)
        keep.append(publish_rows(2))
        res = h.update(2)
        assert res.version == 2 and res.preserved_bytes == 0
        assert "eng-shards~cpu" not in str(ranks[0].versions(model))
    finally:
        h.close()
        client.close()
        for c in ranks:
            c.close()
