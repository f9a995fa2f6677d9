"""Settings a verl job must have on the CPU platform, checked before any worker starts.

Each of these fails late and obscurely on CPU otherwise (bf16 vLLM dies with "Illegal instruction" in CPU
attention, sleep mode is refused by vLLM's CPU build, remove-padding needs flash-attn's kernels, ...). The
Hydra presets ``+tensorhub_cpu=tiny_grpo`` (and ``tiny_ppo``, ``tiny_grpo_fully_async``) set all of them.
``patches/verl_0_9_1_cpu_job_check`` runs the check when verl's trainer starts. A job with a critic (PPO: ``algorithm.adv_estimator=gae`` or ``critic.enable=True``) needs the same model
settings for the critic's model.
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


REQUIRED_ON_CPU_WITH_CRITIC: tuple[tuple[str, Any, str], ...] = (
    ("critic.model.use_remove_padding", False, "it needs flash-attn's varlen kernels"),
)
CPU_ATTENTION = ("eager", "sdpa")
"""Attention implementations that run on CPU (verl defaults to flash_attention_2)."""


def uses_critic(config: Any) -> bool:
    """Whether verl builds a critic for this job (verl 0.9.1 ``need_critic``: ``critic.enable``, else GAE)."""
    enable = config_value(config, "critic.enable", default=None)
    if enable is not None:
        return bool(enable)
    return config_value(config, "algorithm.adv_estimator", default=None) == "gae"


def _attention_fix(model_key: str, config: Any) -> str | None:
    attn = config_value(config, f"{model_key}.override_config.attn_implementation", default=None)
    if attn is None:
        return (f"+{model_key}.override_config.attn_implementation=eager (verl defaults to "
                f"flash_attention_2, which does not run on CPU)")
    if attn not in CPU_ATTENTION:
        return f"+{model_key}.override_config.attn_implementation=eager (is {attn})"
    return None


def check_cpu_job(config: Any) -> None:
    """Raises ConfigError naming every setting that a CPU job needs and ``config`` lacks."""
    required = REQUIRED_ON_CPU + (REQUIRED_ON_CPU_WITH_CRITIC if uses_critic(config) else ())
    wrong = []
    for key, wanted, why in required:
        value = config_value(config, key, default=None)
        if value is not None and value != wanted:
            wrong.append(f"{key}={wanted} (is {value}: {why})")
    models = ("actor_rollout_ref.model",) + (("critic.model",) if uses_critic(config) else ())
    wrong.extend(fix for fix in (_attention_fix(key, config) for key in models) if fix is not None)
    if wrong:
        preset = "tiny_ppo" if uses_critic(config) else "tiny_grpo"
        raise ConfigError("VERL_PLATFORM=cpu: this job needs " + "; ".join(wrong)
                          + f". The preset +tensorhub_cpu={preset} sets them all.")


__all__ = ["CPU_ATTENTION", "REQUIRED_ON_CPU", "REQUIRED_ON_CPU_WITH_CRITIC", "check_cpu_job", "uses_critic"]
