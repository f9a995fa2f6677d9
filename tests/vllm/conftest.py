"""Fixtures for tests/vllm: tiny random Llama and Qwen2 models built offline (nothing downloaded)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LOCATION_TRAINER = {"dc": "dc0", "rack": "r0", "node": "trainer"}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """{'llama': dir, 'qwen2': dir}: 2 layers, hidden 128, float32 safetensors, a 300-token byte-level BPE
    (300 is not a multiple of 64, so vLLM pads the vocab: the mapping's padding path is exercised)."""
    from tensorhub_verl.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: str(build_tiny_model(root / arch, arch=arch, bpe_vocab=300, seed=1)) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def hub():
    import tensorhub_verl as th

    h = th.start_hub(host="127.0.0.1", port=0)
    yield h
    h.stop()
