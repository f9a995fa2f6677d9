"""TP=2 vLLM engines (CPU build, float32, each rank pinned to its own core) updated through ROS: greedy output
must equal HF transformers token for token after each of two versions.

  trainer (this process) publishes the HF weights of a toy training run (v1, v2)
  t1: TP=2, staging 'none' -> each rank reads only its slices of the trainer's 'hf' tensors, straight into its
      parameters; both ranks' layouts turn visible together (one shard group)
  t2: TP=2, staging 'cpu'  -> each rank reads its own layout raw from the same rank of t1, not the trainer
  Llama, another model on the same hub: a TP=1 and a TP=2 engine follow the same trainer versions
"""

from __future__ import annotations

import pytest

from tests.requires import require

require("vllm")

from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec
from tensorhub_verl.vllm.layout import layout_name
from tests.vllm.conftest import loc
from tests.vllm.test_engine import outputs
from tests.vllm.toy_run import ToyRun

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

LAYOUTS = [layout_name("qwen2", 2, r) for r in range(2)]
# vLLM's CPU build pins each rank's threads to its cores: one core per rank, or both ranks share core 0.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


LLAMA = "llama-policy"


def tp2_engine(hub, tiny_models, worker: str, staging: str, arch: str = "qwen2", model: str = "policy",
               tp: int = 2) -> EngineProcess:
    return EngineProcess(EngineSpec(model_dir=tiny_models[arch], hub_url=hub.url, worker=worker, tp_size=tp,
                                    model=model, location=loc(worker), staging=staging,
                                    env=dict(TP2_ENV) if tp > 1 else {},
                                    client_config={"read_timeout_s": 10.0}), start_timeout_s=600)


@pytest.fixture(scope="module")
def llama_run(tiny_models, trainer):
    r = ToyRun(tiny_models["llama"], trainer)
    r.step_and_publish(1, model=LLAMA)
    return r


def test_tp2_engines_from_trainer_slices_then_rank_to_rank(hub, tiny_models, run, trainer):
    model_bytes = sum(t.numel() * t.element_size() for t in run.weights[1].values())
    with tp2_engine(hub, tiny_models, "t1", "none") as t1:
        res = t1.update("latest")
        assert res["version"] == 1 and res["source_layouts"] == ["hf", "hf"] and set(res["sources"]) == {"trainer"}
        assert res["bytes"] < 1.3 * model_bytes, (res["bytes"], model_bytes)  # ~1 model for the engine, not 2
        assert outputs(t1) == run.refs[1]
        for r in range(2):
            assert trainer.versions("policy", layout=LAYOUTS[r])[1] == [f"t1/rank{r}"]
        with tp2_engine(hub, tiny_models, "t2", "cpu") as t2:
            res2 = t2.update(1)
            assert res2["source_layouts"] == LAYOUTS and set(res2["sources"]) == {"t1/rank0", "t1/rank1"}
            assert outputs(t2) == run.refs[1]
            run.step_and_publish(2)
            assert run.refs[2] != run.refs[1]
            assert t1.update("latest")["version"] == 2 and outputs(t1) == run.refs[2]
            res2 = t2.update("latest")
            assert res2["version"] == 2 and set(res2["sources"]) <= {"t1/rank0", "t1/rank1", "trainer"}
            assert outputs(t2) == run.refs[2]


def test_llama_tp1_and_tp2_engines_follow_the_same_trainer_versions(hub, tiny_models, llama_run, trainer):
    """The TP=1 engine (staging 'none') reads whole 'hf' tensors into its parameters, which then hold them;
    the TP=2 engine's ranks (staging 'cpu') read only their slices into a staging copy, from the trainer, the TP=1 engine's 'hf' holding (its shape differs, so never raw), or each other
    (a rank serves the whole chunks it has landed, e.g. of replicated tensors, while it is still reading)."""
    model_bytes = sum(t.numel() * t.element_size() for t in llama_run.weights[1].values())
    with tp2_engine(hub, tiny_models, "s1", "none", arch="llama", model=LLAMA, tp=1) as s1, \
            tp2_engine(hub, tiny_models, "w2", "cpu", arch="llama", model=LLAMA) as w2:
        for version in (1, 2):
            if version == 2:
                llama_run.step_and_publish(2, model=LLAMA)
                assert llama_run.refs[2] != llama_run.refs[1]
            res1 = s1.update("latest")
            assert res1["version"] == version and res1["source_layouts"] == ["hf"]
            assert set(res1["sources"]) <= {"trainer", "w2/rank0", "w2/rank1"}, res1["sources"]
            res2 = w2.update("latest")
            assert res2["version"] == version and res2["source_layouts"] == ["hf", "hf"]
            assert set(res2["sources"]) <= {"trainer", "s1", "w2/rank0", "w2/rank1"}, res2["sources"]
            # each rank reads its slices (half the projections, the replicated norms whole), not the model
            assert all(b < 0.8 * model_bytes for b in res2["rank_bytes"]), (res2["rank_bytes"], model_bytes)
            assert outputs(s1) == llama_run.refs[version]
            assert outputs(w2) == llama_run.refs[version]
        assert "s1" in trainer.versions(LLAMA, layout="hf")[2]
        assert trainer.versions(LLAMA, layout=layout_name("llama", 2, 1))[2] == ["w2/rank1"]
