"""TP>1 engines as EngineHolders, no vLLM: two holders are the two ranks of one TP=2 engine (plain tensors in
vLLM's TP=2 layout; the 'engine loader' is layout_oracle.hf_to_vllm for that rank), against a real hub and real clients.

What it proves: a version in an engine's TP layouts is never visible before every rank holds it (the ranks are
one shard group), and a second TP=2 engine reads rank to rank, raw, from the first."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.ros.wire.delta_form import delta_layout
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.vllm.layout import hf_views, layout_name, vllm_param_shapes
from tests.vllm.test_holder import SHAPE, hf_version

pytestmark = pytest.mark.vllm

TP = 2
LAYOUTS = [layout_name("qwen2", TP, r) for r in range(TP)]


def rank_holder(hub, engine: str, rank: int, staging: str, node: str, views: bool = False):
    client = th.connect(hub.url, worker=f"{engine}/rank{rank}", location={"dc": "dc0", "rack": "r0", "node": node})
    params = {n: torch.zeros(s) for n, s in vllm_param_shapes(SHAPE, TP, rank).items()}

    def load(weights):
        for name, t in hf_to_vllm(dict(weights), SHAPE, TP, rank).items():
            params[name].copy_(t)

    config = HolderConfig(model="policy", layout=LAYOUTS[rank], staging=staging, fetch_timeout_s=30,
                          shard_group=engine, shard_count=TP)
    return EngineHolder(client, config, params, load,
                        hf_views=hf_views(params, SHAPE, TP, rank) if views else None), params


def same(params, v: int, rank: int, hf: dict[str, torch.Tensor] | None = None) -> bool:
    ref = hf_to_vllm(hf_version(v) if hf is None else hf, SHAPE, TP, rank)
    return all(torch.equal(params[n], ref[n]) for n in ref)


@pytest.fixture
def trainer(hub):
    c = th.connect(hub.url, worker="tp-trainer", location={"dc": "dc0", "rack": "r0", "node": "n0"})
    yield c
    c.close()


@pytest.mark.parametrize("staging", ["cpu", "none"])
def test_tp_layouts_visible_only_when_every_rank_holds_them_and_peers_read_rank_to_rank(hub, trainer, staging):
    v = 101 if staging == "cpu" else 201
    trainer.publish("policy", v, hf_version(v))
    a = [rank_holder(hub, f"tpa-{staging}", r, "cpu", "na") for r in range(TP)]
    b = [rank_holder(hub, f"tpb-{staging}", r, staging, "nb") for r in range(TP)]
    try:
        ra0 = a[0][0].update(v)
        assert ra0.source_layout == "hf" and same(a[0][1], v, 0)
        # rank 0 holds v, rank 1 not yet: nobody sees rank 0's layout of v, so no peer starts a raw read of it
        assert v not in trainer.versions("policy", layout=LAYOUTS[0])
        assert b[0][0].plan_source_layout(v) == "hf"
        a[1][0].update(v)
        for r in range(TP):
            assert trainer.versions("policy", layout=LAYOUTS[r])[v] == [f"tpa-{staging}/rank{r}"]
        # engine B: each rank reads its own layout raw from the same rank of engine A
        rb0 = b[0][0].update(v)
        assert rb0.source_layout == LAYOUTS[0] and set(rb0.sources) == {f"tpa-{staging}/rank0"}
        assert same(b[0][1], v, 0)
        assert trainer.versions("policy", layout=LAYOUTS[0])[v] == [f"tpa-{staging}/rank0"]  # B's rank 0 pending
        rb1 = b[1][0].update(v)
        assert rb1.source_layout == LAYOUTS[1] and set(rb1.sources) == {f"tpa-{staging}/rank1"}
        assert same(b[1][1], v, 1)
        for r in range(TP):
            assert sorted(trainer.versions("policy", layout=LAYOUTS[r])[v]) == [f"tpa-{staging}/rank{r}",
                                                                               f"tpb-{staging}/rank{r}"]
        # the next version: A's rank 0 moves first; its old layout is gone, its new one waits for rank 1
        trainer.publish("policy", v + 1, hf_version(v + 1))
        a[0][0].update(v + 1)
        assert v + 1 not in trainer.versions("policy", layout=LAYOUTS[0])
        a[1][0].update(v + 1)
        assert trainer.versions("policy", layout=LAYOUTS[1])[v + 1] == [f"tpa-{staging}/rank1"]
    finally:
        for holder, _ in a + b:
            holder.close()
            holder.client.close()


@pytest.mark.parametrize("staging", ["none", "cpu"])
def test_each_tp_rank_reads_only_its_slices_from_hf(hub, trainer, staging):
    """With HF views each rank reads its rows/columns of each HF tensor (``Client.fetch_slices``): straight into
    its parameters (staging 'none'), or into a staging copy in the engine's layout while the engine keeps
    generating (staging 'cpu'). Either way the engine moves about one model's bytes, not two."""
    v = 301 if staging == "none" else 311
    hf = hf_version(v)
    model_bytes = sum(t.numel() * t.element_size() for t in hf.values())
    trainer.publish("policy", v, hf)
    engine = f"tpc-{staging}"
    ranks = [rank_holder(hub, engine, r, staging, "nc", views=True) for r in range(TP)]
    try:
        got = []
        for r, (h, params) in enumerate(ranks):
            h.begin_pull(v)
            if staging == "cpu":
                h.wait_ready(30)
                assert not same(params, v, r)  # pulled into staging; the parameters change only in apply
            got.append(h.apply())
        for r, (h, params) in enumerate(ranks):
            param_bytes = sum(t.numel() * t.element_size() for t in params.values())
            assert got[r].source_layout == "hf" and same(params, v, r)
            assert h.extra_bytes == (0 if staging == "none" else param_bytes)  # a copy of the rank, not of hf
            assert set(got[r].sources) <= {"tp-trainer", f"{engine}/rank0"}, got[r].sources
            # half the model, plus the KV heads (one KV head here: every rank holds it whole)
            assert got[r].bytes < 0.6 * model_bytes, (got[r].bytes, model_bytes)
        assert all(h.wait_published(30) for h, _ in ranks)  # the ranks publish after apply returns
        assert trainer.versions("policy", layout=LAYOUTS[1])[v] == [f"{engine}/rank1"]
        assert f"{engine}/rank0" not in trainer.versions("policy", layout="hf")[v]  # parts only: never hf
    finally:
        for holder, _ in ranks:
            holder.close()
            holder.client.close()


