"""verl's own GRPO trainer on GPUs through ``+tensorhub``: 3 steps of the tiny job (``tensorhub_dev.demo``) with the
trainer on one GPU and a bf16 vLLM replica on another.

verl 0.9.1's trainer modes that use a checkpoint engine (``separate_async``, fully_async) place the trainer and the
rollout replicas in separate Ray resource pools, and verl's vLLM server pins its engine to the GPU id Ray assigned
(``CUDA_VISIBLE_DEVICES``): a one-GPU machine cannot host both pools, so this test needs two GPUs and says so. The
modes that colocate them on one GPU force verl's ``naive`` engine (``tensorhub_verl.verl.trainer_modes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.gpu.conftest import gpus, needs_cuda, needs_engines

needs_engines("verl", "vllm", "hydra", "ray", "transformers")

from tensorhub_dev.demo.grpo import run  # noqa: E402
from tensorhub_dev.demo.job import TinyJob  # noqa: E402
from tensorhub_dev.demo.progress import read_metrics  # noqa: E402
from tensorhub_dev.demo.task import build_task  # noqa: E402
from tensorhub_verl.settings import PLATFORM_ENV  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.engine, pytest.mark.verl, pytest.mark.vllm, needs_cuda, pytest.mark.timeout(900),
              pytest.mark.skipif(gpus() < 2, reason="verl 0.9.1 puts the trainer and the rollouts of a "
                                                    "checkpoint-engine mode on separate GPUs: needs 2")]

GPU_OVERRIDES = (
    "trainer.device=cuda",
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
    "tensorhub.verify_digests=true",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuJob(TinyJob):
    """The tiny job on verl's CUDA platform, Ray given the machine's real GPUs."""

    def overrides(self) -> list[str]:
        kept = [o for o in super().overrides() if not o.startswith("ray_kwargs.ray_init.num_gpus=")]
        return [*kept, f"ray_kwargs.ray_init.num_gpus={gpus()}"]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = super().environment(base)
        env.pop(PLATFORM_ENV, None)  # verl's CUDA platform, not tensorhub_verl's CPU one
        return env


def test_three_grpo_steps_on_gpus_through_tensorhub(tmp_path):
    task = build_task(tmp_path / "task")
    job = GpuJob(task=task, out_dir=tmp_path / "run", steps=3, replicas=1, extra=GPU_OVERRIDES)
    result = run(job, quiet=True, timeout_s=800)
    assert result["demo"] == "ok"
    metrics = read_metrics(job.metrics_file)
    assert [step for step, _ in metrics] == [1, 2, 3]
    # The replica's pulled bytes have the digest of what the trainer published, every step.
    assert all(m["tensorhub/digests_checked"] == 1 and m["tensorhub/digest_mismatches"] == 0 for _, m in metrics)
