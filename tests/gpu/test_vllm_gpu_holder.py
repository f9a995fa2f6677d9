"""A vLLM GPU engine in bf16 as a holder: updated in place through TensorHub, its greedy tokens equal those of a
second engine that loaded the same weights through vLLM's own loader; then real sleep mode (the CuMem allocator)
at levels 1 and 2, with the engine's layout read back from it by this process into CUDA buffers."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import needs_cuda, needs_engines

needs_engines("vllm", "transformers")

import tensorhub_verl as th  # noqa: E402
from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec  # noqa: E402
from tensorhub_dev.testing.layout_oracle import hf_to_vllm  # noqa: E402
from tensorhub_verl.vllm.layout import layout_name  # noqa: E402
from tensorhub_verl.vllm.results import HolderStatus  # noqa: E402
from tests.vllm.toy_run import N_NEW, PROMPTS, ToyRun  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.engine, pytest.mark.vllm, needs_cuda, pytest.mark.timeout(900)]

LAYOUT = layout_name("qwen2", 1, 0)
GPU_ENGINE = {"dtype": "bfloat16", "gpu_memory_utilization": 0.25, "enable_sleep_mode": True}


class Bf16Publisher:
    """The trainer's client publishing in the rollout's dtype, as ``tensorhub.rollout_dtype`` makes verl's do."""

    def __init__(self, client):
        self.client = client

    def publish(self, model, version, tensors):
        self.client.publish(model, version, {n: t.to(torch.bfloat16) for n, t in tensors.items()})


@pytest.fixture(scope="module")
def trainer(hub):
    c = th.connect(hub.url, worker="trainer", location={"node": "trainer"})
    yield c
    c.close()


@pytest.fixture(scope="module")
def run(tiny_models, trainer):
    r = ToyRun(tiny_models["qwen2"], Bf16Publisher(trainer))
    r.step_and_publish(1)
    return r


@pytest.fixture(scope="module")
def engine(hub, tiny_models, run):
    with EngineProcess(EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="gpu-engine",
                                  location={"node": "n1"}, staging="cpu", engine_args=GPU_ENGINE)) as e:
        yield e


@pytest.fixture(scope="module")
def reference(hub, tiny_models, run):
    """An engine that never talks to the hub's data plane for weights: vLLM's loader reads files."""
    with EngineProcess(EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker="gpu-reference",
                                  location={"node": "n2"}, load_format="auto", engine_args=GPU_ENGINE)) as e:
        yield e


def outputs(engine) -> list[list[int]]:
    return [engine.generate(p, N_NEW) for p in PROMPTS]


def load_reference(reference, run, version: int, tmp_path) -> list[list[int]]:
    from safetensors.torch import save_file

    path = tmp_path / f"v{version}.safetensors"
    save_file({n: t.to(torch.bfloat16).contiguous() for n, t in run.weights[version].items()}, str(path))
    assert reference.request("load_checkpoint", 120, path=str(path))[0] > 0
    return outputs(reference)


def read_back(hub, run, shape, version: int) -> None:
    """This process reads the engine's layout from the engine into CUDA buffers; the bytes are the version's."""
    with th.connect(hub.url, worker="gpu-reader", location={"node": "n3"}) as reader:
        bufs = reader.manifest("policy", version, layout=LAYOUT).allocate("cuda")
        stats = reader.fetch("policy", version, into=bufs, layout=LAYOUT, hold=False, timeout=120)
    assert set(stats.sources) == {"gpu-engine"}, stats.sources
    expected = hf_to_vllm({n: t.to(torch.bfloat16) for n, t in run.weights[version].items()}, shape)
    bad = [n for n, t in bufs.items() if not torch.equal(t.cpu(), expected[n])]
    assert not bad, f"{bad[:3]} differ from v{version}"


def test_bf16_engine_updated_in_place_matches_vllms_own_loader(engine, reference, run, tmp_path, hub, shape):
    res = engine.update(1)
    assert res["version"] == 1 and set(res["sources"]) == {"trainer"}
    status = HolderStatus.from_wire(engine.rpc("th_status")[0])
    assert status.served == 1 and status.pinned_staging is True
    assert outputs(engine) == load_reference(reference, run, 1, tmp_path)
    run.step_and_publish(2)
    res = engine.request("update_while_generating", 300, version="latest", prompt_ids=PROMPTS[0], max_tokens=4)
    assert res["version"] == 2
    ref2 = load_reference(reference, run, 2, tmp_path)
    assert outputs(engine) == ref2
    read_back(hub, run, shape, 2)


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_and_wake_with_the_cumem_allocator(engine, reference, run, tmp_path, hub, shape, trainer, level):
    assert engine.request("served_version", 30) == 2
    engine.request("sleep", 120, level=level)
    assert "gpu-engine" not in trainer.versions("policy", layout=LAYOUT).get(2, [])
    engine.request("wake_up", 300)
    assert engine.request("served_version", 30) == 2
    assert "gpu-engine" in trainer.versions("policy", layout=LAYOUT)[2]
    read_back(hub, run, shape, 2)
    assert outputs(engine) == load_reference(reference, run, 2, tmp_path)
