"""A worker's handle on a hub of regions (``regions.py``): its region's hub for reads, every region's to publish.

- **Reads stay in the region**: a worker fetches from its own region's hub only, so it is planned on, and
  becomes a source for, the holders of its region only; no other region's hub hears of it.
- **Publishing**: a publisher (the trainer) publishes every version to every region's hub, over one data plane
  (each hub knows the same agent and grant key, and signs TCP grants for its own readers' leases). Without
  relays each region's first copy comes from the publisher: K regions read K copies from it.
  A worker's publish of a version it fetched (an engine holding what it pulled, in any layout) is a copy: it
  goes to its own region only.
- **Relays** (``FetchConfig.relay_fanout`` > 0): the regions of each datacenter form a tree
  (``regions.relay_parents``). In a region with a parent the publisher holds its copy as a *standby*
  (``Client.publish(standby=True)``: read only for chunks no other holder as near has), and that
  region's readers wait (one long poll, ``relay_wait_s`` at most) until a reader of the parent region that
  completed the version registers its checked copy there as ``<worker>~relay`` (``Client.relay``), with a
  one-byte relay marker (layout ``<layout>@relay``) that ends the wait. The relays are the first two by name of
  a region's completed readers, in each of its children where no marker is yet, and only where the version is
  visible: committed. So a datacenter's copy crosses the WAN once, and the publisher serves one copy per tree
  root. A relay copy is the reader's own buffers: its ``unpublish`` (and ``close``, and retention) drains it in
  every region; a relay that dies is dropped by that region's hub as any holder is, and its reads re-planned
  (onto other holders, or the standby). Digests still check every chunk read from it.
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
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.delta import DeltaPublished
from tensorhub_verl.ros.client.client_group import close_clients, link_siblings, merged_status, results_of
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.client.hub_client import hub_plane_for
from tensorhub_verl.ros.planes import factory
from tensorhub_verl.ros.planes.base import DataPlane
from tensorhub_verl.ros.wire.regions import (commit_layout, complete_holders, parse_regions, region_of,
                                             relay_children, relay_layout, relay_parents, relay_wanted,
                                             relays_from_here)
from tensorhub_verl.ros.wire.topology import Location

logger = logging.getLogger("tensorhub_verl.ros.client.regional_client")

_FETCHED_KEPT = 16
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
        fanout = self.config.fetch.relay_fanout
        self._parents = relay_parents(list(self.regions), fanout)
        self._children = relay_children(list(self.regions), fanout)
        self._token = token
        self._own_plane = plane is None
        first = next(iter(self.regions.values()))
        self._plane = plane or factory.create(self.config.plane, worker, first, self.config.timeouts.read_timeout_s,
                                               hub_plane=hub_plane_for(self.config, first, token))
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._fetched: dict[str, list[int]] = {}
        """model -> the latest versions this worker fetched (``_FETCHED_KEPT`` of them): its publishes of them are
        copies, held in its region only."""
        self._markers: dict[tuple[str, int, str], torch.Tensor] = {}
        """(model, version, layout) -> a marker this worker holds: a version's commit marker in every region (its
        publisher), or its relay marker in the child regions (a relay)."""
        self._pool = ThreadPoolExecutor(min(64, 2 * len(self.regions)), thread_name_prefix=f"tensorhub-regions-{worker}")
        try:
            if self.region is not None:
                self._client(self.region)  # registered with its region's hub from the start
        except BaseException:
            self.close(5.0)
            raise

    # --------------------------------------------------------------------------------- publish
    def publish(self, model: str, version: int, tensors: Mapping[str, torch.Tensor], layout: str = "hf",
                chunk_bytes: int | None = None, shard_group: str | None = None, shard_count: int = 1,
                verified: Manifest | None = None) -> Manifest:
        """Publishes to every region; the version becomes visible in a region only once every region holds it.
        Returns the manifest (the same in every region).

        A copy of a version this worker fetched (an engine holding what it pulled, in any layout), or a shard of
        ``shard_group`` (an engine's TP ranks): to this worker's region only, as ``Client.publish``; such a copy
        serves the readers of its region."""
        with self._lock:
            fetched = version in self._fetched.get(model, ())
        if shard_group is not None or fetched:
            return self.home.publish(model, version, tensors, layout, chunk_bytes, shard_group, shard_count,
                                     verified=verified)
        names = list(self.regions)
        self._register(tensors.values())
        first = self._client(names[0]).publish(model, version, tensors, layout, chunk_bytes, _GROUP, 2,
                                               verified=verified)
        try:  # phase 1: pending everywhere, digests computed once; a standby copy where a parent region feeds
            self._each(names[1:], lambda name, client: client.publish(
                model, version, tensors, layout, chunk_bytes, _GROUP, 2, verified=first,
                standby=self._parents[name] is not None))
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

    def publish_shard(self, model: str, version: int, pieces: Mapping[str, torch.Tensor], *,
                      specs: Mapping[str, tuple[Sequence[int], torch.dtype | str]], rank: int, ranks: int,
                      layout: str = "hf", group: str = "shards", chunk_bytes: int | None = None) -> Manifest:
        """Row shards are published to one hub process only (``Client.publish_shard``)."""
        raise errors.ConfigError(f"{self.worker}: publishing row shards (an FSDP rank's rows) to a hub of regions is "
                                 f"not supported; publish whole tensors from one rank (verl: tensorhub.staging with "
                                 f"gathered tensors), or use one hub process")

    @property
    def preserved_bytes(self) -> int:
        """Bytes this worker copied to CPU memory over its life (``Client.preserved_bytes``), in every region."""
        with self._lock:
            return sum(client.preserved_bytes for client in self._clients.values())

    def unpublish(self, model: str, version: int, layout: str | None = None, timeout: float | None = None) -> None:
        """Returns once no read of this worker's copy is in flight in any region (``layout`` None: every layout
        this worker holds the version in, as ``Client.unpublish``)."""
        if layout is None:
            layouts = sorted({lay for m, v, lay in self.holdings() if (m, v) == (model, version)})
            if not layouts:
                raise errors.VersionNotFound(f"{self.worker} holds no version {version} of {model!r} in any region")
            for lay in layouts:
                self.unpublish(model, version, lay, timeout)
            return
        with self._lock:
            clients = dict(self._clients)
            marker = self._markers.pop((model, version, layout), None)
        held = [name for name, c in clients.items() if (model, version, layout) in c.holdings()]
        if not held:
            raise errors.VersionNotFound(f"{self.worker} holds no version {version} of {model!r} in layout "
                                         f"{layout!r} in any region")
        relayed = [name for name, c in clients.items() if (model, version, relay_layout(layout)) in c.holdings()]
        # A relay copy and its marker go together: the copy drains (its reads end), the marker is dropped.
        self._each(held, lambda name, client: client.unpublish(model, version, layout, timeout))
        self._each(relayed, lambda name, client: client.unpublish(model, version, relay_layout(layout), timeout))
        with self._lock:
            self._markers.pop((model, version, relay_layout(layout)), None)
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

    def publish_delta(self, model: str, version: int, base_version: int, layout: str = "hf", mode: str = "auto",
                      chunk_bytes: int | None = None) -> DeltaPublished:
        """Deltas are not published to a hub of regions: its readers read versions in full."""
        raise errors.ConfigError(f"{self.worker}: deltas are not published to a hub of regions (a hub process per "
                                 f"region); its readers read every version in full. Use one hub process (or a hub "
                                 f"of shards) for deltas, or tensorhub.delta=off")

    def fetch(self, model: str, version: int | str = "latest", into: Mapping[str, torch.Tensor] | None = None,
              layout: str = "hf", hold: bool = True, timeout: float | None = None, *, have: int | None = None,
              delta: str = "auto") -> FetchStats:
        """From this worker's region. With relays: in a region with a parent, first waits for the parent's relay
        copy; once held, passes the copy on to this region's children (``Client.relay``). ``have``: read in full
        (no deltas on a hub of regions); ``stats.delta`` says so."""
        self._register(into.values() if into else ())
        version = self._await_relay(model, version, layout)
        stats = self.home.fetch(model, version, into, layout, hold, timeout)
        if have is not None:
            stats.delta = _in_full(have, stats)
        self._note_fetched(model, stats.version)
        if hold and self._children.get(self.region) and stats.manifest is not None:
            self._relay(stats)
        return stats

    def fetch_slices(self, model: str, version: int | str = "latest", *, into: Mapping[str, torch.Tensor],
                     slices: Mapping[str, Any] | None = None, layout: str = "hf",
                     timeout: float | None = None, have: int | None = None, delta: str = "auto") -> FetchStats:
        """From this worker's region. ``have``: read in full (no deltas on a hub of regions); ``stats.delta``
        says so."""
        version = self._await_relay(model, version, layout)
        stats = self.home.fetch_slices(model, version, into=into, slices=slices, layout=layout, timeout=timeout)
        if have is not None:
            stats.delta = _in_full(have, stats)
        self._note_fetched(model, stats.version)
        return stats

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
        """What this worker holds in any region (the commit and relay markers left out)."""
        with self._lock:
            clients = list(self._clients.values())
        return sorted({h for c in clients for h in c.holdings()
                       if not h[2].endswith((commit_layout(""), relay_layout("")))})

    def status(self) -> dict:
        """The status of the regions' hubs this worker talks to, as one (``client_group.merged_status``); a
        region's own: ``region_status``."""
        with self._lock:
            names = list(self._clients)
        return merged_status(self._each(names, lambda name, client: client.status()))

    def region_status(self) -> dict[str, dict]:
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
                client.register_again()

    def _note_fetched(self, model: str, version: int) -> None:
        with self._lock:
            kept = self._fetched.setdefault(model, [])
            kept.append(version)
            del kept[:-_FETCHED_KEPT]

    def _await_relay(self, model: str, version: int | str, layout: str) -> int | str:
        """In a region with a parent: waits (one long poll, at most ``relay_wait_s``) until a reader of the parent
        region has passed the version on here (its relay marker, ``regions.relay_layout``, is visible); then,
        or after the wait, the fetch. Returns the version, "latest" resolved."""
        if self.region is None or self._parents.get(self.region) is None or not self.config.fetch.relay_wait_s:
            return version
        if version == "latest":
            version = self.home.latest(model, layout)
            if version is None:
                return "latest"  # the fetch raises VersionNotFound as it would without relays
        try:
            self.home.wait_for_version(model, version - 1, relay_layout(layout), self.config.fetch.relay_wait_s)
        except TimeoutError:
            logger.warning("%s: no copy of %s v%d came from region %s within %.0f s; reading from the publisher's "
                           "standby copy", self.worker, model, version, self._parents[self.region],
                           self.config.fetch.relay_wait_s)
        return version

    def _relay(self, stats: FetchStats) -> None:
        """Registers this worker's checked copy, and a relay marker, in each child region that has none yet, if it
        is one of its region's relays (``regions.relays_from_here``). Best effort: a child without a relay reads
        from the standby after its wait."""
        m = stats.manifest
        marker_layout = relay_layout(m.layout)
        try:
            if not relays_from_here(self.worker, complete_holders(self.home.status(), m.model, m.version, m.layout)):
                return

            def relay_to(name: str, client: Client) -> None:
                if relay_wanted(m.version, client.versions(m.model, m.layout), client.versions(m.model, marker_layout)):
                    client.relay(m, stats.buffers)
                    with self._lock:
                        marker = self._markers.setdefault((m.model, m.version, marker_layout),
                                                          torch.zeros(1, dtype=torch.uint8))
                    client.publish(m.model, m.version, {"relay": marker}, marker_layout)

            self._each(self._children[self.region], relay_to)
        except errors.TensorHubError as e:
            logger.warning("%s: could not pass %s v%d on to regions %s: %s", self.worker, m.model, m.version,
                           self._children[self.region], e)

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


def _in_full(have: int, stats: FetchStats):
    """The ``DeltaStats`` of a read that declared base ``have`` and moved the version in full."""
    from tensorhub_verl.ros.client.delta import DeltaStats

    return DeltaStats(have, fallback_chunks=stats.chunks, fallback_bytes=stats.bytes,
                      reasons=["a hub of regions serves no deltas: read in full"])
