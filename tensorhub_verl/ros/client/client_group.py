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
        client._siblings = tuple(other for other in clients if other is not client)


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

