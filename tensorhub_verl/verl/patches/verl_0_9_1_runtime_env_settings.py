"""verl 0.9.1: the job's runtime environment carries the driver's TensorHub settings to every node.

Why: ``trainer/main_ppo.py`` ``run_ppo`` builds ``ray.init``'s runtime environment from
``constants_ppo.get_ppo_ray_runtime_env(config)`` (its default variables, minus those the launching shell already
sets, which on one host reach the workers through the local raylet). On a cluster the workers on other hosts
inherit their own raylet's environment, so ``TENSORHUB_*`` (token, hub URL file, what the presets'
``${oc.env:...}`` read) and ``VERL_FILE_LOGGER_PATH`` set in the driver's shell never reach them. The replacement
adds ``runtime_env.job_settings()`` (every node's labels stay the node's own) and the job's
``tensorhub.trainer_placement`` / ``rollout_placement`` (``pool_placement.placement_env``), read where verl
creates its resource pools.

Guard: only when the config passed in selects ``tensorhub``; other jobs get verl's runtime environment unchanged.
``main_ppo`` binds the function by name at import: the patch applies when ``constants_ppo`` is first imported,
before ``main_ppo`` reads it (``on_import``).
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.guards import job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.constants_ppo"


def describe() -> str:
    return "get_ppo_ray_runtime_env forwards the driver's TENSORHUB_* settings to every node in tensorhub jobs"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def get_ppo_ray_runtime_env(config=None):
            runtime_env = original(config)
            if not job_uses_tensorhub(config):
                return runtime_env
            from tensorhub_verl.verl.pool_placement import placement_env
            from tensorhub_verl.verl.runtime_env import with_job_settings
            from tensorhub_verl.verl.trainer_modes import config_value

            runtime_env = with_job_settings(runtime_env)
            env_vars = {**placement_env(config_value(config, "tensorhub")), **runtime_env["env_vars"]}
            return {**runtime_env, "env_vars": env_vars}

        return get_ppo_ray_runtime_env

    return replace_once(module, "get_ppo_ray_runtime_env", wrap)
