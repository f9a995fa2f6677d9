"""Fixtures for tests/vllm (and tests/gpu): tiny random Llama and Qwen2 models built offline (nothing downloaded),
a hub per module, the trainer's client and its toy run on the tiny Qwen2 (v1 published)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LOCATION_TRAINER = {"dc": "dc0", "rack": "r0", "node": "trainer"}


def loc(node: str) -> dict[str, str]:
    """A location in the tests' one data center and rack."""
    return {"dc": "dc0", "rack": "r0", "node": node}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """{'llama': dir, 'qwen2': dir}: 2 layers, hidden 128, float32 safetensors, a 300-token byte-level BPE
    (300 is not a multiple of 64, so vLLM pads the vocab: the mapping's padding path is exercised)."""
    from tensorhub_verl.bench.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: str(build_tiny_model(root / arch, arch=arch, bpe_vocab=300, seed=1)) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def hub():
    import tensorhub_verl as th

    h = th.start_hub(host="127.0.0.1", port=0)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def trainer(hub):
    """The trainer's client (worker ``trainer``), one per module like its hub."""
    import tensorhub_verl as th

    c = th.connect(hub.url, worker="trainer", location=loc("trainer"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def run(tiny_models, trainer):
    """The trainer's toy run on the tiny Qwen2, v1 published in the ``hf`` layout."""
    from tests.vllm.toy_run import ToyRun

    r = ToyRun(tiny_models["qwen2"], trainer)
    r.step_and_publish(1)
    return r


@pytest.fixture(scope="module")
def shape(tiny_models):
    """The tiny Qwen2's decoder shape (for mapping HF tensors to vLLM's layout)."""
    from transformers import AutoConfig

    from tensorhub_verl.vllm.layout import DecoderShape

    return DecoderShape.from_hf_config(AutoConfig.from_pretrained(tiny_models["qwen2"]))
