"""verl's own trainer with LoRA (``actor_rollout_ref.model.lora_rank>0``) through TensorHub, on CPU.

FSDP2 over gloo trains a peft adapter on the tiny model; two vLLM CPU replicas (``enable_lora``, set by verl's
server) get the base once and then, every step, only the adapter (``tensorhub_verl.verl.lora``).
"""

from __future__ import annotations

import math

import pytest

from tensorhub_dev.demo.grpo import run
from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tests.requires import require

require("vllm", reason="the rollout replicas are vLLM engines (CPU build)")
require("peft", reason="verl trains LoRA through peft")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
        # A large step, so that the adapter changes what the model says within a few steps: a rollout that
        # missed it would sample from other probabilities than the trainer's.
        "actor_rollout_ref.actor.optim.lr=2e-2")
ON_POLICY_GAP = 0.003
"""Largest |p_rollout - p_trainer| on an on-policy step. Far below what replicas serving the base without the
job's adapter give, far above float32 vLLM vs eager HF (both measured in docs/lora.md)."""


def starting_adapter(model_dir: str, out_dir) -> str:
    """A rank-8 adapter with random (not zero) B, saved as peft does: the job starts from it
    (``model.lora_adapter_path``), so its first version already changes what the model says."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tensorhub_verl.bench.tiny_model import load_hf_model

    model = get_peft_model(load_hf_model(model_dir), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                                lora_dropout=0.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(str(out_dir))
    return str(out_dir)


@pytest.mark.slow  # ~4.5 min
def test_lora_moves_the_base_once_then_only_the_adapter(tmp_path):
    """Short versions in the default suite: real vLLM engines taking the base once and then only the adapter
    (tests/vllm/test_lora.py), verl's adapter publisher over a real hub (tests/verl/test_lora_publish_on_cpu.py)."""
    task = build_task(tmp_path / "task")
    adapter_dir = starting_adapter(task.model_dir, tmp_path / "adapter")
    job = TinyJob(task=task, out_dir=tmp_path, steps=3, replicas=2,
                  extra=(*LORA, f"actor_rollout_ref.model.lora_adapter_path={adapter_dir}"))
    result = run(job, quiet=True, timeout_s=800)
    metrics = read_metrics(job.metrics_file)
    assert result["demo"] == "ok" and [step for step, _ in metrics] == [1, 2, 3]
    on_policy = 0
    for step, m in metrics:
        print(f"step {step}: " + ", ".join(f"{k}={m[k]}" for k in sorted(m) if k.startswith("tensorhub/")
                                           or k == "training/rollout_probs_diff_max"))
        assert m["tensorhub/version"] == step and m["tensorhub/replicas_updated"] == 2
        adapter = m["tensorhub/adapter_bytes"]
        assert 0 < adapter < 1e6  # rank 8 on the tiny model: about a hundred kB
        # The base moved once, at verl's initial sync (version 0, before step 1); every step moves only the
        # adapter: each replica read exactly its bytes, the second one partly from the first.
        assert m["tensorhub/bytes"] == 2 * adapter
        assert m["tensorhub/publish_bytes"] == adapter
        assert math.isfinite(m["critic/score/mean"])
        if m.get("training/off_policy/trajectory_staleness/max") == 0:
            on_policy += 1
            # vLLM started from dummy weights; the job's adapter is not zero from its first version on: the
            # rollouts' log-probs equal the trainer's (base + adapter) only if both arrived.
            assert m["training/rollout_probs_diff_max"] < ON_POLICY_GAP
    assert on_policy >= 1
