"""``tensorhub bench pause-copy`` on a small model: both comparisons run end to end and show what they measure
(real hub, real clients and data plane, EngineHolders over plain tensors: no vLLM)."""

from __future__ import annotations

import pytest

from tensorhub_dev.bench.pause_copy import measure

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(180)]


def test_pause_copy_and_dtype_comparisons():
    out = measure(layers=1, vocab=1000, steps=3, ranks=2, replicas=2)
    pause = out["pause_copy"]
    # A complete, reliable trainer shard group: no replica copies the old version in its pause.
    assert all(step["preserved_bytes"] == 0 for step in pause["reliable_trainer"]["steps"])
    # Spot ranks are no reliable copy: the last replica to drop each old version copies it, once (in 'hf' or in
    # the engine's layout, whose vocabulary rows are padded), in bf16.
    bf16_bytes = out["model_fp32_bytes"] // 2
    preserved = [s["preserved_bytes"] for s in pause["spot_trainer"]["steps"][1:]]
    assert len(preserved) == 2 and all(bf16_bytes <= p <= 1.01 * bf16_bytes for p in preserved), preserved
    dtype = out["dtype"]
    # Published in the engines' bf16: what leaves the trainer per version is half the fp32 version.
    assert dtype["bf16_published"]["bytes_from_trainer_per_step"] == bf16_bytes
    assert dtype["fp32_published_staged"]["bytes_from_trainer_per_step"] == out["model_fp32_bytes"]
