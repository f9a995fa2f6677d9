"""Settings a verl job must have on the CPU platform, checked before any worker starts.

Each of these fails late and obscurely on CPU otherwise (bf16 vLLM dies with "Illegal instruction" in CPU
attention, sleep mode is refused by vLLM's CPU build, remove-padding needs flash-attn's kernels, ...). The
Hydra preset ``+tensorhub_cpu=tiny_grpo`` sets all of them.
"""

from __future__ import annotations

from typing import Any

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl.trainer_modes import config_value

REQUIRED_ON_CPU: tuple[tuple[str, Any, str], ...] = (
    ("actor_rollout_ref.rollout.dtype", "float32", "vLLM's CPU build runs float32 only"),
    ("actor_rollout_ref.rollout.enable_sleep_mode", False, "vLLM's CPU build refuses sleep mode"),
    ("actor_rollout_ref.rollout.free_cache_engine", False, "it needs sleep mode"),
    ("actor_rollout_ref.model.use_remove_padding", False, "it needs flash-attn's varlen kernels"),
    ("actor_rollout_ref.actor.use_torch_compile", False, "compiling the trainer costs minutes per step on CPU"),
)


def check_cpu_job(config: Any) -> None:
    """Raises ConfigError naming every setting that a CPU job needs and ``config`` lacks."""
    wrong = []
    for key, wanted, why in REQUIRED_ON_CPU:
        value = config_value(config, key, default=None)
        if value is not None and value != wanted:
            wrong.append(f"{key}={wanted} (is {value}: {why})")
    attn = config_value(config, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
    if attn not in (None, "eager", "sdpa"):
        wrong.append(f"+actor_rollout_ref.model.override_config.attn_implementation=eager (is {attn})")
    elif attn is None:
        wrong.append("+actor_rollout_ref.model.override_config.attn_implementation=eager (verl defaults to "
                     "flash_attention_2, which does not run on CPU)")
    if wrong:
        raise ConfigError("VERL_PLATFORM=cpu: this job needs " + "; ".join(wrong)
                          + ". The preset +tensorhub_cpu=tiny_grpo sets them all.")


__all__ = ["REQUIRED_ON_CPU", "check_cpu_job"]
