"""The verl versions the ``tensorhub`` backend supports, and its refusal of any other.

The backend moves weights through patched verl code (``patches/``: the manager's update sequence, the engines'
worker extension, the trainer's shards), each written against one verl version. On another version those patches
do not apply, and verl's own sequence would call the backend's ``receive_weights``, which cannot work: a job that
selects the backend there is refused at once, naming the supported version, instead of failing mid-step.
"""

from __future__ import annotations

import importlib

from tensorhub_verl.errors import ConfigError

WEIGHT_PATCHES = ("verl_0_9_1_manager_update_weights", "verl_0_9_1_engine_holders", "verl_0_9_1_trainer_shards")
"""The patches without which no weight moves: their common verl versions are the supported ones."""


def supported_verl_versions() -> tuple[str, ...]:
    versions = [set(importlib.import_module(f"tensorhub_verl.verl.patches.{name}").VERL_VERSIONS)
                for name in WEIGHT_PATCHES]
    return tuple(sorted(set.intersection(*versions)))


def require_supported_verl(installed: str | None = None) -> None:
    """Raises ``ConfigError`` unless ``installed`` (default: the installed verl's version) is supported."""
    if installed is None:
        import verl

        installed = verl.__version__
    supported = supported_verl_versions()
    if installed not in supported:
        raise ConfigError(f"the tensorhub checkpoint-engine backend supports verl {', '.join(supported)}; the "
                          f"installed verl is {installed}, where its weight-moving patches do not apply. Install "
                          f"verl=={supported[-1]} (pip install 'tensorhub_verl[verl]'), or choose another "
                          f"checkpoint_engine.backend for this verl")
