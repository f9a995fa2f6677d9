"""A replica delayed on purpose inside a real verl job: Ray's ``worker_process_setup_hook`` for the job's processes.

The job's updater (``TensorHubUpdater``, in verl's trainer actor) is the only thing changed: while it rolls out the
versions named here, the named replica applies nothing (it drops what it staged and its apply is reported as
failed, as a replica that cannot apply in time; its engine keeps serving the version it has), or starts its pull
only once a peer holds the version in the engines' layout (it then reads it raw from that peer). The updater's own
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


def _install_after_peer(first: int, then: int, version: int) -> None:
    """While the updater rolls out ``version``, replica ``then`` starts its pull only once replica ``first`` applied
    it and holds it in its engine's layout: ``then`` reads it raw from ``first`` (idempotent)."""
    import asyncio

    from tensorhub_verl.verl.updater import TensorHubUpdater

    if getattr(TensorHubUpdater, "_peer_order_injected", False):
        return
    update_replica = TensorHubUpdater._update_replica
    applied: dict[int, asyncio.Event] = {}

    async def _update_replica(self, replica_obj, v, published_digests=None):
        event = applied.setdefault(id(self), asyncio.Event())
        if v == version and replica_obj.replica_rank == then:
            await asyncio.wait_for(event.wait(), self.config.apply_timeout_s)
        outcome = await update_replica(self, replica_obj, v, published_digests)
        if v == version and replica_obj.replica_rank == first:
            await asyncio.to_thread(self._engines(replica_obj).rpc, "th_wait_published", {"timeout_s": 60.0},
                                    self.config.apply_timeout_s)
            event.set()
        return outcome

    TensorHubUpdater._update_replica = _update_replica
    TensorHubUpdater._peer_order_injected = True


LAGGING = 1
"""``replica_1_misses_2_and_3``: replica 1 applies nothing while versions 2 and 3 roll out (two behind at 3)."""
STRAGGLER = 2
"""``replica_2_misses_2``: replica 2 applies nothing while version 2 rolls out (one behind, then a catch-up)."""


def replica_1_misses_2_and_3() -> None:
    _install(LAGGING, frozenset({2, 3}))


def replica_2_misses_2() -> None:
    _install(STRAGGLER, frozenset({2}))


def replica_1_reads_v0_raw_from_replica_0() -> None:
    _install_after_peer(0, 1, 0)


def hook(name: str) -> str:
    """The ``worker_process_setup_hook`` value of one of the hooks above."""
    return f"{__name__}.{name}"


__all__ = ["LAGGING", "STRAGGLER", "hook", "replica_1_misses_2_and_3", "replica_1_reads_v0_raw_from_replica_0",
           "replica_2_misses_2"]
