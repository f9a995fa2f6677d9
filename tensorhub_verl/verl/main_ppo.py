"""``python -m tensorhub_verl.verl.main_ppo ARGS``: verl's ``main_ppo`` with the same arguments, imported as a module.

Why: ``python -m verl.trainer.main_ppo`` runs verl's module as ``__main__``, which the package's import-time patches
never see, so ``tensorhub.helper_placement`` (the task runner's placement, patch
``verl_0_9_1_task_runner_placement``) cannot reach it. This entry point is where that patch is asked for: it
applies it before verl's module is imported (it still acts only when the job sets ``helper_placement``). Every
other patch targets modules verl imports normally.
"""

from tensorhub_verl.verl.patches import ENTRY_MODULES, apply_patches

apply_patches(ENTRY_MODULES)

from verl.trainer import main_ppo  # noqa: E402  after the patch is registered

if __name__ == "__main__":
    main_ppo.main()
