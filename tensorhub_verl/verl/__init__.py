"""TensorHub inside verl: a ``tensorhub`` checkpoint-engine backend, the rollout updater that uses it,
the hub's lifecycle in a verl job, and the metrics it reports to verl.

Importing this package is cheap and has no side effects; verl and Ray are imported only by the modules
that need them (``checkpoint_engine``, ``updater``, ``hub_actor``, ``patches``). The module verl loads
(``tensorhub_verl.verl.checkpoint_engine``, through the ``verl.plugins`` entry point or
``checkpoint_engine.custom_backend_module``) registers the backend and applies the verl patches.
"""

BACKEND_NAME = "tensorhub"
"""The value of ``actor_rollout_ref.rollout.checkpoint_engine.backend`` that selects TensorHub."""

PLUGIN_MODULE = "tensorhub_verl.verl.checkpoint_engine"
"""The module to put in ``checkpoint_engine.custom_backend_module`` (and the ``verl.plugins`` entry point)."""

__all__ = ["BACKEND_NAME", "PLUGIN_MODULE"]
