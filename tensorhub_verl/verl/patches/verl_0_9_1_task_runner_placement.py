"""verl 0.9.1: verl's task runner (the trainer's controller actor) goes where ``tensorhub.helper_placement`` says.

Why: ``trainer/main_ppo.py`` ``run_ppo`` creates ``TaskRunner`` with ``task_runner_class.remote()`` and no
placement, so on a cluster Ray may put it on any node (a rollout host, across the WAN from the trainer it
drives). The replacement hands ``run_ppo`` the class with the placement's actor options
(``pool_placement.helper_actor_options``: a Ray label selector or a sliver of a custom resource).

Guard: only when the config passed in selects ``tensorhub`` and sets ``helper_placement`` other than 'any'; every
other job gets verl's call unchanged. fully_async's own entry point is not covered.
"""

from __future__ import annotations

import functools

from tensorhub_verl.verl.patches.guards import job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.trainer.main_ppo"


def describe() -> str:
    return "run_ppo places verl's task runner by tensorhub.helper_placement"


class PlacedActorClass:
    """An actor class whose ``remote()`` and ``options()`` carry placement ``options`` (later options win)."""

    def __init__(self, actor_class, options: dict) -> None:
        self._class, self._options = actor_class, options

    def remote(self, *args, **kwargs):
        return self._class.options(**self._options).remote(*args, **kwargs)

    def options(self, **options):
        return self._class.options(**{**self._options, **options})


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def run_ppo(config, task_runner_class, *args, **kwargs):
            if job_uses_tensorhub(config):
                from tensorhub_verl.verl.pool_placement import ENV, helper_actor_options, placement_env
                from tensorhub_verl.verl.trainer_modes import config_value

                text = placement_env(config_value(config, "tensorhub")).get(ENV["helper"])
                options = helper_actor_options(text)
                if options:
                    task_runner_class = PlacedActorClass(task_runner_class, options)
            return original(config, task_runner_class, *args, **kwargs)

        return run_ppo

    return replace_once(module, "run_ppo", wrap)
