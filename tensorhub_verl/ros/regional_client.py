"""A worker's handle on a hub of regions (``regions.py``): its region's hub for reads, every region's to publish.

- **Reads stay in the region**: a worker fetches from its own region's hub only, so it is planned on, and
  becomes a source for, the holders of its region only; no other region's hub hears of it.
- **Publishing**: a publisher (the trainer) publishes every version to every region's hub, over one data plane
  (each hub knows the same agent and grant key, and signs TCP grants for its own readers' leases). Each region's
  first copy comes from the publisher: K regions read K copies from it, spread by each region's planner.
- **Visibility** (two phases): the version goes to every region first as a *pending* member of a shard group
  (``shard_groups.py``: neither visible nor read); only once every region holds it does the publisher complete
  the group in each region with a one-byte commit marker (layout ``<layout>@regions``). A version that some
  region refused or could not take is withdrawn from the others and never becomes visible anywhere.
- **Draining**: ``unpublish`` returns once every region has drained its reads of the publisher's copy.
- **Digests** are computed once and reused for the other regions (``Client.publish(verified=...)``).

A worker whose location is in no region may publish, but reads from none.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.client import Client, ClientConfig
from tensorhub_verl.ros.client_group import close_clients, link_siblings, results_of
from tensorhub_verl.ros.fetcher import FetchStats
from tensorhub_verl.ros.manifest import Manifest
from tensorhub_verl.ros.planes import registry
from tensorhub_verl.ros.planes.base import DataPlane
from tensorhub_verl.ros.regions import commit_layout, parse_regions, region_of
from tensorhub_verl.ros.topology import Location

logger = logging.getLogger("tensorhub_verl.ros.regional_client")

_GROUP = "regions"
"""The shard group that holds a version pending in a region until its commit marker joins it."""


class RegionalClient:
    """``Client``'s API over a hub of regions: reads from this worker's region, publishes to all of them."""

    def __init__(self, regions: Mapping[str, str] | str, worker: str,
                 location: Location | Mapping[str, str] | str | None = None, token: str | None = None,
                 config: ClientConfig | None = None, plane: DataPlane | None = None):
        self.regions = parse_regions(regions) if isinstance(regions, str) else dict(regions)
        self.worker, self.location = worker, Location.parse(location)
        self.region = region_of(self.location, self.regions)
        self.config = config or ClientConfig()
        self._token = token
        self._own_plane = plane is None
        self._plane = plane or registry.create(self.config.plane, worker, next(iter(self.regions.values())),
                                               self.config.timeouts.read_timeout_s)
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._markers: dict[tuple[str, int, str], torch.Tensor] = {}
        """(model, version, layout) -> the commit marker this worker holds in every region for that version."""
        self._pool = ThreadPoolExecutor(min(64, 2 * len(self.regions)), thread_name_prefix=f"tensorhub-regions-{worker}")
        try:
            if self.region is not None:
                self._client(self.region)  # registered with its region's hub from the start
        except BaseException:
            self.close(5.0)
            raise

    # --------------------------------------------------------------------------------- publish
    def publish(self, model: str, version: int, tensors: Mapping[str, torch.Tensor], layout: str = "hf",
                chunk_bytes: int | None = None, verified: Manifest | None = None) -> Manifest:
        """Publishes to every region; the version becomes visible in a region only once every region holds it.
        Returns the manifest (the same in every region)."""
        names = list(self.regions)
        self._register(tensors.values())
        first = self._client(names[0]).publish(model, version, tensors, layout, chunk_bytes, _GROUP, 2,
                                               verified=verified)
        try:  # phase 1: pending everywhere, digests computed once
            self._each(names[1:], lambda name, client: client.publish(model, version, tensors, layout, chunk_bytes,
                                                                     _GROUP, 2, verified=first))
        except BaseException as e:
            self._withdraw(names, model, version, layout)
            raise errors.HubUnavailable(f"{model} v{version} ({layout}) could not be published to every region "
                                        f"({e}); it was withdrawn from the others and is visible in none") from e
        marker = torch.zeros(1, dtype=torch.uint8)
        with self._lock:
            self._markers[(model, version, layout)] = marker
        # phase 2: every region holds it; the marker completes each region's group and the version turns active
        self._each(names, lambda name, client: client.publish(model, version, {"commit": marker},
                                                              commit_layout(layout), None, _GROUP, 2))
        return first

    def unpublish(self, model: str, version: int, layout: str = "hf", timeout: float | None = None) -> None:
        """Returns once no read of this worker's copy is in flight in any region."""
        with self._lock:
            clients = dict(self._clients)
            marker = self._markers.pop((model, version, layout), None)
        held = [name for name, c in clients.items() if (model, version, layout) in c.holdings()]
        if not held:
            raise errors.VersionNotFound(f"{self.worker} holds no version {version} of {model!r} in layout "
                                         f"{layout!r} in any region")
        self._each(held, lambda name, client: client.unpublish(model, version, layout, timeout))
        if marker is not None:
            self._each(list(clients), lambda name, client: client.unpublish(model, version, commit_layout(layout),
                                                                           timeout))

    # ------------------------------------------------------------------------- reads: own region
    @property
    def home(self) -> Client:
        """This worker's region's client; ConfigError for a worker in no region."""
        if self.region is None:
            raise errors.ConfigError(f"worker {self.worker!r} at {self.location.as_dict()} is in none of the regions "
                                     f"{sorted(self.regions)}: it may publish but not read; give it a location "
                                     f"inside a region, or add its region to the hub")
        return self._client(self.region)

    def fetch(self, model: str, version: int | str = "latest", into: Mapping[str, torch.Tensor] | None = None,
              layout: str = "hf", hold: bool = True, timeout: float | None = None) -> FetchStats:
        self._register(into.values() if into else ())
        return self.home.fetch(model, version, into, layout, hold, timeout)

    def fetch_slices(self, model: str, version: int | str = "latest", **kwargs) -> FetchStats:
        return self.home.fetch_slices(model, version, **kwargs)

    def manifest(self, model: str, version: int | str = "latest", layout: str = "hf") -> Manifest:
        return self.home.manifest(model, version, layout)

    def versions(self, model: str, layout: str = "hf") -> dict[int, list[str]]:
        return self.home.versions(model, layout)

    def latest(self, model: str, layout: str = "hf") -> int | None:
        return self.home.latest(model, layout)

    def wait_for_version(self, model: str, newer_than: int | None = None, layout: str = "hf",
                         timeout: float = 30.0) -> int:
        return self.home.wait_for_version(model, newer_than, layout, timeout)

    def holdings(self) -> list[tuple[str, int, str]]:
        """What this worker holds in any region (the commit markers left out)."""
        with self._lock:
            clients = list(self._clients.values())
        return sorted({h for c in clients for h in c.holdings() if not h[2].endswith(commit_layout(""))})

    def status(self) -> dict[str, dict]:
        """Each region's hub status, for the regions this worker talks to."""
        with self._lock:
            clients = dict(self._clients)
        return dict(zip(clients, self._each(list(clients), lambda name, client: client.status())))

    # ------------------------------------------------------------------------------ lifecycle
    def close(self, timeout: float = 30.0) -> None:
        """Unpublishes everything in every region (waiting for in-flight reads), then stops."""
        self._pool.shutdown(wait=True)
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        close_clients(self.worker, clients, self._plane if self._own_plane else None, timeout)

    def __enter__(self) -> "RegionalClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- helpers
    def _client(self, name: str) -> Client:
        """The client of region ``name``'s hub, connected on first use over this worker's one plane."""
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                client = Client(self.regions[name], self.worker, self.location, self._token, self.config,
                                plane=self._plane)
                self._clients[name] = client
                link_siblings(tuple(self._clients.values()))
            return client

    def _register(self, tensors) -> None:
        """Registers memory on the shared plane up front; where that changed its metadata (NIXL), every region's
        hub this worker talks to learns it."""
        if self._plane.register(list(tensors)):
            with self._lock:
                clients = list(self._clients.values())
            for client in clients:
                client._register_worker()

    def _withdraw(self, names: Sequence[str], model: str, version: int, layout: str) -> None:
        """Drops a version's pending copies after a failed publish (best effort: a region may be down)."""
        for name in names:
            with self._lock:
                client = self._clients.get(name)
            if client is not None and (model, version, layout) in client.holdings():
                try:
                    client.unpublish(model, version, layout)
                except errors.TensorHubError as e:
                    logger.warning("%s: could not withdraw %s v%d from region %s: %s", self.worker, model, version,
                                   name, e)

    def _each(self, names: Sequence[str], call: Callable[[str, Client], Any]) -> list:
        """``call`` on each named region's client at once; the results in order. Waits for every call, then
        raises the first failure."""
        return results_of([self._pool.submit(lambda n=name: call(n, self._client(n))) for name in names])
