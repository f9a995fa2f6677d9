"""``python -m tensorhub_verl.verl.main_ppo ARGS``: verl's ``main_ppo`` with the same arguments, imported as a module.

Why: ``python -m verl.trainer.main_ppo`` runs verl's module as ``__main__``, which the package's import-time patches
never see, so ``tensorhub.helper_placement`` (the task runner's placement, patch
``verl_0_9_1_task_runner_placement``) cannot reach it. Every other patch targets modules verl imports normally.
"""

from verl.trainer import main_ppo

if __name__ == "__main__":
    main_ppo.main()
