"""The reader's loop: ask the hub for chunk assignments, post one-sided reads, report what landed.

          hub                      reader                         holders
           |  <-- exchange(done, failed, want) --  |                    |
           |  -- assignments (lease, chunk, src) ->|                    |
           |                                       |== READ chunk ====> | (holder or a reader still filling)
           |  <-- exchange(done=[lease]) ---------  |                    |
           |      (the reader now serves that chunk to later readers)    |

A read that fails or outlives ``read_timeout_s`` is reported as failed; the hub re-plans that chunk
on another source. Only chunks whose reads completed and were not revoked count as landed.

Faults cost a re-plan, never a raw data-plane exception: a source whose metadata cannot be loaded (dead,
garbage, or naming another agent) is not used, and its assignments are reported failed at once. While
reads are in flight the loop exchanges at least every ``refresh_s``, so that when the hub drops a
source (missed heartbeats: frozen or dead) the reads it owed are cancelled within about one heartbeat
timeout, instead of each waiting out ``read_timeout_s``.

A straggler (a holder on a slow or congested link) does not hold a fetch hostage: a read that takes more
than ``straggler_factor`` times the median of this fetch's landed reads at the same distance (and at least
``straggler_floor_s``) is abandoned and re-planned like a timed-out one; the hub then plans around that
source for a moment. Each chunk is abandoned this way at most once, so a fetch whose only remaining
source is slow still finishes (its second read of a chunk waits up to ``read_timeout_s``). An abandoned
read may still land later: it writes the bytes that every holder of the version holds.

A lease may cover a run of consecutive chunks from one source (``AssignmentMsg.count``): the fetcher posts one
read per chunk of the run (the data planes see chunk reads, as before; over TCP each carries the run's grant,
which signs all of the run's ranges) and reports the lease complete once all of them landed, digests checked.
When one of them fails, the rest of the run is cancelled and the lease reported failed with the chunks that did
land (``FailedRead.landed``): the hub books those and plans the others again. The run length this reader asks
for is sized from its measured throughput so that a run takes about ``run_target_s`` of its link: 1 on slow
links (so chunks spread through a swarm one by one, as they land), up to ``max_run_chunks`` at RDMA speeds, where
a lease per chunk would make thousands of hub exchanges per update.

A seed posts its WAN reads ``wan_reads_posted`` at a time and queues the rest of its WAN assignments
here, starting the next the moment one lands. Over TCP, reads posted together share one stream and land
together at the end; one after another, each chunk lands (and starts spreading through the datacenter)
as early as the WAN allows, and the queued next read keeps the WAN busy without a hub round trip.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.integrity import ChunkChecker, local_views
from tensorhub_verl.ros.manifest import Chunk, Manifest, Segment
from tensorhub_verl.ros.ranges import Piece, ReadPlan
from tensorhub_verl.ros.topology import Distance
from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant, ReadError, ReadHandle, ReadState, Region

logger = logging.getLogger("tensorhub_verl.ros.fetch")

_STARVED_RETRY_S = 0.02
_THROUGHPUT_READS = 256
_MIN_SPAN_S = 0.002
"""Reads that land at once (posted together) do not make the measured throughput infinite."""
_IDLE_WAIT_S = 0.05
"""Longest sleep of a fetch loop that is woken by its reads and exchanges (timeouts and stragglers are checked
at least this often)."""


@dataclass(slots=True)
class FetchStats:
    model: str
    version: int
    layout: str
    bytes: int = 0
    seconds: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)
    """worker id -> bytes read from it."""
    partial_source_bytes: int = 0
    """Bytes read from readers that were themselves still filling (pipelined replication)."""
    failed_reads: int = 0
    revoked_reads: int = 0
    corrupt_reads: int = 0
    """Reads whose bytes did not match the chunk's digest: re-read elsewhere, the source reported."""
    cancelled_reads: int = 0
    """Reads still in flight when the hub revoked their lease (e.g. it dropped their source): abandoned
    and re-planned without waiting for their timeout."""
    chunks: int = 0
    exchanges: int = 0
    """Hub exchanges this fetch made (each costs the hub and the reader a request)."""
    timeline: list[tuple[float, float, int, str]] = field(default_factory=list, repr=False)
    """(posted, landed, chunk, source worker) per landed chunk in landing order, monotonic times: where a
    fetch spent its time."""
    exchange_log: list[tuple[float, float, int, int]] = field(default_factory=list, repr=False)
    """(sent, answered, leases asked for, leases granted) per hub exchange, monotonic times: how long the
    fetch waited for its plans, and how often the hub had nothing for it."""
    buffers: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    """The filled buffers (those passed as ``into``, or allocated when it was None)."""
    manifest: Manifest | None = field(default=None, repr=False)
    """Of a whole fetch: the manifest whose digests every landed chunk was checked against (a re-publish of
    these bytes in this layout reuses them: ``Client.publish(verified=...)``)."""

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds else 0.0


