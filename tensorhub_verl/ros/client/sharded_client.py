"""A worker's handle on a hub of several processes (shards): one ``Client`` per shard over one data plane.

Each shard is an ordinary hub process. A version is split by whole tensors into one share per shard
(``shares.py``); each shard plans, leases, grants, drains and checks the digests of its share alone, so the hub's
work for one update splits across the shards' cores. This class keeps the guarantees of one hub across them:

- **Visibility**: a reader resolves a version, and reads every shard's manifest of it, before any byte moves; a
  version that some shard does not list is not visible (``VersionNotFound`` naming the shards that lack it).
- **One data plane**: the shards' clients share this worker's plane, so the hubs know one agent and one grant
  key (each shard signs TCP grants with it); memory one shard's client stops serving stays registered while a
  sibling still holds it.
- **Draining**: ``unpublish`` returns once every shard has drained its share.
- **Faults**: each shard's client re-registers after its shard restarts and re-plans its own failed reads, as
  with one hub.

With one URL ``connect`` returns a plain ``Client``: one shard is today's hub.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.client.client import Client, full_specs
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.delta import DeltaPublished
from tensorhub_verl.ros.client.client_group import close_clients, link_siblings, merged_status, results_of
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.wire.manifest import Manifest, check_buffers
from tensorhub_verl.ros.client.hub_client import hub_plane_for
from tensorhub_verl.ros.planes import factory
from tensorhub_verl.ros.planes.base import DataPlane
from tensorhub_verl.ros.client.shares import MAX_SHARDS, share_layout, split
from tensorhub_verl.ros.wire.topology import Location

logger = logging.getLogger("tensorhub_verl.ros.client.sharded_client")

_WAIT_POLL_S = 0.05
"""How often ``wait_for_version`` looks again while a version is on some shards only."""


class ShardedClient:
    """``Client``'s publish / fetch / unpublish API over a hub of ``len(hub_urls)`` shards (in shard order)."""

    def __init__(self, hub_urls: Sequence[str], worker: str, location: Location | Mapping[str, str] | str | None = None,
                 token: str | None = None, config: ClientConfig | None = None, plane: DataPlane | None = None):
        if not 2 <= len(hub_urls) <= MAX_SHARDS or len(set(hub_urls)) != len(hub_urls):
            raise errors.ConfigError(f"a sharded hub needs 2 to {MAX_SHARDS} distinct shard URLs, got {list(hub_urls)}")
        self.worker = worker
        self.config = config or ClientConfig()
        self._own_plane = plane is None
        self._plane = plane or factory.create(self.config.plane, worker, hub_urls[0],
                                               self.config.timeouts.read_timeout_s,
                                               hub_plane=hub_plane_for(self.config, hub_urls[0], token))
        self.shards: list[Client] = []
        try:
            for url in hub_urls:
                self.shards.append(Client(url, worker, location, token, self.config, plane=self._plane))
        except BaseException:
            self._close_shards(5.0)
            raise
        link_siblings(self.shards)
        self.location = self.shards[0].location
        self.hub_urls = [client.hub_url for client in self.shards]
        # Calls on different versions may run at once (as on a Client); each takes one thread per shard.
        self._pool = ThreadPoolExecutor(4 * len(self.shards), thread_name_prefix=f"tensorhub-shards-{worker}")

    @property
    def count(self) -> int:
        return len(self.shards)

    @property
    def preserved_bytes(self) -> int:
        """Bytes this worker copied to CPU memory over its life (``Client.preserved_bytes``), on every shard."""
        return sum(client.preserved_bytes for client in self.shards)

    def _layout(self, layout: str, index: int) -> str:
        return share_layout(layout, index, self.count)

    # --------------------------------------------------------------------------------- publish
    def publish(self, model: str, version: int, tensors: Mapping[str, torch.Tensor], layout: str = "hf",
                chunk_bytes: int | None = None, shard_group: str | None = None, shard_count: int = 1,
                verified: Manifest | None = None) -> Manifest:
        """``Client.publish`` of each shard's share of ``tensors``; returns the whole version's manifest, whose
        ``shares`` are the shares' manifests in shard order (``verified``: such a manifest, e.g.
        ``FetchStats.manifest`` of a sharded fetch)."""
        if verified is not None and len(verified.shares) != self.count:
            raise errors.ManifestMismatch(f"verified= holds {len(verified.shares)} shares' manifests; this hub has "
                                          f"{self.count} shards: pass the manifest a fetch through them returned")
        groups = self._split([(name, t.numel() * t.element_size()) for name, t in tensors.items()])
        self._register(tensors.values())
        return Manifest.of_shares(self._each(lambda i, client: client.publish(
            model, version, {name: tensors[name] for name in groups[i]}, self._layout(layout, i), chunk_bytes,
            shard_group, shard_count, verified=verified.shares[i] if verified else None)), layout)

    def publish_shard(self, model: str, version: int, pieces: Mapping[str, torch.Tensor], *,
                      specs: Mapping[str, tuple[Sequence[int], torch.dtype | str]], rank: int, ranks: int,
                      layout: str = "hf", group: str = "shards", chunk_bytes: int | None = None) -> Manifest:
        """``Client.publish_shard`` of each shard's share; every rank splits the same full specs alike. Returns the
        whole version's manifest (``shares``: the shares' manifests in shard order)."""
        groups = self._split([(spec.name, spec.nbytes) for spec in full_specs(specs)])
        self._register(pieces.values())
        return Manifest.of_shares(self._each(lambda i, client: client.publish_shard(
            model, version, {name: pieces[name] for name in groups[i] if name in pieces},
            specs={name: specs[name] for name in groups[i]}, rank=rank, ranks=ranks,
            layout=self._layout(layout, i), group=group, chunk_bytes=chunk_bytes)), layout)

    def unpublish(self, model: str, version: int, layout: str | None = None, timeout: float | None = None) -> None:
        """Returns once no read of this worker's copy is in flight on any shard."""
        self._each(lambda i, client: client.unpublish(
            model, version, None if layout is None else self._layout(layout, i), timeout))

    # ----------------------------------------------------------------------------------- fetch
    def manifests(self, model: str, version: int | str = "latest", layout: str = "hf") -> list[Manifest]:
        """Every shard's manifest of one version, in shard order; VersionNotFound unless all shards have it."""
        version = self._resolve(model, version, layout)
        deadline = time.monotonic() + self.config.timeouts.request_timeout_s
        # Through a shard's restart: its holders re-register on their next heartbeat (Client.through_restart).
        found: list[Manifest | None] = self._each(lambda i, client: _or_none(lambda: client.through_restart(
            lambda: client.manifest(model, version, self._layout(layout, i)), deadline)))
        missing = [i for i, m in enumerate(found) if m is None]
        if missing:
            raise errors.VersionNotFound(
                f"{model} v{version} ({layout}) is not on hub shard(s) {missing} of {self.count} yet: a version is "
                f"visible once every shard has its share; wait_for_version waits for that")
        return found

    def manifest(self, model: str, version: int | str = "latest", layout: str = "hf") -> Manifest:
        """The whole version's manifest (every tensor; ``shares``: each shard's manifest of its share, in shard
        order), as ``Client.manifest``; VersionNotFound unless all shards have it."""
        return Manifest.of_shares(self.manifests(model, version, layout), layout)

    def publish_delta(self, model: str, version: int, base_version: int, layout: str = "hf", mode: str = "auto",
                      chunk_bytes: int | None = None) -> DeltaPublished:
        """``Client.publish_delta`` of each shard's share; returns what the whole version's delta did (``shares``:
        each share's result, in shard order; ``DeltaPublished.of_shares``)."""
        parts = self._each(lambda i, client: client.publish_delta(model, version, base_version,
                                                                  self._layout(layout, i), mode, chunk_bytes))
        # The whole delta form's layout: the first share's, with its share suffix taken off the base layout.
        return DeltaPublished.of_shares(parts, parts[0].layout.replace(self._layout(layout, 0), layout, 1))

    def fetch(self, model: str, version: int | str = "latest", into: Mapping[str, torch.Tensor] | None = None,
              layout: str = "hf", hold: bool = True, timeout: float | None = None, *, have: int | None = None,
              delta: str = "auto") -> FetchStats:
        """``Client.fetch`` of every shard's share at once into one set of buffers; "latest" is the newest version
        every shard has. On failure no share stays held. ``have``: each share as ``Client.fetch(have=...)``; the
        shares' ``DeltaStats`` are summed into ``stats.delta``."""
        started = time.monotonic()
        manifests = self.manifests(model, version, layout)
        if into is None:
            into = {name: t for m in manifests for name, t in m.allocate("cpu").items()}
        known = {spec.name for m in manifests for spec in m.tensors}
        extra = [name for name in into if name not in known]
        if extra:
            raise errors.ManifestMismatch(f"tensor {extra[0]!r} is not in {model} v{manifests[0].version} ({layout}); "
                                          f"remove it from the buffers", tensor=extra[0])
        parts = [{spec.name: into[spec.name] for spec in m.tensors if spec.name in into} for m in manifests]
        for m, part in zip(manifests, parts):
            check_buffers(m, part)  # every share's buffers, before any share's bytes move
        self._register(into.values())
        stats = self._all_or_none(manifests, lambda i, client: client.fetch(
            model, manifests[i].version, parts[i], self._layout(layout, i), hold, _left(started, timeout, self.config),
            **({} if have is None else {"have": have, "delta": delta})), hold)
        out = _merged(stats, layout, time.monotonic() - started)
        if have is not None:
            out.delta = merged_delta([s.delta for s in stats])
        out.buffers = dict(into)
        return out

    def fetch_slices(self, model: str, version: int | str = "latest", *, into: Mapping[str, torch.Tensor],
                     slices: Mapping[str, Any] | None = None, layout: str = "hf",
                     timeout: float | None = None, have: int | None = None, delta: str = "auto") -> FetchStats:
        """``Client.fetch_slices`` from the shards that hold the tensors named in ``into``. ``have``: each share
        as ``Client.fetch_slices(have=...)``; the shares' ``DeltaStats`` are summed into ``stats.delta``."""
        started = time.monotonic()
        manifests = self.manifests(model, version, layout)
        known = {spec.name for m in manifests for spec in m.tensors}
        unknown = [name for name in into if name not in known]
        if unknown:
            raise errors.ManifestMismatch(f"tensor {unknown[0]!r} is not in {model} v{manifests[0].version} "
                                          f"({layout})", tensor=unknown[0])
        self._register(into.values())
        slices = slices or {}
        wanted = [[spec.name for spec in m.tensors if spec.name in into] for m in manifests]
        stats = self._each(lambda i, client: client.fetch_slices(
            model, manifests[i].version, into={n: into[n] for n in wanted[i]},
            slices={n: slices[n] for n in wanted[i] if n in slices}, layout=self._layout(layout, i),
            timeout=_left(started, timeout, self.config), **({} if have is None else {"have": have, "delta": delta}))
            if wanted[i] else None)
        read = [s for s in stats if s is not None]
        out = _merged(read, layout, time.monotonic() - started)
        if have is not None:
            out.delta = merged_delta([s.delta for s in read])
        return out

    # --------------------------------------------------------------------------------- queries
    def versions(self, model: str, layout: str = "hf") -> dict[int, list[str]]:
        """The versions every shard has -> the workers that hold all of their shares."""
        each = self._each(lambda i, client: client.versions(model, self._layout(layout, i)))
        common = set.intersection(*(set(v) for v in each))
        return {v: sorted(set.intersection(*(set(e[v]) for e in each))) for v in sorted(common)}

    def latest(self, model: str, layout: str = "hf") -> int | None:
        return max(self.versions(model, layout), default=None)

    def wait_for_version(self, model: str, newer_than: int | None = None, layout: str = "hf",
                         timeout: float = 30.0) -> int:
        """Blocks until a version newer than ``newer_than`` is on every shard; returns the newest such."""
        deadline = time.monotonic() + timeout
        last = self.count - 1
        while True:
            newest = self.latest(model, layout)
            if newest is not None and (newer_than is None or newest > newer_than):
                return newest
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no version of {model!r} newer than {newer_than} on all {self.count} hub "
                                   f"shards within {timeout} s")
            # A publisher writes the shares in shard order: the last shard is the last to have a new version.
            try:
                self.shards[last].wait_for_version(model, newer_than, self._layout(layout, last),
                                                   min(remaining, 10.0))
            except TimeoutError:
                continue
            time.sleep(_WAIT_POLL_S)

    def holdings(self) -> list[tuple[str, int, str]]:
        """(model, version, layout) of the versions whose every share this worker holds."""
        each = [{(m, v, lay.rsplit("@", 1)[0]) for m, v, lay in client.holdings()} for client in self.shards]
        return sorted(set.intersection(*each))

    def status(self) -> dict:
        """Every shard's status as one (``client_group.merged_status``): each share under its share layout."""
        return merged_status(self._each(lambda i, client: client.status()))

    # ------------------------------------------------------------------------------ lifecycle
    def close(self, timeout: float = 30.0) -> None:
        """Unpublishes everything on every shard (waiting for in-flight reads), then stops."""
        self._pool.shutdown(wait=True)
        self._close_shards(timeout)

    def _close_shards(self, timeout: float) -> None:
        close_clients(self.worker, self.shards, self._plane if self._own_plane else None, timeout)

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- helpers
    def _split(self, sizes: list[tuple[str, int]]) -> list[list[str]]:
        return split(sizes, self.count)

    def _register(self, tensors) -> None:
        """Registers memory on the shared plane up front; where that changed the plane's metadata (NIXL), every
        shard learns the new metadata, not only the shard whose call registered it."""
        if self._plane.register(list(tensors)):
            self._each(lambda i, client: client.register_again())

    def _resolve(self, model: str, version: int | str, layout: str) -> int:
        if version != "latest":
            return version
        newest = self.latest(model, layout)
        if newest is None:
            raise errors.VersionNotFound(f"no version of {model!r} ({layout}) is on all {self.count} hub shards")
        return newest

    def _each(self, call: Callable[[int, Client], Any]) -> list:
        """``call`` on every shard's client at once; the results in shard order. Waits for every call, then
        raises the first failure."""
        return results_of([self._pool.submit(call, i, client) for i, client in enumerate(self.shards)])

    def _all_or_none(self, manifests: list[Manifest], call: Callable[[int, Client], FetchStats],
                     hold: bool) -> list[FetchStats]:
        """The shares' fetches at once; if one fails, the shares fetched and held are unpublished before the
        failure is raised (a reader never serves part of a version)."""
        futures = [self._pool.submit(call, i, client) for i, client in enumerate(self.shards)]
        failures = [f.exception() for f in futures if f.exception() is not None]
        if not failures:
            return [f.result() for f in futures]
        if hold:
            for i, (future, client) in enumerate(zip(futures, self.shards)):
                if future.exception() is None:
                    try:
                        client.unpublish(manifests[i].model, manifests[i].version, manifests[i].layout)
                    except errors.TensorHubError as e:
                        logger.warning("%s: could not drop share %d after a failed fetch: %s", self.worker, i, e)
        raise failures[0]


