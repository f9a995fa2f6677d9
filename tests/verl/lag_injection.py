"""A replica delayed on purpose inside a real verl job: Ray's ``worker_process_setup_hook`` for the job's processes.

The job's updater (``TensorHubUpdater``, in verl's trainer actor) is the only thing changed: for the replica and
versions named here it drops what that replica staged and reports the apply as failed, as a replica that cannot
apply in time does (its engine keeps serving the version it has; the updater's own rules decide what follows:
``min_replica_fraction``, ``max_version_lag``, the fleet flip's catch-up). Everything else (verl's loop, the vLLM
engines, the hub, the transfers) runs for real. Selected with
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tests.verl.lag_injection.install``.
"""

from __future__ import annotations

LAGGING_REPLICA = 2
"""The replica rank that misses versions."""
MISSED_VERSIONS = frozenset({2, 3})
"""The versions it fails to apply (the fleet's own catch-up of an older version is not refused)."""
HOOK = "tests.verl.lag_injection.install"


def install() -> None:
    """Wraps ``TensorHubUpdater._apply_staged`` in this process (idempotent)."""
    import asyncio

    from tensorhub_verl.errors import TransferFailed
    from tensorhub_verl.verl.updater import TensorHubUpdater

    original = TensorHubUpdater._apply_staged
    if getattr(original, "_lag_injected", False):
        return

    async def _apply_staged(self, replica, staged, outcome, published_digests):
        if replica.replica_rank == LAGGING_REPLICA and staged.version in MISSED_VERSIONS:
            await asyncio.to_thread(staged.updater.call, "th_abort")
            raise TransferFailed(f"replica {LAGGING_REPLICA} delayed on purpose: v{staged.version} not applied")
        return await original(self, replica, staged, outcome, published_digests)

    _apply_staged._lag_injected = True
    TensorHubUpdater._apply_staged = _apply_staged


__all__ = ["HOOK", "LAGGING_REPLICA", "MISSED_VERSIONS", "install"]
