"""A worker's handle on ROS: publish what it holds, fetch what it needs, and serve what it fetched.

Identity (worker id, location) is passed in. One Client per process and worker; it is thread-safe
for calls on different versions. A background thread sends heartbeats, re-registers everything after
a hub restart, and drops holdings that fell out of the hub's retention window.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch

from tensorhub_verl import errors
from tensorhub_verl.errors import UnknownFetch, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.planes import factory
from tensorhub_verl.ros.planes.base import DataPlane, ReadError, Region
from tensorhub_verl.ros.client.fetcher import ChunkFetcher, FetchSettings, FetchStats
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.wire.integrity import ALGORITHM, ChunkChecker, block_digests, chunk_digests, shard_chunk_digests
from tensorhub_verl.ros.wire.manifest import (
    Manifest, TensorSpec, build_manifest, check_buffers, check_dtype, dtype_from_name,
    dtype_name, layout_digest, row_range, shard_bytes, shard_chunks, _DTYPES,
)
from tensorhub_verl.ros.wire.block_edges import widen
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.delta_base import BaseDigests, BasePasses
from tensorhub_verl.ros.wire.ranges import ReadPlan, Runs, TensorSlice, plan_reads
from tensorhub_verl.ros.client.retry import Backoff
from tensorhub_verl.ros.wire.topology import Location
from tensorhub_verl.ros.wire.convert import manifest_from_msg, manifest_to_msg

if TYPE_CHECKING:
    from tensorhub_verl.ros.client.delta import DeltaPublished

logger = logging.getLogger("tensorhub_verl.ros.client")

_NAME = re.compile(r"^[A-Za-z0-9._:/@~+=-]{1,256}$")
ARCHIVE_SUFFIX = "~cpu"
_RESTART_GRACE_S = 10.0
"""After a hub restart, holders re-register on their next heartbeat (about a second, longer on a loaded
host): for this long a version the new hub does not know yet is waited for, not reported missing."""


@dataclass(slots=True)
class _Publication:
    """What this client serves under one holder id until it unpublishes it (the hub's record of it: a Holding)."""

    holder: str
    manifest: Manifest
    tensors: dict[str, torch.Tensor]
    """Strong references: registered memory must outlive every read of it."""
    shard_group: str | None = None
    shard_count: int = 1
    shard_rank: int | None = None
    """Set for a row shard: ``tensors`` are its rows only (see ``Client.publish_shard``)."""

    def message(self, worker: str) -> msg.Publish:
        return msg.Publish(worker=worker, holder=self.holder, manifest=manifest_to_msg(self.manifest),
                           regions=_regions(self.tensors, self.manifest, self.shard_rank),
                           shard_group=self.shard_group, shard_count=self.shard_count, shard_rank=self.shard_rank)


@dataclass(slots=True)
class _InFlightFetch:
    manifest: Manifest
    tensors: dict[str, torch.Tensor]
    fetcher: ChunkFetcher | None = None
    have: set[int] = field(default_factory=set)
    plan: ReadPlan | None = None
    """Set for a ranged read (``fetch_slices``): ``tensors`` then hold only the selected bytes."""


class Client:
    def __init__(self, hub_url: str, worker: str, location: Location | Mapping[str, str] | str | None = None,
                 token: str | None = None, config: ClientConfig | None = None,
                 plane: DataPlane | None = None):
        _check_name("worker", worker)
        if msg.HOLDER_SEPARATOR in worker:
            raise errors.ConfigError(f"worker ids may not contain {msg.HOLDER_SEPARATOR!r} (it names a worker's "
                                     f"holders, e.g. its CPU archive {worker.split('~')[0]}{ARCHIVE_SUFFIX})")
        self.worker = worker
        self._own = (worker, worker + msg.STANDBY_SUFFIX, worker + msg.RELAY_SUFFIX)
        """The holders this client publishes and unpublishes: its own, its standby and its relay copies (a hub of
        regions, ``regional_client.py``); not its CPU archive, which retention drops."""
        self.location = Location.parse(location)
        self.config = config or ClientConfig()
        self._lock = threading.RLock()
        self._held: dict[tuple[str, str, int, str], _Publication] = {}
        self._base_passes = BasePasses(self.config.timeouts.fetch_timeout_s)
        """Holdings digested ahead as the base of the next delta read (``delta_base.BasePasses``), by their keys."""
        self.preserved_bytes = 0
        """Bytes this client copied to CPU memory because it held a retained version's last reliable copy
        (``preserve_on_unpublish``), over its life: callers report the difference across an operation."""
        self._fetches: dict[tuple[str, int, str], _InFlightFetch] = {}
        self._siblings: tuple[Client, ...] = ()
        """Clients of the other hub shards sharing this one's plane (``sharded_client.py``): memory they hold
        stays registered when this one unpublishes."""
        self._closed = False
        timeouts, access = self.config.timeouts, self.config.hub
        self._hub = HubClient(hub_url, token, timeouts.request_timeout_s, timeouts.hub_retry_s,
                              on_new_instance=self._reregister, ca_file=access.tls_ca_file,
                              allow_plain_http=access.allow_plain_http, job_key=access.job_key)
        try:
            # The hub chooses the plane (planes/one_plane.py): a client left on 'auto' takes the hub's.
            self._plane = plane or factory.create(self.config.plane, worker, hub_url, timeouts.read_timeout_s,
                                                  hub_plane=self._hub_plane())
        except BaseException:
            self._hub.close()
            raise
        self.hub_url = self._hub.url
        try:
            ack = self._first_registration()
        except BaseException:  # e.g. PlaneMismatch: nothing of this client outlives a refused registration
            self._hub.close()
            if plane is None:
                self._plane.close()
            raise
        self._heartbeat_s = ack.heartbeat_s
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name=f"tensorhub-hb-{worker}", daemon=True)
        self._heartbeat.start()

    # --------------------------------------------------------------------------------- publish
    def publish(self, model: str, version: int, tensors: Mapping[str, torch.Tensor], layout: str = "hf",
                chunk_bytes: int | None = None, shard_group: str | None = None, shard_count: int = 1,
                verified: Manifest | None = None, standby: bool = False) -> Manifest:
        """Registers live tensors as a holder of (model, version, layout). No copy is made: the caller
        must not change these bytes until ``unpublish`` returns.

        ``verified``: the manifest these very bytes were fetched and checked against, chunk by chunk
        (``FetchStats.manifest``); where it has the same chunk map, its digests are reused rather than computed
        again over every byte.

        The shards of one engine (e.g. its TP ranks, each in its own layout) pass the same
        ``shard_group`` and ``shard_count``: none of them is visible until all have been published.

        ``standby``: held as ``<worker>~standby``, which the planner reads a chunk from only where no other holder
        as near has it (a publisher's copy in a region fed by another region, ``regional_client.py``).
        """
        self._check_open()
        _check_key(model, version, layout)
        if shard_group is not None:
            _check_name("shard_group", shard_group)
        if shard_count < 1 or (shard_count > 1 and shard_group is None):
            raise errors.InvalidRequest(f"shard_count must be >= 1, and > 1 only with a shard_group; "
                                        f"got {shard_count}, {shard_group!r}")
        tensors = _check_tensors(tensors)
        reuse = verified is not None and _reusable(verified, model, version, layout, tensors,
                                                   chunk_bytes or self.config.publish.chunk_bytes)
        manifest = build_manifest(model, version, layout, tensors, chunk_bytes or self.config.publish.chunk_bytes,
                                  "none" if reuse else self.config.publish.fingerprint)
        if reuse:
            manifest = dataclasses.replace(manifest, fingerprint=verified.fingerprint,
                                           chunk_digests=verified.chunk_digests, block_digests=verified.block_digests,
                                           digest_algorithm=verified.digest_algorithm)
        elif self.config.publish.chunk_digests:
            chunks, ordered = manifest.chunks(), [tensors[spec.name] for spec in manifest.tensors]
            manifest = dataclasses.replace(
                manifest, chunk_digests=chunk_digests(chunks, ordered), digest_algorithm=ALGORITHM,
                block_digests=(block_digests(chunks, manifest.tensors, ordered)
                               if self.config.publish.block_digests else ()))
        holder = self.worker + msg.STANDBY_SUFFIX if standby else self.worker
        self._publish(_Publication(holder, manifest, tensors, shard_group, shard_count))
        return manifest

    def publish_delta(self, model: str, version: int, base_version: int, layout: str = "hf",
                      mode: str = "auto", chunk_bytes: int | None = None) -> DeltaPublished:
        """Publishes the delta ``base_version`` -> ``version`` of ``layout``, computed chunk by chunk where the
        bytes live (torch ops on their device) from what this client holds of both: publish ``version`` first
        and keep ``base_version`` published, its bytes unchanged, until this returns.

        The delta is another layout of ``version`` (``delta_form.delta_layout``): the hub plans, retains and
        checks it as it does every layout, and readers that fetched it serve it onward. The hub refuses it when
        ``base_version`` is not retained, or when this worker may not create versions of ``model``.
        ``mode="auto"`` publishes it only when it is smaller than the version (``DeltaPublished.published``
        says whether it did, ``.reason`` why not); ``"on"`` whenever it can be made. ``chunk_bytes``: the delta
        form's chunk size (default: about 1/16 of the delta, at least 64 KiB, at most the version's)."""
        self._check_open()
        _check_key(model, version, layout)
        from tensorhub_verl.ros.client.delta import publish_delta

        return publish_delta(self, model, version, base_version, layout, mode, chunk_bytes)

    def _hold(self, manifest: Manifest, tensors: Mapping[str, torch.Tensor]) -> None:
        """Holds ``tensors``, checked chunk by chunk against ``manifest``'s digests, as this worker's copy of that
        version (a version built in place from a delta: ``delta.py``)."""
        self._publish(_Publication(self.worker, manifest, dict(tensors)))

    def relay(self, manifest: Manifest, tensors: Mapping[str, torch.Tensor]) -> None:
        """Holds a copy this worker fetched and checked through another hub (``manifest``: its
        ``FetchStats.manifest``, digests included) as ``<worker>~relay``: a hub of regions' first source in a
        region other than the worker's own (``regional_client.py``). No copy is made; ``unpublish`` drops it."""
        self._check_open()
        self._publish(_Publication(self.worker + msg.RELAY_SUFFIX, manifest,
                                   {spec.name: tensors[spec.name] for spec in manifest.tensors}))

    def publish_shard(self, model: str, version: int, pieces: Mapping[str, torch.Tensor], *,
                      specs: Mapping[str, tuple[Sequence[int], torch.dtype | str]], rank: int, ranks: int,
                      layout: str = "hf", group: str = "shards", chunk_bytes: int | None = None) -> Manifest:
        """Publishes this rank's rows of a version that ``ranks`` workers hold together: each holds a contiguous
        dim-0 row range of every tensor, with ``torch.chunk`` semantics (FSDP2's ``Shard(0)``; see
        ``manifest.row_range``). ``specs`` gives every tensor's full (shape, dtype), in manifest order;
        ``pieces[name]`` is this rank's rows of it (e.g. ``param.to_local()``; a 0-dim tensor: rank 0's counts).

        No copy is made: the pieces are held live until ``unpublish`` returns. The version is visible once all
        ``ranks`` ranks have published (same ``group``); readers of ``layout`` then read each chunk from the rank
        that has it, or from any reader that already fetched it. ``ranks == 1`` is a plain ``publish``.
        """
        self._check_open()
        _check_key(model, version, layout)
        _check_name("group", group)
        if not (_is_int(rank) and _is_int(ranks) and 0 <= rank < ranks <= msg.MAX_ROW_SHARDS):
            raise errors.InvalidRequest(f"publish_shard needs 0 <= rank < ranks <= {msg.MAX_ROW_SHARDS}, got "
                                        f"rank {rank!r} of {ranks!r}")
        full = full_specs(specs)
        pieces = _check_tensors(pieces)
        _check_pieces(pieces, full, rank, ranks)
        tensors = {spec.name: pieces[spec.name] for spec in full}
        if ranks == 1:
            return self.publish(model, version, tensors, layout, chunk_bytes)
        # No fingerprint: each rank holds different bytes. Each rank's chunk digests check them instead.
        manifest = Manifest(model, version, layout, full, chunk_bytes or self.config.publish.chunk_bytes,
                            row_shards=ranks)
        if self.config.publish.chunk_digests:
            starts = [shard_bytes(spec, rank, ranks)[0] for spec in full]
            chunks, own, ordered = manifest.chunks(), shard_chunks(manifest, rank), list(tensors.values())
            digests = shard_chunk_digests(chunks, full, ordered, starts, own)
            # This rank's cells of the whole tensors' block digests: the hub puts the ranks' cells together.
            blocks = block_digests(chunks, full, ordered, starts, own) if self.config.publish.block_digests else ()
            manifest = dataclasses.replace(manifest, chunk_digests=digests, digest_algorithm=ALGORITHM,
                                           block_digests=blocks)
        self._publish(_Publication(self.worker, manifest, tensors, group, ranks, rank))
        return manifest

    def _publish(self, held: "_Publication") -> None:
        if self._plane.register(held.tensors.values()):
            self._register_worker()
        self._hub.post("/v1/publish", held.message(self.worker), msg.OkReply)
        holder, manifest = held.holder, held.manifest
        with self._lock:
            self._held[(holder, manifest.model, manifest.version, manifest.layout)] = held
        logger.info("%s holds %s v%d (%s, %d bytes)", holder, manifest.model, manifest.version, manifest.layout,
                    manifest.nbytes)

    def unpublish(self, model: str, version: int, layout: str | None = None, timeout: float | None = None) -> None:
        """Stops new reads of this worker's copy and returns once no read of those bytes is in flight.

        If this is the last reliable copy of a version the hub retains, it is first copied to CPU
        memory (held by this process as ``<worker>~cpu``) so the version stays fetchable.
        """
        self._check_open()
        with self._lock:
            keys = [k for k in self._held if k[0] in self._own and k[1] == model and k[2] == version
                    and (layout is None or k[3] == layout)]
        if not keys:
            raise errors.VersionNotFound(f"{self.worker} holds no version {version} of {model!r}"
                                         f"{'' if layout is None else f' in layout {layout!r}'}")
        for key in keys:
            held = self._held[key]
            if self.config.publish.preserve_on_unpublish:
                self._preserve(held)
            self._drain(held, timeout)

    def _preserve(self, held: _Publication) -> None:
        m = held.manifest
        answer = self._hub.post("/v1/preserve", msg.PreserveQuery(holder=held.holder, model=m.model,
                                                                  version=m.version, layout=m.layout),
                                msg.PreserveAnswer)
        if not answer.must_preserve:
            return
        copy = {name: t.detach().to("cpu", copy=True) for name, t in held.tensors.items()}
        logger.info("%s held the last reliable copy of %s v%d; keeping a CPU copy (%d bytes)",
                    held.holder, m.model, m.version, m.nbytes)
        self._publish(_Publication(self.worker + ARCHIVE_SUFFIX, m, copy))
        with self._lock:
            self.preserved_bytes += m.nbytes

    def _drain(self, held: _Publication, timeout: float | None) -> None:
        m = held.manifest
        deadline = time.monotonic() + (timeout or self.config.timeouts.unpublish_timeout_s)
        while True:
            try:
                ack = self._hub.post("/v1/unpublish", msg.Unpublish(
                    worker=self.worker, holder=held.holder, model=m.model, version=m.version, layout=m.layout,
                    wait_s=min(5.0, max(0.0, deadline - time.monotonic()))), msg.UnpublishAck)
            except errors.VersionNotFound:
                break  # the hub no longer lists it (e.g. restarted): nobody can start a read of it
            if ack.drained:
                break
            if time.monotonic() >= deadline:
                raise errors.TransferFailed(f"unpublish of {m.model} v{m.version} timed out with {ack.inflight} "
                                            f"reads in flight; the bytes must stay unchanged until it returns")
        with self._lock:
            self._held.pop((held.holder, m.model, m.version, m.layout), None)
        self._base_passes.drop((held.holder, m.model, m.version, m.layout))
        still_served = set().union(*(client._served_storages() for client in (self, *self._siblings)))
        # No read of these bytes is in flight now: stop serving them, so that no grant the hub signed before
        # the unpublish reads them later (their storage may be reused or hold the next version's bytes).
        self._plane.unregister([t for t in held.tensors.values()
                                    if t.untyped_storage().data_ptr() not in still_served])

    def _served_storages(self) -> set[int]:
        """The storages of every tensor this client holds or is fetching into: its plane must keep serving them."""
        with self._lock:
            return ({t.untyped_storage().data_ptr() for h in self._held.values() for t in h.tensors.values()}
                    | {t.untyped_storage().data_ptr() for f in self._fetches.values() for t in f.tensors.values()})

    # ----------------------------------------------------------------------------------- fetch
    def manifest(self, model: str, version: int | str = "latest", layout: str = "hf") -> Manifest:
        self._check_open()
        _check_key(model, version, layout)
        reply = self._hub.get("/v1/manifest", msg.ManifestMsg,
                              params={"model": model, "version": str(version), "layout": layout})
        return manifest_from_msg(reply)

    def fetch(self, model: str, version: int | str = "latest", into: Mapping[str, torch.Tensor] | None = None,
              layout: str = "hf", hold: bool = True, timeout: float | None = None, *, have: int | None = None,
              delta: str = "auto") -> FetchStats:
        """Fills ``into`` in place with (model, version, layout); "latest" is resolved once.

        The buffers are checked against the manifest before any byte moves (ManifestMismatch).
        With ``hold`` the client then holds the version in ``into`` (peers read from it; leave the
        bytes unchanged until ``unpublish``). On failure ``into`` is unusable, and no peer reads it
        any more when this raises. ``into=None`` allocates CPU buffers (``stats.buffers``).

        ``have``: the version ``into`` holds now (in ``layout``). Where its publisher published the delta from it
        (``publish_delta``), the delta form is read (from its nearest holder, one WAN copy per datacenter) and
        applied in place: each chunk's base digest is checked before, its target digest after, and chunks that
        fail are re-read in full from holders of the version. Without such a delta (or with ``delta="off"``) the
        version is read in full. If this client holds ``have`` in ``into``, it stops serving it (waiting for
        reads in flight) before the first byte changes; if it holds another version there, DeltaRefused is
        raised and nothing is written. ``stats.delta`` (``DeltaStats``) says whether the delta was used, its
        bytes, the changed fraction, and what was re-read in full and why. With ``hold`` the client then holds
        the version and the delta form, and serves both.
        """
        if have is not None:
            from tensorhub_verl.ros.client.delta import fetch_with_delta

            return fetch_with_delta(self, model, version, into, layout, hold, timeout, have, delta)
        self._check_open()
        started = time.monotonic()
        deadline = started + (timeout or self.config.timeouts.fetch_timeout_s)
        manifest = self._through_restart(lambda: self.manifest(model, version, layout), deadline)
        if into is None:
            into = manifest.allocate("cpu")
        check_buffers(manifest, into)
        tensors = {spec.name: into[spec.name] for spec in manifest.tensors}
        stats = self._run_fetch(manifest, tensors, None, hold, started, timeout)
        stats.buffers = dict(into)
        return stats

    def fetch_slices(self, model: str, version: int | str = "latest", *, into: Mapping[str, torch.Tensor],
                     slices: Mapping[str, TensorSlice | tuple[int, int, int]] | None = None, layout: str = "hf",
                     timeout: float | None = None, have: int | None = None, delta: str = "auto") -> FetchStats:
        """Reads only parts of a version: the tensors named in ``into`` (any subset), each whole or, where
        ``slices[name] = (dim, start, length)``, only ``full.narrow(dim, start, length)``, into the contiguous
        buffer ``into[name]`` of that shape (a view of a live parameter will do).

        The same chunks as ``fetch``, planned by the hub and served by any holder of them; a chunk is read
        only for its selected bytes (``ranges.py``), so a tensor-parallel rank reads its slice and no more.
        Chunks read whole are checked against their digests and served to later readers; partly read ones
        are neither. It never holds the version (``stats.bytes``: the bytes read).

        ``have``: the version whose slices ``into`` holds now. Where the delta from it is published, it is read
        and only this reader's part applied (``delta_slices.py``): each chunk the slices touch is checked after
        against the sum of the version's block digests the slices cover, and a chunk that fails is restored and
        re-read in full. The version's slices are read in full without such a delta, with ``delta="off"``, or
        when the slices cover digest blocks only in part. The reader holds (and serves) the delta form it read;
        ``stats.delta`` says what happened, as for ``fetch(have=...)``."""
        self._check_open()
        if have is not None:
            from tensorhub_verl.ros.client.delta import check_delta_args

            check_delta_args(delta, have)
        started = time.monotonic()
        deadline = started + (timeout or self.config.timeouts.fetch_timeout_s)
        manifest = self._through_restart(lambda: self.manifest(model, version, layout), deadline)
        tensors, plan, by_index = _ranged(manifest, into, slices or {})
        if have is not None:
            from tensorhub_verl.ros.client.delta_slices import fetch_slices_with_delta

            return fetch_slices_with_delta(self, manifest, into, tensors, plan, by_index, started, timeout, have,
                                           delta)
        return self._run_fetch(manifest, tensors, plan, False, started, timeout, by_index)

    def _run_fetch(self, manifest: Manifest, tensors: dict[str, torch.Tensor], plan: ReadPlan | None, hold: bool,
                   started: float, timeout: float | None,
                   slices: Mapping[int, TensorSlice | None] | None = None,
                   on_landed: Callable[[list[int]], None] | None = None) -> FetchStats:
        """One fetch of ``tensors`` (manifest order; a ranged read's unread tensors are empty) to completion.
        ``on_landed``: told the chunks that landed, checked, as they land (``ChunkFetcher``)."""
        model, layout = manifest.model, manifest.layout
        key = (model, manifest.version, layout)
        deadline = started + (timeout or self.config.timeouts.fetch_timeout_s)
        if manifest.chunk_digests and manifest.digest_algorithm != ALGORITHM:
            raise errors.UnverifiedVersion(
                f"{model} v{manifest.version} ({layout}) carries {manifest.digest_algorithm or 'unnamed'} digests; "
                f"this reader checks {ALGORITHM} ones, so its bytes cannot be checked; refused. Run the publisher "
                f"and its readers at the same tensorhub_verl version")
        if self.config.fetch.require_digests and not (manifest.chunk_digests and all(manifest.chunk_digests)):
            raise errors.UnverifiedVersion(
                f"{model} v{manifest.version} ({layout}) has no digest of some chunk, so its bytes cannot be "
                f"checked as they land; refused. Publish with ClientConfig.publish.chunk_digests=True (the default), "
                f"or, for a trusted test only, fetch with ClientConfig.fetch.require_digests=False")
        with self._lock:
            if (self.worker, *key) in self._held:
                raise errors.InvalidRequest(f"{self.worker} already holds {model} v{manifest.version} ({layout}); "
                                            f"unpublish it before fetching it again")
            if key in self._fetches:
                raise errors.InvalidRequest(f"a fetch of {model} v{manifest.version} ({layout}) is in progress")
            self._fetches[key] = fetch = _InFlightFetch(manifest, tensors, plan=plan)
        chunks = manifest.chunks()
        stats = FetchStats(model, manifest.version, layout, chunks=len(chunks) if plan is None else len(plan.pieces))
        ok = False
        scratch = _scratch(plan, tensors.values())
        try:
            if self._plane.register([*tensors.values(), *scratch]):
                self._register_worker()
            first = self._through_restart(lambda: self._begin_fetch(fetch, want=self.config.fetch.window), deadline)
            settings = FetchSettings(self.config.fetch.window, self.config.timeouts.read_timeout_s, deadline,
                                     self.config.fetch.poll_interval_s, self.config.fetch.wan_reads_posted,
                                     straggler_factor=self.config.fetch.straggler_factor,
                                     run_target_s=self.config.fetch.run_target_s,
                                     max_run_chunks=self.config.fetch.max_run_chunks)
            fetch.fetcher = ChunkFetcher(self._plane, chunks, list(tensors.values()),
                                         lambda **kw: self._exchange(key, **kw), settings, stats,
                                         checker=ChunkChecker(manifest, plan, slices), plan=plan, first=first,
                                         scratch=scratch[0] if scratch else None, on_landed=on_landed)
            fetch.have = fetch.fetcher.landed
            try:
                fetch.fetcher.run()
            finally:
                fetch.fetcher.abandon()
            ok = True
        finally:
            if scratch:
                self._plane.unregister(scratch)
            stats.seconds = time.monotonic() - started
            self._end_fetch(key, ok, hold, stats.seconds)
        if plan is None:
            stats.manifest = manifest
        if hold:
            with self._lock:
                self._held[(self.worker, *key)] = _Publication(self.worker, manifest, tensors)
            if plan is None and self.config.fetch.base_digests_ahead == "all":
                self._digest_held_ahead(model, manifest.version, layout)
        return stats

    def _digest_held_ahead(self, model: str, version: int, layout: str) -> None:
        """Starts digesting this worker's holding of ``model`` v``version`` (``layout``) in a low-priority thread,
        as the base of its next ``fetch(have=version)`` (``delta_base.BasePasses``): a holding of whole buffers in
        CPU memory with chunk digests; anything else is left to that read."""
        key = (self.worker, model, version, layout)
        with self._lock:
            held = self._held.get(key)
        if held is not None and held.shard_rank is None and held.manifest.chunk_digests:
            self._base_passes.start(key, held.manifest, [held.tensors[s.name] for s in held.manifest.tensors])

    def _take_base_digests(self, held: "_Publication", manifest: Manifest,
                          tensors: Sequence[torch.Tensor]) -> BaseDigests | None:
        """The digests made ahead of this worker's holding ``held``, for a delta read of ``manifest`` into
        ``tensors`` (its buffers, manifest order), taken before that read unpublishes ``held`` to write them."""
        m = held.manifest
        return self._base_passes.take((held.holder, m.model, m.version, m.layout), manifest, tensors)

    # ----------------------------------------------- seams for the forms built over several clients
    # ShardedClient and RegionalClient hold one Client per hub process over one data plane; they use these, never
    # a Client's private names.
    def through_restart(self, call, deadline: float):
        """``call`` (a query of this client's hub), retried through a restart of the hub as ``fetch`` is."""
        return self._through_restart(call, deadline)

    def register_again(self) -> None:
        """Registers this worker with the hub again: after memory registered on a shared plane changed the plane's
        metadata (NIXL), so that this hub hands the new metadata to readers."""
        self._register_worker()

    def share_plane_with(self, siblings: Sequence["Client"]) -> None:
        """The other clients of this worker over the same data plane: memory this client stops serving stays
        registered while a sibling still holds it."""
        self._siblings = tuple(other for other in siblings if other is not self)

    def _through_restart(self, call, deadline: float):
        """Runs ``call``, retrying a VersionNotFound met within _RESTART_GRACE_S of a hub restart: the
        version's holders may not have re-registered with the new instance yet."""
        backoff = Backoff(deadline=deadline)
        while True:
            try:
                return call()
            except errors.VersionNotFound:
                since = self._hub.since_restart()
                if since is None or since > _RESTART_GRACE_S or not backoff.fits():
                    raise
                backoff.sleep()

    def _begin_fetch(self, fetch: _InFlightFetch, want: int = 0) -> msg.ExchangeReply | None:
        """Registers the fetch at the hub; with ``want``, the reply brings its first assignments too."""
        m, plan = fetch.manifest, fetch.plan
        ranged = {} if plan is None else {"need": sorted(plan.pieces), "unserved": sorted(plan.unserved)}
        reply = self._hub.post("/v1/fetch/begin", msg.BeginFetch(
            worker=self.worker, holder=self.worker, model=m.model, version=m.version, layout=m.layout,
            digest=m.digest, regions=_regions(fetch.tensors, m, ranged=plan), have=sorted(fetch.have), want=want,
            **ranged), msg.BeginFetchReply)
        return reply.first

    def _exchange(self, key, *, completed, failed, want, wait_s, known_sources,
                  run_chunks=1) -> msg.ExchangeReply:
        model, version, layout = key
        request = msg.Exchange(worker=self.worker, holder=self.worker, model=model, version=version, layout=layout,
                               completed=completed, failed=failed, want=want, wait_s=wait_s,
                               known_sources=known_sources, run_chunks=run_chunks)
        backoff = Backoff()
        while True:
            try:
                return self._hub.post("/v1/fetch/exchange", request, msg.ExchangeReply,
                                      timeout=self.config.timeouts.request_timeout_s + wait_s)
            except (UnknownFetch, errors.VersionNotFound):
                # The hub restarted and lost this fetch. Begin it again with what has landed; if the
                # holders have not re-registered yet, wait for them (the fetch deadline still applies).
                with self._lock:
                    fetch = self._fetches.get(key)
                if fetch is None or fetch.fetcher is None or time.monotonic() > fetch.fetcher.deadline:
                    raise
                try:
                    self._begin_fetch(fetch)
                except errors.VersionNotFound:
                    backoff.sleep()

    def _end_fetch(self, key, ok: bool, hold: bool, seconds: float) -> None:
        model, version, layout = key
        try:
            deadline = time.monotonic() + self.config.timeouts.unpublish_timeout_s
            while True:
                ack = self._hub.post("/v1/fetch/end", msg.EndFetch(
                    worker=self.worker, holder=self.worker, model=model, version=version, layout=layout,
                    ok=ok, hold=hold, seconds=seconds, wait_s=5.0), msg.EndFetchAck)
                if ack.drained or time.monotonic() > deadline:
                    break
        except errors.TensorHubError as e:
            if ok:
                raise
            logger.warning("could not close the failed fetch of %s at the hub: %s", key, e)
        finally:
            with self._lock:
                self._fetches.pop(key, None)

    # --------------------------------------------------------------------------------- queries
    def versions(self, model: str, layout: str | None = None) -> dict[int, list[str]]:
        self._check_open()
        return self._hub.versions(model, layout)

    def latest(self, model: str, layout: str = "hf") -> int | None:
        return max(self.versions(model, layout), default=None)

    def wait_for_version(self, model: str, newer_than: int | None = None, layout: str = "hf",
                         timeout: float = 30.0) -> int:
        """Blocks until a version newer than ``newer_than`` (any, if None) is published; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no version of {model!r} newer than {newer_than} within {timeout} s")
            version = self._hub.wait(model, newer_than, layout, min(remaining, 10.0))
            if version is not None:
                return version

    def flip_report(self, model: str, *, serving: int | None, pull: int | None = None, outcome: str | None = None,
                    min_replica_fraction: float = 1.0) -> msg.FlipReply:
        """Reports this worker, a rollout replica, for the fleet flip: what it serves, and the version of its last
        staged pull with how it ended (``messages.PullOutcome``: staged, check_failed, unavailable). The reply
        says whether it flips now, and to which version."""
        self._check_open()
        return self._hub.post(msg.FLIP_REPORT_PATH, msg.FlipReport(
            worker=self.worker, model=model, serving=serving, pull=pull, outcome=outcome,
            min_replica_fraction=min_replica_fraction), msg.FlipReply)

    def status(self) -> dict:
        """The hub's ``/v1/status`` (``messages.StatusReply``) as plain JSON data."""
        return self._hub.get("/v1/status", msg.StatusReply).model_dump()

    def holdings(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return list(dict.fromkeys((m, v, lay) for (h, m, v, lay) in self._held if h in self._own))

    # ------------------------------------------------------------------------- worker lifecycle
    def _register_worker(self) -> msg.WorkerAck:
        metadata = base64.b64encode(self._plane.metadata()).decode()
        grant_key = self._plane.grant_key
        ack = self._hub.post("/v1/workers/register", msg.RegisterWorker(
            worker=self.worker, location=msg.LocationMsg(**self.location.as_dict()), spot=self.config.hub.spot,
            agent_name=self._plane.agent_name, agent_metadata_b64=metadata,
            grant_key_b64=base64.b64encode(grant_key).decode() if grant_key else None,
            preconnect=self._plane.preconnect_peers, plane=self._plane.name), msg.WorkerAck)
        self._preconnect(ack.peers)
        return ack

    def _preconnect(self, peers: Sequence[msg.PeerMsg]) -> None:
        """Hands the peers the hub named at registration to the data plane, which connects to them in the
        background: a joiner's first fetch then finds its connections open (bench transport's first read)."""
        for peer in peers:
            try:
                self._plane.load_peer(peer.agent_name, base64.b64decode(peer.agent_metadata_b64, validate=True))
            except (ReadError, binascii.Error, ValueError) as e:
                logger.info("%s: not connecting early to %s: %s", self.worker, peer.worker, e)

    def _hub_plane(self) -> str | None:
        """The hub's data plane when this client's plane is left on 'auto' (None: it names its own)."""
        return self._hub.plane() if self.config.plane.kind == "auto" else None

    def _first_registration(self) -> msg.WorkerAck:
        """A worker restarted under its old id waits until the hub frees the id (the old process's heartbeat
        timeout), up to ``hub_retry_s``; without the old credential nobody can take a live id over."""
        deadline = time.monotonic() + self.config.timeouts.hub_retry_s
        backoff = Backoff(first_s=0.5, max_s=0.5)  # the id frees at a heartbeat timeout: no sooner by doubling
        for attempt in itertools.count():
            try:
                return self._register_worker()
            except errors.NotOwner as e:
                if time.monotonic() > deadline:
                    raise
                if attempt == 0:
                    logger.warning("%s: %s; retrying for up to %.0f s", self.worker, e,
                                   self.config.timeouts.hub_retry_s)
                backoff.sleep()
        raise AssertionError("unreachable")

    def _reregister(self) -> None:
        """After a hub restart: the worker, then every holding, then every fetch in progress."""
        self._register_worker()
        with self._lock:
            held = list(self._held.values())
            fetches = list(self._fetches.values())
        held.sort(key=lambda h: h.manifest.layout.startswith("delta/"))  # a delta after the versions it joins
        for h in held:
            try:
                self._hub.post("/v1/publish", h.message(self.worker), msg.OkReply)
            except (errors.NotModelOwner, errors.DeltaRefused) as e:
                # A copy of another job's model, re-published before that job's own holders came back: the
                # new hub takes copies only of versions already visible. Likewise a delta whose base version
                # has not re-registered yet. This one serves nobody until fetched again.
                logger.warning("%s could not re-register %s v%d: %s", self.worker, h.manifest.model,
                               h.manifest.version, e)
        for f in fetches:
            try:
                self._begin_fetch(f)
            except errors.VersionNotFound:
                pass  # its holders have not re-registered yet; the fetch loop begins it again
        logger.info("%s re-registered %d holdings and %d fetches", self.worker, len(held), len(fetches))

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                ack = self._hub.post("/v1/workers/heartbeat", params={"worker": self.worker}, reply=msg.WorkerAck)
            except UnknownWorker:
                continue  # _reregister failed part-way; try again next beat
            except errors.TensorHubError as e:
                logger.warning("heartbeat to %s failed: %s", self.hub_url, e)
                continue
            except Exception:  # the heartbeat thread must survive anything
                logger.exception("heartbeat failed")
                continue
            for key in ack.release:
                self._release(key)

    def _release(self, key: msg.HoldingKey) -> None:
        with self._lock:
            held = [h for (holder, m, v, lay), h in self._held.items()
                    if (m, v, lay) == (key.model, key.version, key.layout)]
        for h in held:
            logger.info("%s drops %s v%d (%s): outside the retention window", h.holder, key.model, key.version,
                        key.layout)
            try:
                self._drain(h, None)
            except errors.TensorHubError as e:
                logger.warning("dropping %s failed: %s", key, e)

    def close(self, timeout: float = 30.0) -> None:
        """Unpublishes everything this client holds (waiting for in-flight reads), then stops."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._heartbeat.join(timeout)
        self._hub.shorten_retries(5.0)
        with self._lock:
            held = list(self._held.values())
        for h in held:
            try:
                self._drain(h, timeout)
            except errors.TensorHubError as e:
                logger.warning("%s could not unpublish %s v%d on close: %s", self.worker, h.manifest.model,
                               h.manifest.version, e)
        self._base_passes.close()
        try:
            self._hub.post("/v1/workers/leave", params={"worker": self.worker}, reply=msg.OkReply)
        except errors.TensorHubError as e:  # the hub forgets us at our heartbeat timeout anyway
            logger.debug("%s could not say goodbye to the hub: %s", self.worker, e)
        self._hub.close()
        self._plane.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.InvalidRequest(f"client {self.worker} is closed; connect again")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise errors.ConfigError(f"{what} {value!r} must be 1-256 characters of letters, digits and ._:/@~+=-")


def _check_key(model: str, version: object, layout: str) -> None:
    _check_name("model", model)
    _check_name("layout", layout)
    if version == "latest":
        return
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise errors.InvalidRequest(f"version must be a non-negative int or 'latest', got {version!r}")


def _check_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not isinstance(tensors, Mapping) or not tensors:
        raise errors.InvalidRequest("publish needs a non-empty dict of name -> torch.Tensor")
    for name, t in tensors.items():
        if not isinstance(name, str) or not name or len(name) > 1024:
            raise errors.InvalidRequest(f"tensor name {name!r} must be a non-empty string of at most 1024 chars")
        if not isinstance(t, torch.Tensor):
            raise errors.InvalidRequest(f"{name!r} is a {type(t).__name__}, not a torch.Tensor")
        if not t.is_contiguous():
            raise errors.InvalidRequest(f"tensor {name!r} is not contiguous; publish a contiguous tensor "
                                        f"(and keep it alive: it is held, not copied)")
        if dtype_name(t.dtype) not in _DTYPES:
            raise errors.InvalidRequest(f"tensor {name!r} has unsupported dtype {t.dtype}")
        if t.device.type not in ("cpu", "cuda"):
            raise errors.InvalidRequest(f"tensor {name!r} is on {t.device}; only CPU and CUDA memory can be held")
    return dict(tensors)


def _regions(tensors: Mapping[str, torch.Tensor], manifest: Manifest, shard_rank: int | None = None,
             ranged: ReadPlan | None = None) -> list[msg.RegionMsg]:
    """Where each tensor lives here; a row shard's region starts at its first byte of the tensor, a ranged
    reader's at the first byte it holds as one range (none: an empty region)."""
    out = []
    for i, spec in enumerate(manifest.tensors):
        region = Region.of_tensor(tensors[spec.name])
        if ranged is not None:
            start, nbytes = ranged.regions.get(i, (0, 0))
            out.append(msg.RegionMsg(addr=region.addr if nbytes else 0, device=region.device, mem=region.mem,
                                     offset=start, nbytes=nbytes))
            continue
        if shard_rank is None:
            out.append(msg.RegionMsg(addr=region.addr, device=region.device, mem=region.mem))
            continue
        start, stop = shard_bytes(spec, shard_rank, manifest.row_shards)
        out.append(msg.RegionMsg(addr=region.addr, device=region.device, mem=region.mem, offset=start,
                                 nbytes=stop - start))
    return out


def _reusable(verified: Manifest, model: str, version: int, layout: str, tensors: Mapping[str, torch.Tensor],
              chunk_bytes: int) -> bool:
    """Whether ``verified`` describes these tensors as this publish would, with a checked digest of every chunk."""
    specs = tuple(TensorSpec.of(name, t) for name, t in tensors.items())
    return ((verified.model, verified.version, verified.layout, verified.row_shards) == (model, version, layout, 1)
            and verified.digest == layout_digest(layout, specs, chunk_bytes)
            and verified.digest_algorithm == ALGORITHM and bool(verified.chunk_digests)
            and all(verified.chunk_digests))


def _ranged(manifest: Manifest, into: Mapping[str, torch.Tensor],
            slices: Mapping[str, TensorSlice | tuple[int, int, int]]
            ) -> tuple[dict[str, torch.Tensor], ReadPlan, dict[int, TensorSlice | None]]:
    """Checks a ranged read's buffers against the manifest, before any byte moves; returns one buffer per
    tensor in manifest order (an empty one for each tensor not read), the read plan, and each read tensor's slice
    (None: whole) by index."""
    if not isinstance(into, Mapping) or not into:
        raise errors.InvalidRequest("fetch_slices needs into: a non-empty dict of tensor name -> buffer")
    index = {spec.name: i for i, spec in enumerate(manifest.tensors)}
    for name in [*into, *slices]:
        if name not in index:
            raise errors.ManifestMismatch(f"tensor {name!r} is not in version {manifest.version} ({manifest.layout})",
                                          tensor=name)
    extra = [name for name in slices if name not in into]
    if extra:
        raise errors.ManifestMismatch(f"slices names {extra[0]!r} but into has no buffer for it", tensor=extra[0])
    tensors, runs, by_index = {}, {}, {}
    for i, spec in enumerate(manifest.tensors):
        buf = into.get(spec.name)
        if buf is None:
            tensors[spec.name] = torch.empty(0, dtype=torch.uint8)
            continue
        sl = slices.get(spec.name)
        shape = spec.shape if sl is None else TensorSlice.of(sl).shape(spec)
        check_dtype(manifest, spec, buf, shape)
        if tuple(buf.shape) != shape or dtype_name(buf.dtype) != spec.dtype or not buf.is_contiguous():
            raise errors.ManifestMismatch(
                f"tensor {spec.name!r}: buffer is {list(buf.shape)} {dtype_name(buf.dtype)}"
                f"{'' if buf.is_contiguous() else ' (not contiguous)'}, the selection is {list(shape)} {spec.dtype}, "
                f"contiguous", tensor=spec.name)
        tensors[spec.name] = buf
        runs[i] = Runs.whole(spec) if sl is None else Runs.of_slice(spec, TensorSlice.of(sl))
        by_index[i] = None if sl is None else TensorSlice.of(sl)
    return tensors, widen(manifest, plan_reads(manifest, runs), by_index), by_index


def _scratch(plan: ReadPlan | None, tensors) -> list[torch.Tensor]:
    """Where a ranged read's edges land (``block_edges.py``): on the device of its buffers; none without edges."""
    if plan is None or not plan.edge_bytes:
        return []
    device = next((t.device for t in tensors if t.numel()), torch.device("cpu"))
    return [torch.empty(plan.edge_bytes, dtype=torch.uint8, device=device)]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def full_specs(specs: Mapping[str, tuple[Sequence[int], torch.dtype | str]]) -> tuple[TensorSpec, ...]:
    """The whole tensors' specs from name -> (shape, dtype), as every rank must pass them alike."""
    if not isinstance(specs, Mapping) or not specs:
        raise errors.InvalidRequest("publish_shard needs specs: a non-empty dict of name -> (full shape, dtype)")
    out = []
    for name, spec in specs.items():
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = dtype_from_name(dtype if isinstance(dtype, str) else dtype_name(dtype))
        except (TypeError, ValueError, errors.ManifestMismatch) as e:
            raise errors.InvalidRequest(f"specs[{name!r}] must be (full shape, dtype), got {spec!r}: {e}") from None
        if any(d < 0 for d in shape):
            raise errors.InvalidRequest(f"specs[{name!r}] has a negative dimension: {list(shape)}")
        numel = 1
        for d in shape:
            numel *= d
        out.append(TensorSpec(name, shape, dtype_name(dtype), numel * dtype.itemsize))
    return tuple(out)


def _check_pieces(pieces: Mapping[str, torch.Tensor], specs: tuple[TensorSpec, ...], rank: int, ranks: int) -> None:
    """Each piece must be exactly this rank's rows of its tensor: a wrong slice would publish wrong bytes."""
    names = {spec.name for spec in specs}
    extra = [name for name in pieces if name not in names]
    if extra:
        raise errors.ManifestMismatch(f"piece {extra[0]!r} is not in specs; specs names every tensor of the "
                                      f"version, with its full shape", tensor=extra[0])
    for spec in specs:
        piece = pieces.get(spec.name)
        if piece is None:
            raise errors.ManifestMismatch(f"rank {rank} passes no piece of tensor {spec.name!r}; pass its rows "
                                          f"(an empty tensor if it has none)", tensor=spec.name)
        if dtype_name(piece.dtype) != spec.dtype:
            raise errors.ManifestMismatch(f"tensor {spec.name!r}: piece is {dtype_name(piece.dtype)}, specs say "
                                          f"{spec.dtype}", tensor=spec.name)
        if not spec.shape:
            expected = ()  # a 0-dim tensor is whole on every rank; rank 0's copy is the one served
        else:
            start, stop = row_range(spec.shape[0], rank, ranks)
            expected = (stop - start, *spec.shape[1:])
        if tuple(piece.shape) != expected:
            rows = f"rows [{start}, {stop}) of {spec.shape[0]}" if spec.shape else "the whole 0-dim tensor"
            raise errors.ManifestMismatch(
                f"tensor {spec.name!r}: rank {rank} of {ranks} holds {rows} (torch.chunk of dim 0, as FSDP2 "
                f"shards), shape {list(expected)}; got a piece of shape {list(piece.shape)}: pass "
                f"full[start:stop] or an FSDP2 Shard(0) parameter's to_local()", tensor=spec.name)
