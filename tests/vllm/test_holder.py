"""EngineHolder (one engine shard's holder/updater) against a real hub and real ROS clients, no vLLM:
parameters are plain tensors in the vLLM layout; the 'engine loader' is layout_oracle.hf_to_vllm."""

from __future__ import annotations

import threading

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.vllm.layout import DecoderShape, hf_views, layout_name, vllm_param_shapes

pytestmark = pytest.mark.vllm

SHAPE = DecoderShape(arch="qwen2", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                     num_kv_heads=1, head_dim=32, vocab_size=100, tie_word_embeddings=True, qkv_bias=True)
LAYOUT = layout_name("qwen2", 1, 0)


def hf_version(v: int) -> dict[str, torch.Tensor]:
    from tests.vllm.test_layout import _random_hf

    return _random_hf(SHAPE, seed=v)


def new_params() -> dict[str, torch.Tensor]:
    return {n: torch.zeros(s) for n, s in vllm_param_shapes(SHAPE).items()}


def loader(params):
    def load(weights):
        for name, t in hf_to_vllm(dict(weights), SHAPE).items():
            params[name].copy_(t)
    return load


def same(params, v: int) -> bool:
    ref = hf_to_vllm(hf_version(v), SHAPE)
    return all(torch.equal(params[n], ref[n]) for n in ref)


