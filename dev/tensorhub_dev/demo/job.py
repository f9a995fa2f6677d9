"""The command line and environment of a tiny verl job on CPU (GRPO, or PPO with a critic), with TensorHub
weight transfer.

One home for what the demo, its tests and ``recipes/*_tiny_cpu*.sh`` run: verl's own trainer
(``python -m verl.trainer.main_ppo``, v1 ``separate_async``; or verl's fully async policy),
``+tensorhub=<mode>``, and a Hydra preset of the CPU harness in ``dev/tensorhub_dev/verl_cpu/conf/tensorhub_cpu/``
(``tiny_grpo``, ``tiny_ppo``, ``tiny_grpo_fully_async``) for everything that makes it fit a 2-core machine with no
GPU.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.demo.task import TaskFiles
from tensorhub_dev.verl_cpu import with_plugin
from tensorhub_dev.verl_cpu.hydra_searchpath import conf_dir as cpu_conf_dir
from tensorhub_verl.verl.hydra_searchpath import conf_dir
from tensorhub_verl.settings import PLATFORM_ENV, PLATFORM_NAME

TRAINER_MODES = ("separate_async", "fully_async")
_ENTRY_POINTS = {"separate_async": "tensorhub_verl.verl.main_ppo",  # verl's main_ppo, as a module (patches reach it)
                 "fully_async": "verl.experimental.fully_async_policy.fully_async_main"}
PROMPTS_PER_STEP = 8
"""data.train_batch_size of the preset: prompts per training step."""

PRESETS = {("grpo", "separate_async"): "tiny_grpo", ("grpo", "fully_async"): "tiny_grpo_fully_async",
           ("ppo", "separate_async"): "tiny_ppo"}
"""The Hydra preset (``dev/tensorhub_dev/verl_cpu/conf/tensorhub_cpu/<name>.yaml``) of each (algorithm, trainer
mode)."""
ALGORITHMS = ("grpo", "ppo")


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyJob:
    """One run of the tiny job."""

    task: TaskFiles
    out_dir: Path
    steps: int = 20
    replicas: int = 2
    """Rollout replicas inside the verl job (vLLM, TP=1 each)."""
    mode: str = "standalone"
    """The TensorHub Hydra group: standalone | elastic | cross_dc."""
    trainer_mode: str = "separate_async"
    algorithm: str = "grpo"
    """grpo, or ppo (with a critic: GAE advantages)."""
    trainer_ranks: int = 1
    """FSDP2 ranks of the trainer (gloo)."""
    extra: tuple[str, ...] = field(default_factory=tuple)
    """More Hydra overrides, appended last."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.replicas < 1 or self.trainer_ranks < 1:
            raise ConfigError(f"steps, replicas and trainer_ranks must be >= 1, got {self.steps}, {self.replicas}, "
                              f"{self.trainer_ranks}")
        if self.trainer_mode not in TRAINER_MODES:
            raise ConfigError(f"trainer_mode must be one of {TRAINER_MODES}, got {self.trainer_mode!r}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if (self.algorithm, self.trainer_mode) not in PRESETS:
            raise ConfigError(f"no CPU preset for {self.algorithm} with trainer_mode={self.trainer_mode}; "
                              f"there are: {', '.join(f'{a} with {m}' for a, m in PRESETS)}")

    @property
    def preset(self) -> str:
        return PRESETS[(self.algorithm, self.trainer_mode)]

    @property
    def metrics_file(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    @property
    def hub_url_file(self) -> Path:
        return self.out_dir / "hub_url"

    @property
    def log_file(self) -> Path:
        return self.out_dir / "verl.log"

    def overrides(self) -> list[str]:
        slots = self.trainer_ranks + self.replicas + 1
        return [
            # verl's configs first (fully_async's own config finds ppo_trainer there), then the product's modes,
            # then the CPU harness's presets: named here, the job needs neither Hydra plugin installed.
            f"hydra.searchpath=[pkg://verl.trainer.config,file://{conf_dir()},file://{cpu_conf_dir()}]",
            f"+tensorhub={self.mode}",
            f"+tensorhub_cpu={self.preset}",
            f"actor_rollout_ref.model.path={self.task.model_dir}",
            f"data.train_files=['{self.task.train_file}']",
            f"data.val_files=['{self.task.val_file}']",
            f"reward.custom_reward_function.path={self.task.reward_file}",
            f"trainer.total_training_steps={self.steps}",
            f"trainer.n_gpus_per_node={self.trainer_ranks}",
            f"trainer.default_local_dir={self.out_dir / 'checkpoints'}",
            f"actor_rollout_ref.rollout.n_gpus_per_node={self.replicas}",
            f"ray_kwargs.ray_init.num_gpus={slots}",
            f"tensorhub.hub_url_file={self.hub_url_file}",
            f"hydra.run.dir={self.out_dir / 'hydra'}",  # not ./outputs of whatever directory it runs in
            # fully_async counts its run in prompts, not trainer steps
            *((f"rollout.total_rollout_steps={self.steps * PROMPTS_PER_STEP}",)
              if self.trainer_mode == "fully_async" else ()),
            *self.extra,
        ]

    def command(self) -> list[str]:
        return [sys.executable, "-m", _ENTRY_POINTS[self.trainer_mode], *self.overrides()]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env = with_plugin(env)  # the CPU harness (tensorhub_dev.verl_cpu), whether or not dev/ is installed
        env.update({
            PLATFORM_ENV: PLATFORM_NAME,                     # verl on the CPU harness's platform
            "VERL_FILE_LOGGER_PATH": str(self.metrics_file),  # verl's "file" logger: one JSON line per step
            "HF_HUB_OFFLINE": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_DEDUP_LOGS": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "HYDRA_FULL_ERROR": "1",
        })
        # A Ray cluster of its own, even where another (a test session's) already runs on this host.
        env.setdefault("RAY_ADDRESS", "local")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # vLLM's CPU workers otherwise all pin themselves (and our serving threads) to the first core.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return env


__all__ = ["ALGORITHMS", "PRESETS", "TRAINER_MODES", "TinyJob"]
