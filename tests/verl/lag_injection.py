"""A replica delayed on purpose inside a real verl job: Ray's ``worker_process_setup_hook`` for the job's processes.

The job's updater (``TensorHubUpdater``, in verl's trainer actor) is the only thing changed: while it rolls out the
versions named here, the named replica applies nothing (it drops what it staged and its apply is reported as
failed, as a replica that cannot apply in time; its engine keeps serving the version it has). The updater's own
rules decide what follows (``min_replica_fraction``, ``max_version_lag``, the fleet flip's catch-up). Everything
else (verl's loop, the vLLM engines, the hub, the transfers) runs for real. Selected with
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=<one of the hooks below>``.
"""

from __future__ import annotations

import contextvars

_rolling: contextvars.ContextVar[int | None] = contextvars.ContextVar("lag_injection_rolling", default=None)


def _install(replica: int, missed: frozenset[int]) -> None:
    """While the updater rolls out a version in ``missed``, ``replica`` applies nothing (idempotent)."""
    import asyncio

    from tensorhub_verl.errors import TransferFailed
    from tensorhub_verl.verl.updater import TensorHubUpdater

    if getattr(TensorHubUpdater, "_lag_injected", False):
        return
    update_weights, apply_staged = TensorHubUpdater.update_weights, TensorHubUpdater._apply_staged

    async def update_weights_rolling(self, global_steps=None):
        token = _rolling.set(global_steps)
        try:
            return await update_weights(self, global_steps)
        finally:
            _rolling.reset(token)

    async def _apply_staged(self, replica_obj, staged, outcome, published_digests):
        if replica_obj.replica_rank == replica and _rolling.get() in missed:
            await asyncio.to_thread(staged.updater.call, "th_abort")
            raise TransferFailed(f"replica {replica} delayed on purpose while v{_rolling.get()} rolls out: "
                                 f"v{staged.version} not applied")
        return await apply_staged(self, replica_obj, staged, outcome, published_digests)

    TensorHubUpdater.update_weights = update_weights_rolling
    TensorHubUpdater._apply_staged = _apply_staged
    TensorHubUpdater._lag_injected = True


LAGGING = 1
"""``replica_1_misses_2_and_3``: replica 1 applies nothing while versions 2 and 3 roll out (two behind at 3)."""
STRAGGLER = 2
"""``replica_2_misses_2``: replica 2 applies nothing while version 2 rolls out (one behind, then a catch-up)."""


def replica_1_misses_2_and_3() -> None:
    _install(LAGGING, frozenset({2, 3}))


def replica_2_misses_2() -> None:
    _install(STRAGGLER, frozenset({2}))


def hook(name: str) -> str:
    """The ``worker_process_setup_hook`` value of one of the hooks above."""
    return f"{__name__}.{name}"


__all__ = ["LAGGING", "STRAGGLER", "hook", "replica_1_misses_2_and_3", "replica_2_misses_2"]
