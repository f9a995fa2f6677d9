"""LoRA through ROS on real vLLM CPU engines: the base moves once, then only the adapter moves.

  trainer (this process): a peft LoRA model on the tiny qwen2; publishes the base once (policy v0, 'hf') and each
           step's adapter (policy.lora v1, v2 in peft names), and keeps HF's greedy tokens of base + adapter merged
  e1: vLLM with enable_lora: base v0 from the trainer, then each adapter version from the trainer
  e2: same; base and adapter read from e1 (the trainer has let its adapter copy go)
Each engine's greedy tokens with the adapter equal HF's on the merged model, and an adapter update reads exactly
the adapter's bytes.
"""

from __future__ import annotations

import copy

import pytest

from tests.requires import require

require("vllm")
require("peft")

from tensorhub_verl.vllm.engine_proc import EngineSpec, running_engines
from tensorhub_verl.bench.tiny_model import hf_greedy, hf_state_dict, load_hf_model, toy_training_step
from tensorhub_verl.vllm.layout import layout_name
from tensorhub_verl.vllm.lora import ADAPTER_LAYOUT, adapter_bytes, adapter_model, pack_adapter
from tests.vllm.conftest import loc
from tests.vllm.toy_run import N_NEW, PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

RANK = 8
FAST_CLIENT = {"read_timeout_s": 5.0}


class LoraRun:
    """A peft model trained by ``toy_training_step`` (only the adapter learns), each step's adapter published."""

    def __init__(self, model_dir: str, client):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.client = client
        base = load_hf_model(model_dir)
        self.base_weights = hf_state_dict(base)
        self.base_refs = [hf_greedy(base, p, N_NEW) for p in PROMPTS]
        self.peft = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear",
                                                    lora_dropout=0.0))
        self.refs: dict[int, list[list[int]]] = {}
        self.adapters: dict[int, dict] = {}

    def publish_base(self) -> None:
        self.client.publish("policy", 0, self.base_weights)

    def step_and_publish(self, version: int) -> None:
        from peft.utils.save_and_load import get_peft_model_state_dict

        toy_training_step(self.peft, self.tok, version, lr=0.05)
        tensors = {n: t.detach().clone() for n, t in get_peft_model_state_dict(self.peft).items()}
        self.adapters[version] = pack_adapter(tensors, self.peft.peft_config["default"], base_version=0)
        self.client.publish(adapter_model("policy"), version, self.adapters[version], layout=ADAPTER_LAYOUT)
        merged = copy.deepcopy(self.peft).merge_and_unload()
        self.refs[version] = [hf_greedy(merged, p, N_NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def run(tiny_models, trainer):
    r = LoraRun(tiny_models["qwen2"], trainer)
    r.publish_base()
    r.step_and_publish(1)
    return r


def spec(hub, tiny_models, worker: str, node: str) -> EngineSpec:
    return EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker=worker, location=loc(node),
                      client_config=FAST_CLIENT, lora_rank=RANK)


@pytest.fixture(scope="module")
def engines(hub, tiny_models, run):
    """e1 and e2, started together (neither reads a version before a test asks it to)."""
    with running_engines([spec(hub, tiny_models, "e1", "n1"), spec(hub, tiny_models, "e2", "n2")]) as pair:
        yield pair


@pytest.fixture(scope="module")
def e1(engines):
    return engines[0]


@pytest.fixture(scope="module")
def e2(engines):
    return engines[1]


def outputs(e, lora: bool = True) -> list[list[int]]:
    return [e.generate(p, N_NEW, lora=lora) for p in PROMPTS]


def test_base_once_then_adapter_matches_hf_merged(e1, run):
    base = e1.update(0)
    assert base["applied"] and set(base["sources"]) == {"trainer"}
    assert outputs(e1, lora=False) == run.base_refs
    res = e1.request("lora_update", 120, version="latest")[0]
    assert res.applied and res.version == 1 and set(res.sources) == {"trainer"}
    assert res.bytes == adapter_bytes(run.adapters[1])  # the adapter and nothing else
    assert run.refs[1] != run.base_refs  # the adapter changes what the model says
    assert outputs(e1) == run.refs[1]
    assert outputs(e1, lora=False) == run.base_refs  # the base parameters are untouched by the adapter


def test_second_engine_reads_base_and_adapter_from_peer(e1, e2, run, trainer):
    trainer.unpublish(adapter_model("policy"), 1, layout=ADAPTER_LAYOUT)  # only e1 holds adapter v1 now
    assert set(trainer.versions(adapter_model("policy"), layout=ADAPTER_LAYOUT)[1]) == {"e1"}
    base = e2.update(0)
    assert base["source_layouts"] == [layout_name("qwen2", 1, 0)] and set(base["sources"]) == {"e1"}
    res = e2.request("lora_update", 120, version=1)[0]
    assert set(res.sources) == {"e1"} and res.bytes == adapter_bytes(run.adapters[1])
    assert outputs(e2) == run.refs[1]


def test_next_version_moves_only_the_adapter(e1, e2, run, trainer):
    run.step_and_publish(2)
    assert run.refs[2] != run.refs[1]
    for e in (e1, e2):
        res = e.request("lora_update", 120, version=2)[0]
        assert res.version == 2 and res.bytes == adapter_bytes(run.adapters[2])
        assert outputs(e) == run.refs[2]
        assert e.update(0)["applied"] is False  # the base stays: nothing of it moves again
    assert sorted(trainer.versions("policy", layout="hf")) == [0]
    holders = trainer.versions(adapter_model("policy"), layout=ADAPTER_LAYOUT)
    assert {"e1", "e2"} <= set(holders[2]) and "e1" not in holders.get(1, [])
    for e in (e1, e2):  # each engine holds only the adapter it serves (the hub may keep a retained CPU copy)
        assert e.rpc("th_lora_status")[0] == {"model": "policy.lora", "served": 2, "held": [2]}


def test_adapter_the_engine_cannot_serve_is_refused_and_nothing_changes(e1, run, trainer):
    """An adapter of rank 16 on an engine started with max_lora_rank 8: a ConfigError naming both; the engine
    keeps serving (and holding) the adapter it had."""
    from peft import LoraConfig, get_peft_model

    wide = get_peft_model(load_hf_model(e1.spec.model_dir), LoraConfig(r=16, lora_alpha=32,
                                                                      target_modules="all-linear"))
    from peft.utils.save_and_load import get_peft_model_state_dict

    tensors = {n: t.detach().clone() for n, t in get_peft_model_state_dict(wide).items()}
    trainer.publish(adapter_model("policy"), 9, pack_adapter(tensors, wide.peft_config["default"], base_version=0),
                    layout=ADAPTER_LAYOUT)
    with pytest.raises(Exception, match="ConfigError.*rank 16 is greater than max_lora_rank 8"):
        e1.request("lora_update", 120, version=9)
    assert e1.rpc("th_lora_status")[0]["served"] == 2
    assert outputs(e1) == run.refs[2]
