"""vLLM engines (CPU build, float32) updated through ROS: greedy output must equal HF transformers token for token.

One module, engines shared (each LLM() costs ~15-30 s on 2 cores):
  trainer (this process) publishes HF weights of a toy training run (v1, v2, ...)
  e1: vLLM + worker extension, dummy weights -> fetches v1 from the trainer's 'hf' layout via load_weights
  e2: vLLM + weight-transfer API backend 'tensorhub' -> fetches v1 raw from e1 (same layout), not the trainer
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import signal

import pytest

from tests.requires import require

require("vllm")

import tensorhub_verl as th
from tensorhub_verl.vllm.engine_proc import EngineError, EngineSpec, running_engines
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.vllm.layout import layout_name
from tensorhub_verl.bench.tiny_model import hf_state_dict, toy_training_step
from tests.vllm.conftest import loc
from tests.vllm.toy_run import N_NEW, PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

FAST_CLIENT = {"read_timeout_s": 5.0}


@pytest.fixture(scope="module")
def engines(hub, tiny_models, run):
    """e1 and e2, started together (neither reads a version before a test asks it to)."""
    with running_engines([
        EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="e1", location=loc("n1"),
                   client_config=FAST_CLIENT),
        EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="e2", location=loc("n2"),
                   api="weight_transfer", client_config=FAST_CLIENT)]) as pair:
        yield pair


@pytest.fixture(scope="module")
def e1(engines):
    return engines[0]


@pytest.fixture(scope="module")
def e2(engines):
    return engines[1]


def outputs(engine) -> list[list[int]]:
    return [engine.generate(p, N_NEW) for p in PROMPTS]


def test_fetch_from_trainer_matches_hf_greedy(e1, run, trainer, shape):
    dummy = outputs(e1)
    res = e1.update("latest")
    assert res["applied"] and res["version"] == 1
    assert res["source_layouts"] == ["hf"] and set(res["sources"]) == {"trainer"}
    assert outputs(e1) == run.refs[1] != dummy
    # the engine's live parameters equal our HF->vLLM mapping of the same weights (vLLM's own loader did it)
    expected = {n: float(t.double().sum()) for n, t in hf_to_vllm(run.weights[1], shape).items()}
    assert e1.rpc("th_param_checksum")[0] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    layout = layout_name("qwen2", 1, 0)
    assert "e1" in trainer.versions("policy", layout=layout)[1]


def test_second_engine_fetches_from_peer_not_trainer(e1, e2, run, trainer):
    res = e2.update(1)
    assert res["version"] == 1 and res["source_layout"] == layout_name("qwen2", 1, 0)
    assert set(res["sources"]) == {"e1"}, res["sources"]
    assert outputs(e2) == run.refs[1]
    assert set(trainer.versions("policy", layout=layout_name("qwen2", 1, 0))[1]) == {"e1", "e2"}


def test_new_version_replaces_old(e1, e2, run):
    run.step_and_publish(2)
    assert run.refs[2] != run.refs[1]
    res = e1.request("update_while_generating", 120, version="latest", prompt_ids=PROMPTS[0], max_tokens=4)
    assert res["version"] == 2 and res["stall_s"] < res["seconds"]
    assert outputs(e1) == run.refs[2]
    res2 = e2.update("latest")
    assert res2["version"] == 2 and set(res2["sources"]) <= {"e1", "trainer"}
    assert outputs(e2) == run.refs[2]


def _doomed_publisher(hub_url: str, weights: dict, ready) -> None:
    c = th.connect(hub_url, worker="trainer-doomed", location=loc("trainer2"))
    c.publish("policy", 3, weights)
    ready.set()
    signal.pause()


def test_failed_pull_keeps_serving_old_version(hub, e1, run):
    """v3's only holder dies before the engine pulls it: the update fails, the engine still serves v2."""
    new = copy.deepcopy(run.model)
    toy_training_step(new, run.tok, 3)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_doomed_publisher, args=(hub.url, hf_state_dict(new), ready))
    proc.start()
    try:
        assert ready.wait(120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        with pytest.raises(EngineError, match="TransferFailed|VersionNotFound"):
            e1.update(3, timeout=60)
        assert e1.request("served_version", 30) == 2
        assert outputs(e1) == run.refs[2]
    finally:
        if proc.is_alive():
            proc.kill()