def _or_none(call: Callable[[], Manifest]) -> Manifest | None:
    try:
        return call()
    except errors.VersionNotFound:
        return None


def _left(started: float, timeout: float | None, config: ClientConfig) -> float:
    """What is left of a fetch's limit for the shares' fetches, which run at once."""
    return max(0.001, (timeout or config.timeouts.fetch_timeout_s) - (time.monotonic() - started))


def merged_delta(parts: list):
    """One ``DeltaStats`` for the shares' fetches: used when every share used its delta."""
    from tensorhub_verl.ros.client.delta import DeltaStats

    out = DeltaStats(parts[0].base_version, used=all(p.used for p in parts))
    for p in parts:
        out.delta_bytes += p.delta_bytes
        out.changed_elements += p.changed_elements
        out.elements += p.elements
        out.fallback_chunks += p.fallback_chunks
        out.fallback_bytes += p.fallback_bytes
        out.full_chunks += p.full_chunks
        out.full_bytes += p.full_bytes
        out.reasons.extend(p.reasons)
        out.apply_seconds += p.apply_seconds
    return out


def _merged(stats: list[FetchStats], layout: str, seconds: float) -> FetchStats:
    """One FetchStats for the shares' fetches; ``manifest``: the whole version's, its ``shares`` the shares'
    manifests in shard order (what ``ShardedClient.publish(verified=...)`` takes), when every share was fetched
    whole."""
    first = stats[0]
    out = FetchStats(first.model, first.version, layout, seconds=seconds)
    for s in stats:
        out.bytes += s.bytes
        out.partial_source_bytes += s.partial_source_bytes
        out.failed_reads += s.failed_reads
        out.revoked_reads += s.revoked_reads
        out.corrupt_reads += s.corrupt_reads
        out.cancelled_reads += s.cancelled_reads
        out.chunks += s.chunks
        out.exchanges += s.exchanges
        for source, nbytes in s.sources.items():
            out.sources[source] = out.sources.get(source, 0) + nbytes
    if all(s.manifest is not None for s in stats):
        out.manifest = Manifest.of_shares([s.manifest for s in stats], layout)
    return out