@dataclass(slots=True)
class _Read:
    handle: ReadHandle
    chunk: int
    source: msg.SourceInfo
    started: float
    distance: Distance
    landed: float = 0.0


@dataclass(slots=True)
class _Run:
    """One lease's reads: one chunk, or a run of them from one source."""

    source: msg.SourceInfo
    distance: Distance
    reads: dict[int, _Read]
    """chunk -> its read, while in flight."""
    landed: list[_Read] = field(default_factory=list)
    """Reads that landed, digests checked."""
    last_landed: float = 0.0
    """When its latest read landed: the chunks of a run are read one after another, so a chunk's read is timed
    from then (or from its post, if later), not from the post of the whole run."""

    @property
    def crosses_wan(self) -> bool:
        return self.distance == Distance.WAN


@dataclass(slots=True)
class FetchSettings:
    window: int
    read_timeout_s: float
    deadline: float
    poll_interval_s: float
    wan_reads_posted: int = 1
    """WAN reads posted at once; further WAN assignments wait in a local queue."""
    refresh_s: float = 0.5
    """With reads in flight, exchange with the hub at least this often, to learn of revoked leases."""
    report_s: float = 0.02
    """A landed chunk is reported within this long (with the next exchange, or one of its own), or sooner,
    once half a window of them has landed: an exchange per landed chunk cost each 256 MiB TCP fetch as
    much CPU time in HTTP as in moving its bytes."""
    straggler_factor: float = 4.0
    """A read slower than this many times the median landed read at its distance is abandoned (0: never)."""
    straggler_floor_s: float = 1.0
    """...but never before this long."""
    straggler_samples: int = 4
    """...and only once this many reads at that distance have landed (a median to compare with)."""
    run_target_s: float = 0.0
    """Ask for runs of chunks that take about this long at the measured throughput (0: a lease per chunk)."""
    max_run_chunks: int = 1
    """Longest run asked for (at most ``messages.MAX_RUN_CHUNKS``)."""
    wan_lead: float = 0.1
    """The queued WAN read is posted this share of a WAN read's median duration before the one in flight is due
    to land, so the WAN goes from one chunk to the next without idling (0: posted when it lands)."""


