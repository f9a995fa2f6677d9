"""Real vLLM engines (CPU build, float32) that serve version N-1 read N as a delta and apply it into their live
parameters: greedy output equals HF transformers' on N, the weights have N's digests tensor by tensor, and a
corrupt delta or a rotted base costs a full read of the chunks concerned, never a wrong or half-applied version.

    trainer (this process) publishes v1..v5 of the tiny Qwen2, each a few rows moved, with its delta
    e1: v1 in full from the trainer, then v2, v3 as deltas; v4's delta is corrupt, v5's base rotted in e1
    e2 joins at v2: v2 in full from its peer e1, then v3 as a delta; it misses v4, so v5 comes in full

Both engines keep ``staging='cpu'``: a delta is read and applied inside the pause whatever the staging.
TP=1 only: a TP>1 rank holds slices of the 'hf' chunks the delta's digests cover, and reads versions in full
(``Landing.applies_deltas``; its full-read path is ``test_engine_tp.py``'s).
"""

from __future__ import annotations

import pytest
import torch

from tests.requires import require

require("vllm")

import tensorhub_verl as th
from tensorhub_verl.ros.client.delta_chunks import encode_delta
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER, delta_layout
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.vllm.engine_proc import EngineSpec, running_engines
from tensorhub_verl.bench.tiny_model import hf_greedy, hf_state_dict, load_hf_model
from tensorhub_verl.verl.digest import differing
from tensorhub_verl.vllm.layout import layout_name
from tests.vllm.conftest import loc
from tests.vllm.toy_run import N_NEW, PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MODEL = "dpolicy"
CHUNK = 64 << 10
"""Small chunks: the tiny model spans many, so a bad chunk's full re-read is a fraction of the version."""
LAYOUT = layout_name("qwen2", 1, 0)
MOVED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight")


class Run:
    """The trainer: each version moves a few rows of three tensors (as an optimizer step moves few bf16
    elements), is published with its delta from the one before, and keeps HF's greedy references."""

    def __init__(self, model_dir: str, client):
        self.model = load_hf_model(model_dir)
        self.client = client
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.refs: dict[int, list[list[int]]] = {}
        self.manifests: dict = {}

    def step(self, version: int, delta: bool = True):
        if version > 1:
            g = torch.Generator().manual_seed(version)
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name in MOVED:
                    rows = params[name][3 * version:3 * version + 3]
                    rows += 0.5 * torch.randn(rows.shape, generator=g)
        self.weights[version] = {n: t.detach().clone() for n, t in hf_state_dict(self.model).items()}
        self.refs[version] = [hf_greedy(self.model, p, N_NEW) for p in PROMPTS]
        self.manifests[version] = self.client.publish(MODEL, version, self.weights[version])
        return self.client.publish_delta(MODEL, version, version - 1) if delta and version > 1 else None


@pytest.fixture(scope="module")
def rig(hub, tiny_models):
    client = th.connect(hub.url, worker="dtrainer", location=loc("trainer"), chunk_bytes=CHUNK)
    run = Run(tiny_models["qwen2"], client)
    run.step(1)
    with running_engines([
        EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="d1", model=MODEL, location=loc("n1")),
        EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="d2", model=MODEL, location=loc("n2")),
    ]) as (e1, e2):
        yield run, e1, e2
    client.close()


def outputs(engine) -> list[list[int]]:
    return [engine.generate(p, N_NEW) for p in PROMPTS]


def serves_exactly(engine, run, version: int) -> None:
    """The engine's weights, read back as HF tensors, have the trainer's digests of ``version``; its greedy output
    is HF's on that version."""
    answer = engine.rpc("th_hf_digests")[0]
    assert answer["version"] == version
    assert differing(tensor_digests(run.weights[version]), answer["digests"], answer["unused"]) == []
    assert outputs(engine) == run.refs[version]


def test_an_engine_serving_the_base_applies_the_delta_in_place_and_serves_the_version(rig):
    run, e1, _ = rig
    first = e1.update(1)
    assert first["source_layouts"] == ["hf"] and first["delta_ranks"] == 0
    serves_exactly(e1, run, 1)
    published = run.step(2)
    assert published.published and run.refs[2] != run.refs[1]

    res = e1.update(2)
    assert res["applied"] and res["source_layouts"] == ["hf"] and res["delta_ranks"] == 1
    assert res["bytes"] == res["delta_bytes"] == published.bytes < run.manifests[2].nbytes / 4
    assert res["delta_fallbacks"] == 0 and 0 < res["changed_fraction"] < 0.1
    serves_exactly(e1, run, 2)
    # e1 holds v2 in its own layout and the delta form: it serves both onward.
    assert e1.rpc("th_wait_published", timeout_s=60.0) == [True]
    assert "d1" in run.client.versions(MODEL, layout=delta_layout("hf", 1))[2]
    assert "d1" in run.client.versions(MODEL, layout=LAYOUT)[2]


def test_a_joining_engine_reads_in_full_from_its_peer_then_applies_deltas(rig):
    run, e1, e2 = rig
    joined = e2.update(2)  # serves nothing yet: v2 in full, raw from the peer that holds it in its layout
    assert joined["source_layouts"] == [LAYOUT] and set(joined["sources"]) == {"d1"}
    assert joined["delta_ranks"] == 0 and joined["bytes"] > run.manifests[2].nbytes / 2
    serves_exactly(e2, run, 2)

    published = run.step(3)
    for engine in (e2, e1):
        res = engine.update(3)
        assert res["delta_ranks"] == 1 and res["bytes"] == res["delta_bytes"] == published.bytes
        serves_exactly(engine, run, 3)
    assert {"d1", "d2", "dtrainer"} <= set(run.client.versions(MODEL, layout=delta_layout("hf", 2))[3])


def test_a_corrupt_delta_is_caught_and_its_chunks_re_read_in_full(rig):
    run, e1, _ = rig
    run.step(4, delta=False)
    m3, m4 = run.manifests[3], run.manifests[4]
    order = [s.name for s in m4.tensors]
    header, blob, _ = encode_delta(m3, [run.weights[3][n] for n in order], m4, [run.weights[4][n] for n in order])
    blob[:64] ^= 0x5A  # its own chunk digests hold: only the checks against v3 and v4 catch it
    run.client.publish(MODEL, 4, {HEADER: torch.frombuffer(bytearray(header.to_bytes()), dtype=torch.uint8),
                                  BLOB: blob}, layout=delta_layout("hf", 3))

    res = e1.update(4)
    assert res["delta_ranks"] == 1 and res["delta_fallbacks"] >= 1 and res["delta_reasons"]
    assert res["bytes"] < m4.nbytes  # only the bad chunks were read in full
    serves_exactly(e1, run, 4)
    assert "d1" not in run.client.versions(MODEL, layout=delta_layout("hf", 3)).get(4, [])  # not served onward


def test_a_rotted_base_is_re_read_in_full_and_a_replica_that_missed_a_step_reads_in_full(rig):
    run, e1, e2 = rig
    e1.request("rot_weight", name="model.layers.0.mlp.gate_up_proj.weight")
    published = run.step(5)

    res = e1.update(5)
    assert res["delta_ranks"] == 1 and res["delta_fallbacks"] >= 1
    assert any("base" in r for r in res["delta_reasons"]), res["delta_reasons"]
    serves_exactly(e1, run, 5)

    missed = e2.update(5)  # serves v3: no delta from v3 to v5 (no chains), so v5 in full
    assert missed["delta_ranks"] == 0 and missed["delta_bytes"] == 0 and missed["bytes"] > published.bytes
    serves_exactly(e2, run, 5)
