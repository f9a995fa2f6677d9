"""What a worker's several hub clients over one data plane share (``ShardedClient``, ``RegionalClient``): memory
kept registered while any of them holds it, calls made on all at once, and one close for all."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Sequence

from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.planes.base import DataPlane

logger = logging.getLogger("tensorhub_verl.ros.client.client_group")


def link_siblings(clients: Sequence[Client]) -> None:
    """Memory one client stops serving stays registered on the shared plane while a sibling still holds it."""
    for client in clients:
        client.share_plane_with(clients)


def merged_status(statuses: Sequence[dict]) -> dict:
    """One status (``messages.StatusReply`` as JSON data, as ``Client.status`` returns) of several hub processes:
    each model's versions as every hub lists them (a sharded hub's shares appear under their share layouts), every
    worker once (as the hub that saw it last reports it), the reads in flight and revoked summed."""
    out = {"hub_instance": ",".join(s["hub_instance"] for s in statuses), "workers": {}, "models": {},
           "leases_in_flight": 0, "leases_revoked": 0, "sweeps": 0}
    for status in statuses:
        for worker, seen in status["workers"].items():
            if worker not in out["workers"] or seen["last_seen_s"] < out["workers"][worker]["last_seen_s"]:
                out["workers"][worker] = seen
        for model, versions in status["models"].items():
            out["models"].setdefault(model, []).extend(versions)
        for field in ("leases_in_flight", "leases_revoked", "sweeps"):
            out[field] += status.get(field, 0)
    for versions in out["models"].values():
        versions.sort(key=lambda v: (v["version"], v["layout"]))
    return out


def results_of(futures: Sequence[Future]) -> list:
    """The results in order, once every call ended; the first failure is raised after all of them ended."""
    failures = [f.exception() for f in futures if f.exception() is not None]
    if failures:
        raise failures[0]
    return [f.result() for f in futures]


def close_clients(worker: str, clients: Sequence[Client], plane: DataPlane | None, timeout: float) -> None:
    """Closes every client (each unpublishes what it holds, waiting for in-flight reads), then ``plane`` if the
    group owns it; one client's failure does not keep the others from closing."""
    for client in clients:
        try:
            client.close(timeout)
        except Exception:
            logger.exception("%s: closing the client of %s failed", worker, client.hub_url)
    if plane is not None:
        plane.close()

