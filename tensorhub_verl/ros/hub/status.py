"""Status and metrics: the hub's answers to ``/v1/status`` and ``/metrics``, read from the parts, and the fetch
latencies that only these answers use."""

from __future__ import annotations

from collections import defaultdict

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.leases import Leases
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.records import HoldingState
from tensorhub_verl.ros.hub.registry import Registry
from tensorhub_verl.ros.hub.versions import VersionStore

KEEP_FETCH_SAMPLES = 10_000


class FetchTimes:
    """The latest ``KEEP_FETCH_SAMPLES`` finished fetches: (model, seconds)."""

    def __init__(self) -> None:
        self.samples: list[tuple[str, float]] = []

    def add(self, model: str, seconds: float) -> None:
        self.samples.append((model, seconds))
        del self.samples[:-KEEP_FETCH_SAMPLES]


def status_reply(instance: str, registry: Registry, versions: VersionStore, leases: Leases,
                 quarantine: Quarantine, now: float, sweeps: int = 0) -> msg.StatusReply:
    workers = {r.worker: msg.WorkerStatus(location=r.location.as_dict(), spot=r.spot, bytes_served=r.bytes_served,
                                          last_seen_s=round(now - r.last_seen, 3)) for r in registry}
    models: dict[str, list[msg.VersionStatus]] = defaultdict(list)
    for (model, version, layout), record in sorted(versions.items()):
        models[model].append(msg.VersionStatus(
            version=version, layout=layout, bytes=record.manifest.nbytes, chunks=len(record.chunks),
            holders=[msg.HolderStatus(holder=h.holder, worker=h.worker, state=h.state,
                                      quarantined=quarantine.quarantined((model, version, layout), h.holder, now),
                                      chunks=len(record.chunks) if h.chunks is None else len(h.chunks),
                                      served_bytes=h.served_bytes) for h in record.holdings.values()],
        ))
    return msg.StatusReply(hub_instance=instance, workers=workers, models=dict(models),
                           leases_in_flight=len(leases), leases_revoked=leases.revoked_total, sweeps=sweeps)


def metrics_snapshot(registry: Registry, versions: VersionStore, leases: Leases, quarantine: Quarantine,
                     fetch_times: FetchTimes, delta_bytes: dict[str, int] | None = None) -> dict:
    holders = {k: sum(1 for h in r.holdings.values() if h.state == HoldingState.ACTIVE) for k, r in versions.items()}
    return {"bytes_served": {r.worker: r.bytes_served for r in registry},
            "holders": holders, "fetch_seconds": list(fetch_times.samples),
            "leases_revoked": leases.revoked_total, "read_failures": dict(quarantine.read_failures),
            "corrupt_reads": dict(quarantine.corrupt_reads),
            "leases_in_flight": len(leases), "workers": len(registry), "delta_bytes": dict(delta_bytes or {})}
