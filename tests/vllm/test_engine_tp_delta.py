"""A real TP=2 vLLM engine (CPU build, float32, one core per rank) serving version N-1 reads N as a delta:
each rank applies only its slices of each chunk, checked against N's block digests. Greedy output equals HF
transformers' on N, and every rank's parameters equal, digest for digest, those of a TP=2 engine that read N in
full from the trainer; a wrong delta and a rotted base cost a full read of the chunks concerned.

    trainer (this process) publishes v1..v4 of the tiny Qwen2, each a few rows moved, with its delta
    t1 (TP=2): v1 in full; v2 as a delta; v3's delta gives wrong bytes in both ranks' rows; v4's base rotted
    t2 (TP=2): v4 in full from the trainer's 'hf' (``--source-layout hf``): the reference
"""

from __future__ import annotations

import pytest
import torch

from tests.requires import require

require("vllm")

import tensorhub_verl as th
from tensorhub_verl.ros.client.delta_chunks import encode_delta
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER, delta_layout
from tensorhub_verl.settings import SOURCE_LAYOUT_ENV
from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec
from tests.vllm.conftest import loc
from tests.vllm.test_engine_delta import CHUNK, MODEL, Run, outputs
from tests.vllm.test_engine_tp import TP2_ENV

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

Q = "model.layers.0.self_attn.q_proj.weight"


def tp2(hub, tiny_models, worker: str, **env) -> EngineProcess:
    return EngineProcess(EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker=worker, tp_size=2,
                                    model=MODEL, location=loc(worker), staging="none", env={**TP2_ENV, **env},
                                    client_config={"read_timeout_s": 10.0}), start_timeout_s=600)


def wrong_delta(run: Run, version: int) -> None:
    """Publishes a delta to ``version`` whose payloads give other bytes than its digests say: a q_proj row of
    each rank's half moved too."""
    base, target = run.manifests[version - 1], run.manifests[version]
    wrong = {n: t.clone() for n, t in run.weights[version].items()}
    wrong[Q][0, 0] += 1.0
    wrong[Q][-1, 0] += 1.0
    order = [s.name for s in target.tensors]
    header, blob, _ = encode_delta(base, [run.weights[version - 1][n] for n in order], target,
                                   [wrong[n] for n in order])
    run.client.publish(MODEL, version, {HEADER: torch.frombuffer(bytearray(header.to_bytes()), dtype=torch.uint8),
                                        BLOB: blob}, layout=delta_layout("hf", version - 1))


def test_a_tp2_engine_applies_deltas_to_its_slices_and_serves_what_a_full_read_gives(hub, tiny_models):
    client = th.connect(hub.url, worker="tp-dtrainer", location=loc("trainer"), chunk_bytes=CHUNK)
    run = Run(tiny_models["qwen2"], client)
    run.step(1)
    try:
        # rot_weight reaches the ranks as a pickled function (a test-only hook; the engine's own calls are not)
        with tp2(hub, tiny_models, "tp-d1", VLLM_ALLOW_INSECURE_SERIALIZATION="1") as t1:
            first = t1.update(1)
            assert first["delta_ranks"] == 0 and outputs(t1) == run.refs[1]

            published = run.step(2)
            res = t1.update(2)
            assert res["source_layouts"] == ["hf", "hf"] and res["delta_ranks"] == 2, res
            assert res["delta_fallbacks"] == 0 and res["delta_bytes"] == 2 * published.bytes, res
            # Beside the delta each rank reads in full only the chunks whose slices split digest blocks (the
            # vocabulary, padded per rank): far less than the version.
            assert res["bytes"] == res["delta_bytes"] + res["delta_full_bytes"] < run.manifests[2].nbytes, res
            assert outputs(t1) == run.refs[2]
            for r in range(2):
                assert f"tp-d1/rank{r}" in client.versions(MODEL, layout=delta_layout("hf", 1))[2]

            run.step(3, delta=False)
            wrong_delta(run, 3)
            res = t1.update(3)
            assert res["delta_ranks"] == 2 and res["delta_fallbacks"] >= 2, res
            assert any("does not give version 3" in r for r in res["delta_reasons"]), res["delta_reasons"]
            assert outputs(t1) == run.refs[3]

            t1.request("rot_weight", name="model.layers.0.self_attn.qkv_proj.weight")  # each rank's q rows
            run.step(4)
            res = t1.update(4)
            assert res["delta_ranks"] == 2 and res["delta_fallbacks"] >= 2, res
            assert any("base" in r for r in res["delta_reasons"]), res["delta_reasons"]
            assert outputs(t1) == run.refs[4]
            applied = t1.rpc("th_param_digests")
        with tp2(hub, tiny_models, "tp-d2", **{SOURCE_LAYOUT_ENV: "hf"}) as t2:
            full = t2.update(4)
            assert full["delta_ranks"] == 0 and set(full["sources"]) == {"tp-dtrainer"}, full
            assert outputs(t2) == run.refs[4]
            assert t2.rpc("th_param_digests") == applied  # rank by rank, parameter by parameter
    finally:
        client.close()