@pytest.mark.parametrize("staging", ["none", "cpu"])
def test_each_tp_rank_applies_its_part_of_a_delta_and_a_rotted_slice_is_re_read(hub, trainer, staging):
    """Ranks serving N-1 read N as the delta (whatever the staging: it lands inside the pause) and apply only
    their slices of each chunk, checked against N's block digests; a rank whose slice rotted re-reads the
    chunks concerned in full and serves N exactly. The ranks hold the delta form and serve it onward."""
    from tests.vllm.test_holder_delta import stepped

    v = 401 if staging == "none" else 411
    hf = {v: hf_version(v)}
    hf[v + 1] = stepped(hf[v], 1)
    hf[v + 2] = stepped(hf[v + 1], 2)
    small = 16 << 10  # the tiny model spans several chunks: the vocabulary's (split off whole blocks) read in full
    trainer.publish("policy", v, hf[v], chunk_bytes=small)
    engine = f"tpd-{staging}"
    ranks = [rank_holder(hub, engine, r, staging, "nd", views=True) for r in range(TP)]
    try:
        for h, _ in ranks:
            assert h.update(v).delta is None
        for step in (1, 2):
            trainer.publish("policy", v + step, hf[v + step], chunk_bytes=small)
            published = trainer.publish_delta("policy", v + step, v + step - 1)
            assert published.published
            if step == 2:
                with torch.no_grad():
                    ranks[1][1]["model.layers.0.self_attn.qkv_proj.weight"][3, 0] += 1.0  # rank 1's base rots
            got = [h.update(v + step) for h, _ in ranks]
            for r, (h, params) in enumerate(ranks):
                assert same(params, v + step, r, hf[v + step]) and h.served == v + step
                d = got[r].delta
                assert got[r].source_layout == "hf" and d.used, d
                if step == 2 and r == 1:
                    assert d.fallback_chunks >= 1 and any("base" in x for x in d.reasons), d
                else:
                    assert d.fallback_chunks == 0 and d.delta_bytes == published.bytes, d
                    assert got[r].bytes == d.delta_bytes + d.full_bytes < 0.5 * published.version_bytes, d
        holders = trainer.versions("policy", layout=delta_layout("hf", v + 1))[v + 2]
        assert {f"{engine}/rank0", f"{engine}/rank1"} <= set(holders)
        assert trainer.versions("policy", layout=LAYOUTS[1])[v + 2] == [f"{engine}/rank1"]
    finally:
        for holder, _ in ranks:
            holder.close()
            holder.client.close()


def test_tp_config_needs_a_group():
    with pytest.raises(th.errors.ConfigError, match="shard_group"):
        HolderConfig(model="policy", layout=LAYOUTS[0], shard_count=2)