class ChunkFetcher:
    """Runs one fetch to completion. ``exchange`` is the hub call (bound to model, version, layout).

    With a ``plan`` (a ranged read, ``ranges.py``) only the plan's chunks are read, each only for its pieces,
    into ``local`` buffers that hold the selected bytes back to back. ``checker`` says which landed chunks are
    checked and against what (``integrity.ChunkChecker``: whole chunks by their digest, chunks read in part by
    the block digests their slices cover, where the manifest has them); None: nothing is checked."""

    def __init__(self, transport: DataPlane, chunks: tuple[Chunk, ...], local: list[torch.Tensor],
                 exchange: Callable[..., msg.ExchangeReply], settings: FetchSettings, stats: FetchStats,
                 checker: ChunkChecker | None = None, plan: ReadPlan | None = None,
                 first: msg.ExchangeReply | None = None, scratch: torch.Tensor | None = None):
        """``first``: the assignments that came with the fetch's begin (``BeginFetchReply.first``), if any.
        ``scratch``: where the plan's edges land (``block_edges.py``), ``plan.edge_bytes`` bytes."""
        self._transport = transport
        self._first = first
        self._chunks = chunks
        self._plan = plan
        self._local = [Region.of_tensor(t) for t in local]
        self._checker = checker
        self._local_tensors = local
        self._scratch = None if scratch is None else Region.of_tensor(scratch)
        self._scratch_view = None if scratch is None else local_views([scratch])[0]
        self._views: list | None = None
        """Byte views of ``local``, made when a landed chunk is first checked."""
        self._exchange = exchange
        self._settings = settings
        self.stats = stats
        self.landed: set[int] = set()
        self._sources: dict[str, msg.SourceInfo] = {}
        self._regions: dict[str, dict[int, msg.RegionMsg]] = {}
        """holder -> the tensor addresses the hub has sent so far (only those of leases it granted)."""
        self._unusable: dict[str, str] = {}
        """holder -> why its metadata could not be loaded (until the hub sends a new generation)."""
        self._inflight: dict[int, _Run] = {}
        """lease -> its reads (``window`` leases at most)."""
        self._throughput = _Throughput()
        self._chunk_bytes = max(1, sum(c.nbytes for c in chunks) // max(1, len(chunks)))
        self._durations: dict[Distance, list[float]] = {}
        """distance -> durations of the landed reads at that distance, sorted (for the median)."""
        self._abandoned: set[int] = set()
        """Chunks whose read was abandoned as a straggler once already: their next read is not."""
        self._wan_queue: deque[msg.AssignmentMsg] = deque()
        self._wan_landed = 0.0
        """When this fetch's latest WAN read landed: WAN reads share one stream, so one posted ahead is timed from
        then (its own wire time), not from its post."""
        self._wake = threading.Event()
        """Set when a read finishes (transports that land reads on their own threads) or an exchange returns."""

    def run(self) -> None:
        """Reads until every chunk has landed. Hub exchanges run on a helper thread, one at a time,
        so that reads keep being polled and posted while the hub answers."""
        with ThreadPoolExecutor(1, thread_name_prefix="tensorhub-exchange") as hub:
            self._run(hub)

    def _run(self, hub: ThreadPoolExecutor) -> None:
        done: list[int] = []
        failed: list[msg.FailedRead] = []
        finished: dict[int, _Run] = {}
        """Leases reported (done, or failed with chunks that landed) and not yet booked."""
        pending: Future | None = None
        reported: list[int] = []
        asked_for = 0
        sent = time.monotonic()
        if self._first is not None:  # the begin's reply was this fetch's first exchange
            pending, asked_for = Future(), self._settings.window
            pending.set_result(self._first)
            self.stats.exchanges += 1
        starved_until = 0.0
        last_exchange = time.monotonic()
        unreported_since = 0.0
        """When the oldest landed chunk not yet reported landed (0: none)."""
        total = len(self._chunks) if self._plan is None else len(self._plan.pieces)
        window = self._settings.window
        while True:
            now = time.monotonic()
            if now > self._settings.deadline:
                raise TransferFailed(f"fetch timed out with {len(self.landed)} of {total} chunks landed")
            self._poll(now, done, failed, finished)
            self._post_wan_ahead(now, failed)
            if done and not unreported_since:
                unreported_since = now
            if pending is not None and pending.done():
                reply = pending.result()
                pending = None
                self.stats.exchange_log.append((sent, now, asked_for, len(reply.assignments)))
                revoked = set(reply.revoked)
                self._book(reported, finished, revoked)
                self._cancel(revoked)
                if len(self.landed) == total and not self._inflight:
                    return
                if (reply.unservable and not reply.assignments and not self._inflight and not self._wan_queue
                        and not done):
                    raise TransferFailed(f"no holder can serve chunk(s) {reply.unservable[:8]} of "
                                         f"{self.stats.model} v{self.stats.version} ({self.stats.layout}); "
                                         f"every source failed or left")
                for info in reply.sources:
                    self._load(info)
                for a in reply.assignments:
                    self._assign(a, failed)
                if len(reply.assignments) < asked_for:
                    starved_until = time.monotonic() + _STARVED_RETRY_S
                continue
            if pending is None:
                room = window - len(self._inflight) - len(self._wan_queue)
                # Report landed chunks soon (each becomes a source for the readers behind this one: the
                # sooner, the faster a version spreads), but in batches of half a window, or after
                # ``report_s``: each exchange costs CPU in this process and the hub that the reads need.
                # Failures go at once; ask for work when half the window is free.
                # The last landings go at once: nothing is left to batch them with.
                last = bool(done) and not self._inflight and not self._wan_queue
                report = bool(failed) or last or len(done) * 2 >= window or (
                    bool(done) and now - unreported_since >= self._settings.report_s)
                ask = (room * 2 >= window or not self._inflight) and now >= starved_until
                stale = bool(self._inflight) and now - last_exchange >= self._settings.refresh_s
                if report or ask or stale:
                    idle = not self._inflight and not done and not failed
                    reported, asked_for = done + [f.lease for f in failed if f.landed], max(room, 0)
                    last_exchange = sent = now
                    self.stats.exchanges += 1
                    pending = hub.submit(self._exchange, completed=done, failed=failed, want=asked_for,
                                         wait_s=0.2 if idle else 0.0, known_sources=self._known(),
                                         run_chunks=self._run_chunks())
                    pending.add_done_callback(lambda _: self._wake.set())
                    done, failed = [], []
                    unreported_since = 0.0
                    continue
            self._sleep(now, unreported_since)

    def _sleep(self, now: float, unreported_since: float) -> None:
        """Until something may have changed: a read finished or an exchange returned (the transport and the
        exchange wake this loop), or a landed chunk's report is due. A transport that does not wake it is polled
        every ``poll_interval_s`` (over TCP, 0.5 ms polls cost the reader about 0.03 CPU s/GB of its 0.3)."""
        if not self._transport.lands_on_own_threads:
            time.sleep(self._settings.poll_interval_s)
            return
        timeout = _IDLE_WAIT_S
        if (ahead := self._wan_ahead_at()) is not None:
            timeout = min(timeout, max(0.0, ahead - now))
        if unreported_since:
            timeout = min(timeout, max(0.0, unreported_since + self._settings.report_s - now))
        self._wake.wait(timeout)
        self._wake.clear()  # a read that finishes after this is seen by the next poll, which follows at once

    def _poll(self, now: float, done: list[int], failed: list[msg.FailedRead], finished: dict[int, _Run]) -> None:
        for lease, run in list(self._inflight.items()):
            failure = None
            for read in list(run.reads.values()):  # in chunk order: a run's reads land about in order
                if failure := self._poll_read(now, run, read):
                    break
                if read.chunk in run.reads:
                    break  # in flight: the ones behind it are polled once it landed (a run's polls stay O(1))
            if failure is None and run.reads:
                continue
            del self._inflight[lease]
            if failure is None:
                done.append(lease)
                finished[lease] = run
            else:
                for read in run.reads.values():  # the rest of a failed run: the hub plans it again
                    self._transport.release(read.handle)
                reason, corrupt = failure
                landed = [read.chunk for read in run.landed]
                failed.append(msg.FailedRead(lease=lease, reason=reason, corrupt=corrupt, landed=landed))
                if landed:
                    finished[lease] = run
            if run.crosses_wan and self._wan_queue and self._wan_posted() < self._settings.wan_reads_posted:
                self._post(self._wan_queue.popleft(), failed)

    def _wan_posted(self) -> int:
        return sum(run.crosses_wan for run in self._inflight.values())

    def _wan_ahead_at(self) -> float | None:
        """When to post the queued WAN read: ``wan_lead`` of a WAN read's median duration before the one in flight
        is due to land (None: nothing queued, nothing posted, or no WAN read landed yet to time it by)."""
        if not self._wan_queue or not self._settings.wan_lead or Distance.WAN not in self._durations:
            return None
        posted = [read for run in self._inflight.values() if run.crosses_wan for read in run.reads.values()]
        if len(posted) != self._settings.wan_reads_posted:
            return None
        median = self._median(posted[0])
        return max(self._wan_landed, *(read.started for read in posted)) + median * (1 - self._settings.wan_lead)

    def _post_wan_ahead(self, now: float, failed: list[msg.FailedRead]) -> None:
        """Posts the queued WAN read shortly before the one in flight lands: posted at its landing, the next read
        leaves the WAN idle for a round trip and two thread wake-ups (on a 100 Mbit/s WAN, 11 ms per 2 MiB chunk)."""
        ahead = self._wan_ahead_at()
        if ahead is not None and now >= ahead:
            self._post(self._wan_queue.popleft(), failed)

    def _poll_read(self, now: float, run: _Run, read: _Read) -> tuple[str, bool] | None:
        """Polls one chunk read of ``run``; a finished one leaves ``run.reads``. (why, corrupt) if it failed."""
        state = self._transport.poll(read.handle)
        reason = "transfer error"
        took = now - max(read.started, run.last_landed, self._wan_landed if run.crosses_wan else 0.0)
        if state is ReadState.IN_PROGRESS and took > self._settings.read_timeout_s:
            state, reason = ReadState.FAILED, f"no answer within {self._settings.read_timeout_s} s"
        elif state is ReadState.IN_PROGRESS and took > self._straggler_limit(read):
            self._abandoned.add(read.chunk)
            state = ReadState.FAILED
            reason = f"straggler: {took:.1f} s, its peers' reads took {self._median(read):.2f} s"
        if state is ReadState.IN_PROGRESS:
            return None
        corrupt = state is ReadState.DONE and self._checks(read.chunk) and \
            self._digest(read) != self._checker.expected(read.chunk)
        self._transport.release(read.handle)
        del run.reads[read.chunk]
        if corrupt:
            # Checked before the chunk is reported: a reader never serves or claims unverified bytes.
            logger.error("chunk %d read from %s (worker %s) does not match its digest; reading it elsewhere",
                         read.chunk, read.source.holder, read.source.worker)
            self.stats.corrupt_reads += 1
            self.stats.failed_reads += 1
            return f"{read.source.holder}: chunk {read.chunk} fails its digest", True
        if state is ReadState.DONE:
            read.landed = now
            bisect.insort(self._durations.setdefault(read.distance, []), took)
            run.last_landed = now
            if run.crosses_wan:
                self._wan_landed = now
            self._throughput.add(now, sum(p.length for p in self._pieces(read.chunk)))
            run.landed.append(read)
            return None
        self.stats.failed_reads += 1
        return f"{read.source.holder}: {reason}", False

    def _run_chunks(self) -> int:
        """The run length to ask for: about ``run_target_s`` of this reader's measured throughput."""
        if self._settings.max_run_chunks <= 1 or self._settings.run_target_s <= 0:
            return 1
        chunks = self._throughput.bytes_per_s() * self._settings.run_target_s / self._chunk_bytes
        return max(1, min(self._settings.max_run_chunks, int(chunks)))

    def _checks(self, chunk: int) -> bool:
        """Whether the chunk's bytes are checked against its digest (or its blocks') when they land."""
        return self._checker is not None and self._checker.checks(chunk)

    def _digest(self, read: _Read) -> str:
        """The digest of what landed of the chunk, computed where the local buffers are (integrity.py)."""
        if self._views is None:
            self._views = local_views(self._local_tensors)
        return self._checker.landed(self._pieces(read.chunk), self._views, self._edges(read.chunk),
                                    self._scratch_view)

    def _edges(self, chunk: int) -> tuple[Piece, ...]:
        edges = None if self._plan is None or self._scratch is None else self._plan.edges
        return edges.get(chunk, ()) if edges else ()

    def _straggler_limit(self, read: _Read) -> float:
        landed = self._durations.get(read.distance, ())
        if (not self._settings.straggler_factor or read.chunk in self._abandoned
                or len(landed) < self._settings.straggler_samples):
            return float("inf")
        return max(self._settings.straggler_floor_s, self._settings.straggler_factor * self._median(read))

    def _median(self, read: _Read) -> float:
        landed = self._durations[read.distance]
        return landed[len(landed) // 2]

    def _book(self, reported: list[int], finished: dict[int, _Run], revoked: set[int]) -> None:
        for lease in reported:
            run = finished.pop(lease)
            if lease in revoked:
                self.stats.revoked_reads += len(run.landed)
                continue
            for read in run.landed:
                nbytes = sum(p.length for p in self._pieces(read.chunk))
                self.landed.add(read.chunk)
                self.stats.timeline.append((read.started, read.landed, read.chunk, read.source.worker))
                self.stats.bytes += nbytes
                self.stats.sources[read.source.worker] = self.stats.sources.get(read.source.worker, 0) + nbytes
                if read.source.partial:
                    self.stats.partial_source_bytes += nbytes

    def _load(self, info: msg.SourceInfo) -> None:
        """Loads a source's data-plane metadata (new generation) and merges the addresses sent with it;
        an unusable source is remembered, not raised."""
        known = self._sources.get(info.holder)
        if not info.agent_metadata_b64:
            if known is not None and known.generation == info.generation:
                self._regions[info.holder].update(info.regions)
            else:  # metadata of this generation never arrived or failed to load
                self._unusable.setdefault(info.holder, f"no usable metadata for generation {info.generation}")
            return
        try:
            self._transport.load_peer(info.agent_name, base64.b64decode(info.agent_metadata_b64, validate=True))
        except (ReadError, binascii.Error, ValueError) as e:
            logger.warning("source %s (worker %s) is unusable: %s; its reads go elsewhere", info.holder,
                           info.worker, e)
            self._sources.pop(info.holder, None)
            self._regions.pop(info.holder, None)
            self._unusable[info.holder] = str(e)[:500]
            return
        self._unusable.pop(info.holder, None)
        self._sources[info.holder] = info
        self._regions[info.holder] = dict(info.regions)

    def _cancel(self, revoked: set[int]) -> None:
        """Abandons in-flight or queued reads whose leases the hub revoked; the hub re-plans their chunks."""
        for lease in revoked & self._inflight.keys():
            run = self._inflight.pop(lease)
            for read in run.reads.values():
                self._transport.release(read.handle)
            self.stats.cancelled_reads += len(run.reads)
            logger.info("read of chunk(s) %s from %s cancelled: the hub revoked its lease",
                        sorted(run.reads)[:8], run.source.holder)
        if revoked and self._wan_queue:
            self._wan_queue = deque(a for a in self._wan_queue if a.lease not in revoked)

    def _assign(self, a: msg.AssignmentMsg, failed: list[msg.FailedRead]) -> None:
        if a.distance == Distance.WAN:
            if self._wan_posted() >= self._settings.wan_reads_posted:
                self._wan_queue.append(a)
                return
        self._post(a, failed)

    def _post(self, a: msg.AssignmentMsg, failed: list[msg.FailedRead]) -> None:
        source = self._sources.get(a.source)
        if source is None:
            reason = self._unusable.get(a.source, "the hub sent no address info")
            failed.append(msg.FailedRead(lease=a.lease, reason=f"{a.source}: {reason}"))
            self.stats.failed_reads += 1
            return
        regions = self._regions[a.source]
        run = range(a.chunk, a.chunk + a.count)
        needed = {p.tensor for c in run for p in self._pieces(c)} | \
            {seg.tensor for c in run if not self._checkable(c) for seg in self._chunks[c].segments}
        missing = sorted(t for t in needed if t not in regions)
        if missing:
            failed.append(msg.FailedRead(lease=a.lease, reason=f"{a.source}: no address for tensor {missing[0]}"))
            self.stats.failed_reads += 1
            return
        reads = _Run(source, Distance(a.distance), {})
        try:
            grant = self._grant(a, regions) if self._transport.needs_grant else None
            for chunk in run:
                copies = []
                for p in self._pieces(chunk):
                    local, remote = self._local[p.tensor], regions[p.tensor]
                    seg = Segment(p.tensor, p.offset, p.length)
                    copies.append(Copy(local.addr + p.local, local.device, local.mem,
                                       remote_address(remote, seg, self._tensor_nbytes(p.tensor)), remote.device,
                                       remote.mem, p.length))
                for p in self._edges(chunk):  # the bytes that complete the blocks the slices cover in part
                    remote, seg = regions[p.tensor], Segment(p.tensor, p.offset, p.length)
                    copies.append(Copy(self._scratch.addr + p.local, self._scratch.device, self._scratch.mem,
                                       remote_address(remote, seg, self._tensor_nbytes(p.tensor)), remote.device,
                                       remote.mem, p.length))
                landing = {"wake": self._wake} if self._transport.lands_on_own_threads else {}
                handle = self._transport.start_read(source.agent_name, copies, grant, **landing)
                reads.reads[chunk] = _Read(handle, chunk, source, time.monotonic(), reads.distance)
        except ReadError as e:
            for read in reads.reads.values():
                self._transport.release(read.handle)
            failed.append(msg.FailedRead(lease=a.lease, reason=str(e)))
            self.stats.failed_reads += 1
            return
        self._inflight[a.lease] = reads

    def _grant(self, a: msg.AssignmentMsg, regions: dict[int, msg.RegionMsg]) -> Grant:
        """The lease's grant. For a run, or parts of a chunk, it signs the whole segments of every chunk of the
        lease (``grants.run_ranges``); else the copies' own ranges."""
        if a.count == 1 and self._checkable(a.chunk):
            return Grant(a.grant)
        return Grant(a.grant, tuple(grants.run_ranges([
            [(remote_address(regions[seg.tensor], seg, self._tensor_nbytes(seg.tensor)), seg.length)
             for seg in self._chunks[c].segments] for c in range(a.chunk, a.chunk + a.count)])))

    def _pieces(self, chunk: int) -> tuple[Piece, ...]:
        if self._plan is not None:
            return self._plan.pieces[chunk]
        return tuple(Piece(seg.tensor, seg.offset, seg.length, seg.offset) for seg in self._chunks[chunk].segments)

    def _tensor_nbytes(self, tensor: int) -> int:
        """The whole tensor's bytes (a ranged read's buffer holds fewer)."""
        return self._local[tensor].nbytes if self._plan is None else self._plan.tensor_nbytes[tensor]

    def _checkable(self, chunk: int) -> bool:
        return self._plan is None or chunk in self._plan.whole

    @property
    def deadline(self) -> float:
        return self._settings.deadline

    def _known(self) -> dict[str, int]:
        return {holder: info.generation for holder, info in self._sources.items()}

    def abandon(self) -> None:
        """Cancels the reads still in flight (after an error)."""
        for run in self._inflight.values():
            for read in run.reads.values():
                self._transport.release(read.handle)
        self._inflight.clear()
        self._wan_queue.clear()


class _Throughput:
    """Bytes per second landed over this fetch's last ``_THROUGHPUT_READS`` chunk reads (the bytes landed after
    the oldest of them, over the time since it landed)."""

    __slots__ = ("_landed",)

    def __init__(self) -> None:
        self._landed: deque[tuple[float, int]] = deque(maxlen=_THROUGHPUT_READS)

    def add(self, now: float, nbytes: int) -> None:
        self._landed.append((now, nbytes))

    def bytes_per_s(self) -> float:
        if len(self._landed) < 2:
            return 0.0
        span = self._landed[-1][0] - self._landed[0][0]
        return (sum(n for _, n in self._landed) - self._landed[0][1]) / max(span, _MIN_SPAN_S)


def remote_address(region: msg.RegionMsg, seg: Segment, tensor_nbytes: int) -> int:
    """Where ``seg`` lives in a holder that holds bytes [region.offset, region.offset + region.nbytes) of the
    tensor (a row shard holds only its rows). Raises ReadError for bytes outside them: never read beyond."""
    end = tensor_nbytes if region.nbytes is None else region.offset + region.nbytes
    if seg.offset < region.offset or seg.offset + seg.length > end:
        raise ReadError(f"tensor {seg.tensor}: the holder's region covers bytes [{region.offset}, {end}), not "
                        f"[{seg.offset}, {seg.offset + seg.length})")
    return region.addr + (seg.offset - region.offset)