class FlakyClient:
    """Delegates to a real client; its next fetch writes garbage into half the buffers, then fails."""

    def __init__(self, client):
        self._c = client
        self.fail_next = False
        self.calls: list[str] = []
        self.publish_gate = threading.Event()
        """Cleared by a test to hold publications back."""
        self.publish_gate.set()

    def __getattr__(self, name):
        return getattr(self._c, name)

    def unpublish(self, model, version, layout=None, timeout=None):
        self.calls.append(f"unpublish v{version} {layout}")
        return self._c.unpublish(model, version, layout=layout, timeout=timeout)

    def publish(self, model, version, tensors, layout="hf", verified=None):
        self.calls.append(f"publish v{version} {layout}")
        if not self.publish_gate.wait(60):
            raise errors.TransferFailed("test: publish gate never opened")
        return self._c.publish(model, version, tensors, layout=layout, verified=verified)

    def fetch(self, model, version, into=None, layout="hf", hold=True, timeout=None):
        self.calls.append(f"fetch v{version} {layout}")
        if self.fail_next:
            self.fail_next = False
            for t in list(into.values())[: len(into) // 2]:
                t.fill_(7.0)
            raise errors.TransferFailed("injected: source died midway")
        return self._c.fetch(model, version, into=into, layout=layout, hold=hold, timeout=timeout)

    def fetch_slices(self, model, version, *, into, slices=None, layout="hf", timeout=None):
        self.calls.append(f"fetch_slices v{version} {layout}")
        if self.fail_next:
            self.fail_next = False
            raise errors.TransferFailed("injected: source died midway")
        return self._c.fetch_slices(model, version, into=into, slices=slices, layout=layout, timeout=timeout)


@pytest.fixture(scope="module")
def trainer(hub):
    c = th.connect(hub.url, worker="trainer", location={"dc": "dc0", "rack": "r0", "node": "n0"})
    yield c
    c.close()


def make_holder(hub, worker, staging="cpu", node="n1", views=False):
    client = FlakyClient(th.connect(hub.url, worker=worker, location={"dc": "dc0", "rack": "r0", "node": node}))
    params = new_params()
    h = EngineHolder(client, HolderConfig(model="policy", layout=LAYOUT, staging=staging, fetch_timeout_s=30),
                     params, loader(params), hf_views=hf_views(params, SHAPE) if views else None)
    return h, params, client


def test_hf_then_raw_from_peer_then_new_version(hub, trainer):
    hf1 = hf_version(1)
    trainer.publish("policy", 1, hf1)
    a, pa, ca = make_holder(hub, "eng-a")
    b, pb, cb = make_holder(hub, "eng-b", node="n2")
    try:
        ra = a.update("latest")
        assert ra.version == 1 and ra.source_layout == "hf" and set(ra.sources) == {"trainer"}
        assert same(pa, 1) and a.served == 1 and a.wait_published(30)
        assert "eng-a" in trainer.versions("policy", layout=LAYOUT)[1]
        rb = b.update(1)  # the peer holds the engine layout: raw reads from it, never the trainer
        assert rb.source_layout == LAYOUT and set(rb.sources) == {"eng-a"}
        assert same(pb, 1)
        # a new version: only hf exists -> hf path; the old version is unpublished before params change
        trainer.publish("policy", 2, hf_version(2))
        ca.calls.clear()
        ra2 = a.update("latest")
        assert ra2.version == 2 and same(pa, 2) and a.wait_published(30)
        order = [c for c in ca.calls if "publish" in c]
        assert order[0] == "unpublish v1 None" and order[-1] == f"publish v2 {LAYOUT}"  # None: all layouts
        assert "eng-a" not in trainer.versions("policy", layout=LAYOUT).get(1, [])
        rb2 = b.update("latest")
        assert rb2.source_layout == LAYOUT and set(rb2.sources) == {"eng-a"} and same(pb, 2)
    finally:
        for h, c in ((a, ca), (b, cb)):
            h.close()
            c.close()


@pytest.mark.parametrize("staging", ["cpu", "none"])
def test_failed_pull_midway_never_leaves_a_mix(hub, trainer, staging):
    trainer.publish("policy", 11, hf_version(11))
    peer, _, cpeer = make_holder(hub, f"peer-{staging}", node="n3")
    h, params, client = make_holder(hub, f"eng-{staging}", staging=staging)
    try:
        h.update(11)
        trainer.publish("policy", 12, hf_version(12))
        peer.update(12)  # so the engine-layout raw path (straight into params with staging none) is taken
        client.fail_next = True
        if staging == "cpu":  # the raw pull failed in staging; the hf fallback then succeeded
            res = h.update(12)
            assert res.source_layout == "hf" and h.served == 12
        else:  # straight into params: the failure is raised after restoring v11 from the trainer
            with pytest.raises(errors.TransferFailed, match="injected"):
                h.update(12)
            assert h.served == 11
        assert not h.broken and same(params, h.served)
        assert f"eng-{staging}" in trainer.versions("policy", layout=LAYOUT)[h.served]
    finally:
        for x, c in ((h, client), (peer, cpeer)):
            x.close()
            c.close()


def test_staged_pull_failure_keeps_old_version_untouched(hub, trainer):
    """No mapping of 'hf' (versions go through the loader in buckets, inside apply): the pull fails midway and
    the shard restores the old version from its holder (the trainer), registered again."""
    trainer.publish("policy", 21, hf_version(21))
    h, params, client = make_holder(hub, "eng-staged")
    try:
        h.update(21)
        trainer.publish("policy", 22, hf_version(22))
        before = {n: t.clone() for n, t in params.items()}
        client.fail_next = True
        h.begin_pull(22)
        with pytest.raises(errors.TransferFailed, match="injected"):
            h.apply(timeout=30)
        assert all(torch.equal(before[n], params[n]) for n in params)
        assert h.served == 21 and "eng-staged" in trainer.versions("policy", layout=LAYOUT)[21]
        assert h.update(22).version == 22 and same(params, 22)  # the next try works
    finally:
        h.close()
        client.close()


def test_wait_ready_timeout_fires(hub, trainer):
    trainer.publish("policy", 31, hf_version(31))
    h, params, client = make_holder(hub, "eng-slow", views=True)  # mapped: a staged pull runs in the background
    gate = threading.Event()
    real_fetch = client.fetch

    def slow_fetch(*a, **kw):
        gate.wait(10)
        return real_fetch(*a, **kw)

    client.fetch = slow_fetch
    try:
        h.begin_pull(31)
        with pytest.raises(TimeoutError):
            h.wait_ready(0.3)
        assert h.status().pulling  # it gave up at its own timeout, not when the pull ended
        with pytest.raises(errors.InvalidRequest):
            h.begin_pull(31)  # one pull at a time
        gate.set()
        assert h.apply(30).version == 31 and same(params, 31)
    finally:
        gate.set()
        h.close()
        client.close()


def test_rejects_repacked_parameters(hub):
    client = th.connect(hub.url, worker="eng-empty", location={"dc": "dc0", "rack": "r0", "node": "n9"})
    try:
        with pytest.raises(errors.ConfigError, match="repacked"):
            EngineHolder(client, HolderConfig(model="policy", layout=LAYOUT), {"w": torch.empty(0)}, lambda w: None)
        with pytest.raises(errors.ConfigError):
            HolderConfig(model="policy", layout=LAYOUT, staging="disk")
    finally:
        client.close()


def test_staging_none_pulls_hf_straight_into_the_parameters(hub, trainer):
    """No copy of the model: the HF tensors land in views of the live parameters, with only the tied
    lm_head (which the engine does not use) read into scratch; a failure midway restores the old version."""
    trainer.publish("policy", 41, hf_version(41))
    h, params, client = make_holder(hub, "eng-views", staging="none", views=True)
    try:
        ptrs = {n: t.data_ptr() for n, t in params.items()}
        res = h.update(41)
        assert res.source_layout == "hf" and set(res.sources) == {"trainer"} and same(params, 41)
        assert {n: t.data_ptr() for n, t in params.items()} == ptrs  # the engine's own storage, updated in place
        assert h.extra_bytes == 0  # this fixture's tied embedding: the trainer publishes no lm_head
        assert "eng-views" in trainer.versions("policy", layout=LAYOUT)[41]
        trainer.publish("policy", 42, hf_version(42))
        client.fail_next = True
        with pytest.raises(errors.TransferFailed, match="injected"):
            h.update(42)
        assert h.served == 41 and not h.broken and same(params, 41)
        assert h.update(42).version == 42 and same(params, 42)
    finally:
        h.close()
        client.close()


def test_apply_returns_before_the_digest_pass_and_the_next_write_waits_for_it(hub, trainer):
    """A version read from 'hf' is published in the engine's layout on a thread after apply: apply returns
    while that publication is held back, peers see no engine-layout holding until it lands, and the next
    apply does not change a byte before it has."""
    trainer.publish("policy", 51, hf_version(51))
    h, params, client = make_holder(hub, "eng-bg")
    try:
        client.publish_gate.clear()
        h.begin_pull(51)
        done = threading.Event()
        applied = []
        threading.Thread(target=lambda: (applied.append(h.apply(30)), done.set()), daemon=True).start()
        assert done.wait(30), "apply waited for the publication"
        assert applied[0].version == 51 and h.served == 51 and same(params, 51) and h.status().publishing
        assert 51 not in trainer.versions("policy", layout=LAYOUT)
        trainer.publish("policy", 52, hf_version(52))
        h.begin_pull(52)
        second = threading.Event()
        threading.Thread(target=lambda: (h.apply(30), second.set()), daemon=True).start()
        assert not second.wait(1.0) and same(params, 51), "the next apply wrote while v51 was being digested"
        client.publish_gate.set()
        assert second.wait(30) and h.wait_published(30) and same(params, 52)
        assert "eng-bg" in trainer.versions("policy", layout=LAYOUT)[52]
        assert "eng-bg" not in trainer.versions("policy", layout=LAYOUT).get(51, [])
    finally:
        client.publish_gate.set()
        h.close()
        client.close()
