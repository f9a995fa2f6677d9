"""An engine shard serving N-1 reads N as the delta N-1 -> N and applies it into its live parameters (through the
in-place map of 'hf' onto the engine's layout), against a real hub and real ROS clients, no vLLM: parameters are
plain tensors in vLLM's layout. The real vLLM engine's version of these checks is ``test_engine_delta.py``."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.wire.delta_form import delta_layout
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.layout import hf_views
from tests.vllm.test_holder import LAYOUT, SHAPE, hf_version, loader, new_params

pytestmark = pytest.mark.vllm

CHUNK = 16 << 10
"""Small chunks: the tiny model spans several, so a bad chunk's fallback reads only part of it."""


def stepped(hf: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """The next version as an optimizer step makes it: a few rows of some matrices move, the rest stays."""
    g = torch.Generator().manual_seed(500 + step)
    out = {n: t.clone() for n, t in hf.items()}
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        out[name][step:step + 2] += torch.randn(2, out[name].shape[1], generator=g)
    return out


def same(params, hf) -> bool:
    ref = hf_to_vllm(hf, SHAPE)
    return all(torch.equal(params[n], ref[n]) for n in ref)


@pytest.fixture
def rig(hub):
    trainer = th.connect(hub.url, worker="delta-trainer", location={"dc": "dc0", "rack": "r0", "node": "t"},
                         chunk_bytes=CHUNK)
    made = []

    def engine(worker: str, delta: str = "auto", client_wrapper=None, dc: str = "dc0"):
        client = th.connect(hub.url, worker=worker, location={"dc": dc, "rack": "r0", "node": worker})
        wrapped = client_wrapper(client) if client_wrapper else client
        params = new_params()
        h = EngineHolder(wrapped, HolderConfig(model="dpolicy", layout=LAYOUT, staging="none", fetch_timeout_s=30,
                                               delta=delta),
                         params, loader(params), hf_views=hf_views(params, SHAPE))
        made.append((h, client))
        return h, params

    yield trainer, engine
    for h, client in made:
        h.close()
        client.close()
    trainer.close()


def test_an_engine_serving_the_base_applies_only_the_delta_and_serves_the_version_exactly(rig):
    trainer, engine = rig
    v1 = hf_version(31)
    v2 = stepped(v1, 1)
    trainer.publish("dpolicy", 1, v1)
    h, params = engine("eng-d1")
    first = h.update(1)
    assert first.delta is None and same(params, v1)
    m2 = trainer.publish("dpolicy", 2, v2)
    published = trainer.publish_delta("dpolicy", 2, 1)
    assert published.published

    result = h.update(2)
    assert same(params, v2) and h.served == 2
    assert result.source_layout == "hf" and result.delta.used and result.delta.fallback_chunks == 0
    assert result.bytes == result.delta.delta_bytes == published.bytes < m2.nbytes / 4
    assert 0 < result.delta.changed_fraction == pytest.approx(published.changed_fraction)
    # It serves N onward in 'hf' and in its own layout, and the delta form to peers that hold N-1.
    assert h.wait_published(30)
    assert "eng-d1" in trainer.versions("dpolicy", layout=delta_layout("hf", 1))[2]
    assert "eng-d1" in trainer.versions("dpolicy", layout=LAYOUT)[2]
    assert "eng-d1" not in trainer.versions("dpolicy", layout=LAYOUT).get(1, [])


def test_delta_off_reads_the_version_in_full(rig):
    trainer, engine = rig
    v1 = hf_version(41)
    v2 = stepped(v1, 2)
    trainer.publish("dpolicy", 11, v1)
    h, params = engine("eng-off", delta="off")
    h.update(11)
    m2 = trainer.publish("dpolicy", 12, v2)
    trainer.publish_delta("dpolicy", 12, 11)
    result = h.update(12)
    assert result.delta is None and result.bytes == m2.nbytes and same(params, v2)


@pytest.mark.parametrize("param, row", [
    ("model.layers.0.mlp.gate_up_proj.weight", 0),  # a chunk the step leaves alone: checked, never written
    ("model.layers.0.self_attn.qkv_proj.weight", 5),  # beside q_proj's moved rows: written, then caught
])
def test_a_rotted_base_chunk_is_re_read_in_full_and_the_engine_serves_the_version_exactly(rig, param, row):
    trainer, engine = rig
    v1 = hf_version(51)
    v2 = stepped(v1, 3)
    trainer.publish("dpolicy", 21, v1)
    h, params = engine("eng-rot")
    h.update(21)
    trainer.publish("dpolicy", 22, v2)
    trainer.publish_delta("dpolicy", 22, 21)
    with torch.no_grad():
        params[param][row, 0] += 1.0  # the engine's base no longer is v21

    result = h.update(22)
    assert same(params, v2) and h.served == 22
    assert result.delta.used and result.delta.fallback_chunks >= 1 and result.delta.fallback_bytes > 0
    assert any("base" in r for r in result.delta.reasons), result.delta.reasons


def tied(hf: dict[str, torch.Tensor], head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``hf`` with the ``lm_head.weight`` a tied model's state dict carries (verl exports it): the embedding's
    bytes, or ``head``'s."""
    return {**hf, "lm_head.weight": (hf["model.embed_tokens.weight"] if head is None else head).clone()}


def serves(params, hf) -> bool:
    """``params`` hold ``hf`` (its tied head is not a parameter: the engine serves the embedding in its place)."""
    return same(params, {n: t for n, t in hf.items() if n != "lm_head.weight"})


def _base_from_a_peer(rig, v1: dict[str, torch.Tensor], version: int):
    """Engine A reads ``v1`` from the trainer ('hf'); engine B then reads it raw from A's parameters, which hold
    no tied head: B's scratch for the head is never written by its landing."""
    trainer, engine = rig
    trainer.publish("dpolicy", version, v1)
    a, _ = engine("eng-peer-a")
    a.update(version)
    assert a.wait_published(30)
    b, params = engine("eng-peer-b")
    first = b.update(version)
    assert first.source_layout == LAYOUT and set(first.sources) == {"eng-peer-a"} and serves(params, v1)
    return b, params


def test_a_base_read_raw_from_a_peer_takes_the_delta_over_a_tied_head(rig):
    """The delta's base is the whole 'hf' version, the tied head's chunks included: an engine whose base landed
    raw from a peer (its engine's layout has no head) fills the head's scratch from the embedding before the
    delta's base check, and applies every chunk; none is re-read in full."""
    trainer, _ = rig
    v1 = tied(hf_version(81))
    v2 = tied(stepped(v1, 1))
    b, params = _base_from_a_peer(rig, v1, 51)
    trainer.publish("dpolicy", 52, v2)
    published = trainer.publish_delta("dpolicy", 52, 51)
    assert published.published

    result = b.update(52)
    assert result.delta.used and result.delta.fallback_chunks == 0, result.delta.reasons
    assert result.bytes == published.bytes and serves(params, v2) and b.served == 52


def test_a_tied_head_that_is_not_the_embedding_fails_the_base_check_and_is_re_read(rig):
    """Fail closed: a publisher whose tied head's bytes are not its embedding's (so the scratch filled from the
    embedding is not the base) gets the head's chunks refused as a base and re-read in full."""
    trainer, _ = rig
    v1 = hf_version(82)
    v1 = tied(v1, head=v1["model.embed_tokens.weight"] + 1.0)
    v2 = stepped(v1, 2)
    b, params = _base_from_a_peer(rig, v1, 61)
    trainer.publish("dpolicy", 62, v2)
    assert trainer.publish_delta("dpolicy", 62, 61).published

    result = b.update(62)
    assert result.delta.used and result.delta.fallback_chunks >= 1, result.delta
    assert any("did not hold base version 61" in r for r in result.delta.reasons), result.delta.reasons
    assert serves(params, v2) and b.served == 62


class _FailingDelta:
    """A real client whose read of a delta writes garbage over half the buffers, then fails: a fault after the
    first byte of the parameters changed (injected: a real fault there is a process dying mid-apply)."""

    def __init__(self, client):
        self._c = client

    def __getattr__(self, name):
        return getattr(self._c, name)

    def fetch(self, model, version, into=None, layout="hf", hold=True, timeout=None, have=None, delta="auto"):
        if have is not None:
            for t in list(into.values())[: len(into) // 2]:
                t.fill_(7.0)
            raise errors.TransferFailed("injected: the delta's fallback read failed too")
        return self._c.fetch(model, version, into=into, layout=layout, hold=hold, timeout=timeout)


def test_a_delta_that_fails_midway_leaves_the_engine_serving_its_old_version_exactly(rig):
    trainer, engine = rig
    v1 = hf_version(61)
    v2 = stepped(v1, 4)
    trainer.publish("dpolicy", 31, v1)
    h, params = engine("eng-fail", client_wrapper=_FailingDelta)
    h.update(31)
    trainer.publish("dpolicy", 32, v2)
    trainer.publish_delta("dpolicy", 32, 31)
    with pytest.raises(errors.TransferFailed, match="injected"):
        h.update(32)
    # Restored in full: never a half-applied version.
    assert h.served == 31 and not h.broken and same(params, v1)


def test_bytes_read_from_another_datacenter_are_counted_as_wan_bytes(rig):
    trainer, engine = rig
    trainer.publish("dpolicy", 41, hf_version(71))
    first, _ = engine("eng-wan-a", dc="dc1")
    second, _ = engine("eng-wan-b", dc="dc1")
    crossed = first.update(41)
    assert crossed.dc == "dc1" and crossed.wan_bytes == crossed.bytes > 0  # from the trainer in dc0
    assert first.wait_published(30)
    local = second.update(41)
    assert set(local.sources) == {"eng-wan-a"} and local.wan_bytes == 0  # from its own datacenter
