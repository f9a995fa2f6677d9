"""verl 0.9.1 on the CPU platform: a job missing a setting the CPU needs is refused before any worker starts.

Why: each of these settings (``job_check``) fails late and obscurely on CPU otherwise (bf16 vLLM dies with "Illegal
instruction", vLLM's CPU build refuses sleep mode, remove-padding needs flash-attn). ``PPOTrainer.__init__`` runs
``check_cpu_job`` on the job's config first, raising ``ConfigError`` with every fix named.
"""

from __future__ import annotations

import functools

from tensorhub_dev.verl_cpu.patches import CPU_MARK
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.ppo.v1.trainer_base"


def describe() -> str:
    return "PPOTrainer refuses a CPU job that misses a setting the CPU platform needs"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def __init__(self, config, *args, **kwargs):
            from tensorhub_dev.verl_cpu.job_check import check_cpu_job

            check_cpu_job(config)
            original(self, config, *args, **kwargs)

        return __init__

    return replace_once(module.PPOTrainer, "__init__", wrap, mark=CPU_MARK)
