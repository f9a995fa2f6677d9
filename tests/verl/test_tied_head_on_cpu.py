"""A model with tied embeddings publishes its embedding once: ``lm_head.weight`` (the embedding again) is left out
of the trainer's 'hf' versions, full and delta, while an untied model, or a tied config whose head is not its
embedding, publishes exactly what it yields. ``hf_names.repeated_head`` alone, then the real backend
(``TensorHubCheckpointEngine``, a real embedded hub, real ROS reads) fed a real tiny transformers Qwen2 the way
verl's engine feeds it: gathered fresh tensors from one master. FSDP2 row shards of a tied model (two real ranks
over gloo): ``test_rollout_dtype_on_cpu.py::test_fsdp2_row_shards_are_published_in_the_rollout_dtype[tied]``."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.hf_names import EMBEDDING, TIED_HEAD, memory_key, repeated_head
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.verl.digest import DIGEST_KEY

pytestmark = pytest.mark.timeout(240)


# ------------------------------------------------------------------------------------------- the decision
def test_the_head_is_left_out_only_when_the_model_ties_it_and_it_is_the_embedding():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(10, 4, generator=g)
    same = dict(ties=True, same_memory=True, compare_bytes=True)
    assert repeated_head(emb, emb, **same)
    assert not repeated_head(emb, emb, **{**same, "ties": False})  # an untied model keeps its head
    assert not repeated_head(emb, None, **same)  # no embedding yielded before it: nothing to stand for it
    # Another tensor with the same bytes: by bytes, only where one publisher sees the whole tensors.
    copy = emb.clone()
    assert repeated_head(copy, emb, ties=True, same_memory=False, compare_bytes=True)
    assert not repeated_head(copy, emb, ties=True, same_memory=False, compare_bytes=False)
    # A head that differs by one element, or in shape, stays.
    other = emb.clone()
    other[3, 2] += 1e-6
    assert not repeated_head(other, emb, ties=True, same_memory=False, compare_bytes=True)
    assert not repeated_head(emb[:9], emb, ties=True, same_memory=False, compare_bytes=True)
    # Bytes, not values: -0.0 is not 0.0.
    zeros, negative = torch.zeros(2, 2), torch.zeros(2, 2)
    negative[0, 0] = -0.0
    assert not repeated_head(negative, zeros, ties=True, same_memory=False, compare_bytes=True)
    # The embedding as the version carries it (cast): a head equal once cast is the same bytes for readers.
    assert repeated_head(emb, emb.to(torch.bfloat16), ties=True, same_memory=False, compare_bytes=True)
    # One tensor under two names is the same memory; a view of other rows, or a copy, is not.
    assert memory_key(emb) == memory_key(emb.detach()) != memory_key(emb[1:]) != memory_key(copy)


# ------------------------------------------------------------------------------- the backend, whole tensors
def _tiny_qwen2(tied: bool, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).to(dtype)


class _GatheringEngine:
    """verl's FSDP engine as the backend sees it on one rank: its ``module`` (nothing sharded, so no row shards)
    and ``get_per_tensor_param``, which yields fresh full tensors as FSDP's gathers do (the tied head a separate
    copy of the embedding)."""

    def __init__(self, module, head: torch.Tensor | None = None):
        self.module = module
        self._head = head

    def get_per_tensor_param(self):
        state = self.module.state_dict()
        if self._head is not None:
            state[TIED_HEAD] = self._head
        return ((name, t.detach().clone()) for name, t in state.items()), None


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.fixture
def hub():
    """A hub whose workers use the TCP plane: the test's reader is not in the trainer's job, and on NIXL the hub
    hands a holder's metadata (a capability to its memory) only to workers of the holder's own job."""
    server = th.start_hub(host="127.0.0.1", port=0, plane="tcp")
    yield server
    server.stop()


def _master(hub_url: str, job: str, **extra):
    from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

    return TensorHubCheckpointEngine(bucket_size=1, is_master=True, job=job, node="n0", **{
        "hub_address": hub_url, "keep_versions": 2, "chunk_mb": 1, "fetch_timeout_s": 120.0,
        "unpublish_timeout_s": 30.0, **extra})


def test_a_tied_model_publishes_its_embedding_once_in_full_versions_and_deltas(hub, caplog):
    model = _tiny_qwen2(tied=True)
    state = model.state_dict()
    assert state[TIED_HEAD].data_ptr() == state[EMBEDDING].data_ptr()  # what verl exports: one tensor, two names
    engine = _master(hub.url, "tied", staging="cpu", verify_digests=True, delta="on")
    reader = th.connect(hub.url, worker="rollout-tied", location={"node": "n1"})
    try:
        with caplog.at_level(logging.INFO, logger="tensorhub_verl.verl.publisher"):
            m1 = asyncio.run(engine.send_weights(_GatheringEngine(model), global_steps=1))
        manifest = reader.manifest("policy", 1)
        names = [t.name for t in manifest.tensors]
        assert TIED_HEAD not in names and EMBEDDING in names
        expected = {n: t for n, t in state.items() if n != TIED_HEAD}
        head_bytes = state[EMBEDDING].numel() * 4
        assert manifest.nbytes == m1["tensorhub/publish_bytes"] == _nbytes(state) - head_bytes
        assert m1[DIGEST_KEY] == tensor_digests(expected)
        into = manifest.allocate()
        reader.fetch("policy", 1, into=into, hold=False)
        assert all(torch.equal(into[n], expected[n]) for n in expected)
        told = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        assert len(told) == 1 and TIED_HEAD in told[0] and str(head_bytes) in told[0], told

        # An optimizer step moves the embedding (and so the head): v2 and its delta carry it once too, and the
        # reader that holds v1 applies the delta to exactly v2.
        with torch.no_grad():
            model.model.embed_tokens.weight[5:7] += 0.5
        with caplog.at_level(logging.INFO, logger="tensorhub_verl.verl.publisher"):
            m2 = asyncio.run(engine.send_weights(_GatheringEngine(model), global_steps=2))
        assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1  # logged once
        assert TIED_HEAD not in [t.name for t in reader.manifest("policy", 2).tensors]
        assert 0 < m2["tensorhub/publish_delta_bytes"] < m2["tensorhub/publish_bytes"] / 4
        stats = reader.fetch("policy", 2, into=into, hold=False, have=1)
        assert stats.delta is not None and stats.delta.used and not stats.delta.fallback_chunks
        assert all(torch.equal(into[n], t) for n, t in model.state_dict().items() if n != TIED_HEAD)
    finally:
        reader.close()
        engine.close()


@pytest.mark.parametrize("case", ["untied", "tied_config_other_head"])
def test_a_head_that_is_not_the_embedding_is_published_as_yielded(hub, case):
    """An untied model, or a tied config whose yielded head is not the embedding's bytes (a checkpoint whose head
    differs): the version carries every tensor the trainer yielded, bytes unchanged."""
    if case == "untied":
        model = _tiny_qwen2(tied=False)
        head = None
    else:
        model = _tiny_qwen2(tied=True)
        head = model.state_dict()[EMBEDDING].clone()
        head[0, 0] += 1.0
    yielded = dict(_GatheringEngine(model, head).get_per_tensor_param()[0])
    engine = _master(hub.url, case, staging="cpu")
    reader = th.connect(hub.url, worker=f"rollout-{case}", location={"node": "n1"})
    try:
        metrics = asyncio.run(engine.send_weights(_GatheringEngine(model, head), global_steps=1))
        manifest = reader.manifest("policy", 1)
        assert [t.name for t in manifest.tensors] == list(yielded)
        assert manifest.nbytes == metrics["tensorhub/publish_bytes"] == _nbytes(yielded)
        into = manifest.allocate()
        reader.fetch("policy", 1, into=into, hold=False)
        assert all(torch.equal(into[n], t) for n, t in yielded.items())
    finally:
        reader.close()
        engine.close()
