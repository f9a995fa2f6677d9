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

A lease may cover a run of consecutive chunks from one source (``AssignmentMsg.count``): the fetcher posts it as
one read of the run's merged ranges (``run_reads.py``: a run over one tensor is one copy; NIXL: one transfer of
few descriptors; TCP: one request under the run's grant) and reports the lease complete once all of it landed,
each chunk's digest checked over its bytes: as they land, where the plane reports how far a read got
(``DataPlane.reports_progress``), else when the read completes. A chunk that fails its digest, or a read that
fails, ends the run: the lease is reported failed with the chunks that landed intact (``FailedRead.landed``; of
a failed read without progress reports, those whose digests check out), which the hub books, and it plans the
others again. The run length this reader asks
for is sized from its measured throughput so that a run takes about ``run_target_s`` of its link: 1 on slow
links (so chunks spread through a swarm one by one, as they land), up to ``max_run_chunks`` at RDMA speeds, where
a lease per chunk would make thousands of hub exchanges per update.

A seed's WAN reads cross one after another, so each chunk lands (and starts spreading through the datacenter)
as early as the WAN allows: reads posted together on separate streams would share the WAN and land together at
the end. On a plane that keeps reads in order (``DataPlane.in_order_reads``: TCP) the seed posts every WAN lease
it holds at once, in order, on one stream: the holder sends them back to back and the WAN never waits for a post
or a hub round trip between chunks. On another plane it posts ``wan_reads_posted`` at a time and queues the rest
here, posting the next shortly before the one in flight is due to land (``wan_lead``).
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

from tensorhub_verl.errors import DigestMismatch, TransferFailed
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.integrity import ChunkChecker, local_views
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest, Segment
from tensorhub_verl.ros.wire.ranges import Piece, ReadPlan
from tensorhub_verl.ros.client.run_reads import SCRATCH, ChunkSpans
from tensorhub_verl.ros.wire.topology import Distance
from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant, ReadError, ReadHandle, ReadState, Region

logger = logging.getLogger("tensorhub_verl.ros.fetch")

_STARVED_RETRY_S = 0.02
_THROUGHPUT_READS = 256
_MIN_SPAN_S = 0.002
"""Reads that land at once (posted together) do not make the measured throughput infinite."""
_IN_FLIGHT = object()
"""What ``_poll_run`` returns for a run whose read is still in flight."""
_IDLE_WAIT_S = 0.05
"""Longest sleep of a fetch loop that is woken by its reads and exchanges (timeouts and stragglers are checked
at least this often)."""
_POLL_BACKOFF = 8
"""A fetch polling a transport that does not wake it (``poll_interval_s``) doubles its sleep after each poll that
found nothing new, up to this many times ``poll_interval_s``, and goes back to it once a poll finds progress: a
slow phase (chunks waited for from peers, a long WAN read) costs few polls, a fast one keeps its latency."""


def next_poll_s(current: float, base: float, progressed: bool) -> float:
    """The next sleep of a fetch that polls its transport: ``base`` after a poll that found progress, else twice
    ``current``, up to ``_POLL_BACKOFF`` times ``base``."""
    return base if progressed else min(current * 2, base * _POLL_BACKOFF)


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
    landings: list[tuple[float, list[int], list[float], str]] = field(default_factory=list, repr=False)
    """(posted, chunks, when each landed, source worker) per booked read, in booking order (``timeline``)."""
    exchange_log: list[tuple[float, float, int, int]] = field(default_factory=list, repr=False)
    """(sent, answered, leases asked for, leases granted) per hub exchange, monotonic times: how long the
    fetch waited for its plans, and how often the hub had nothing for it."""
    buffers: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    """The filled buffers (those passed as ``into``, or allocated when it was None)."""
    manifest: Manifest | None = field(default=None, repr=False)
    """Of a whole fetch: the manifest whose digests every landed chunk was checked against (a re-publish of
    these bytes in this layout reuses them: ``Client.publish(verified=...)``)."""
    delta: "DeltaStats | None" = field(default=None, repr=False)
    """Of a ``fetch(have=...)``: whether the version came as a delta, its bytes, and what was re-read in full and
    why (``delta.DeltaStats``); None for any other fetch."""

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def timeline(self) -> list[tuple[float, float, int, str]]:
        """(posted, landed, chunk, source worker) per landed chunk, monotonic times: where a fetch spent its time.
        Made when asked for: kept per read while the fetch runs, so it allocates nothing per chunk."""
        return [(posted, at, chunk, worker) for posted, chunks, landed, worker in self.landings
                for chunk, at in zip(chunks, landed)]


@dataclass(slots=True)
class _Run:
    """One lease's read: one chunk, or a run of them from one source, posted as one read of their merged ranges
    (several where the plane caps a read's copies: ``parts``, whose bytes follow each other)."""

    first: int
    count: int
    source: msg.SourceInfo
    distance: Distance
    started: float
    parts: list[tuple[ReadHandle, int]]
    """(read, bytes of the run before it) per posted read, in chunk order."""
    ends: list[int]
    """The run's bytes at the end of each of its chunks: chunk ``first + k`` is whole once ``ends[k]`` landed."""
    seen: int = 0
    """Chunks (from the first) whose bytes are all in and were checked."""
    last_landed: float = 0.0
    """When ``seen`` last grew: the chunks of a run land one after another, so the next is timed from then."""
    intact: list[int] = field(default_factory=list)
    """Chunks that landed, digests checked, in order."""
    landed_at: list[float] = field(default_factory=list)
    """When each of ``intact`` was seen to land."""
    corrupt: int = 0
    """Chunks whose bytes failed their digest."""

    @property
    def crosses_wan(self) -> bool:
        return self.distance == Distance.WAN

    @property
    def pending(self) -> int:
        return self.count - self.seen


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
                 first: msg.ExchangeReply | None = None, scratch: torch.Tensor | None = None,
                 on_landed: Callable[[list[int]], None] | None = None):
        """``first``: the assignments that came with the fetch's begin (``BeginFetchReply.first``), if any.
        ``scratch``: where the plan's edges land (``block_edges.py``), ``plan.edge_bytes`` bytes.
        ``on_landed``: called on this fetch's thread with the chunks of each read as they are booked (landed,
        checked, not revoked: their bytes no longer change); it should hand them on and return at once."""
        self._transport = transport
        self._first = first
        self._chunks = chunks
        self._plan = plan
        self._local = [Region.of_tensor(t) for t in local]
        self._checker = checker
        self._local_tensors = local
        self._scratch = None if scratch is None else Region.of_tensor(scratch)
        self._scratch_view = None if scratch is None else local_views([scratch])[0]
        self._spans = ChunkSpans(chunks, plan, scratch is not None)
        """Each chunk's spans and byte counts, computed once per fetch (``run_reads.py``)."""
        self._views: list | None = None
        """Byte views of ``local``, made when a landed chunk is first checked."""
        self._exchange = exchange
        self._on_landed = on_landed
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
        self._chunk_bytes = max(1, sum([s.length for c in chunks for s in c.segments]) // max(1, len(chunks)))
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
        self._poll_s = settings.poll_interval_s
        """The sleep between polls of a transport that does not wake this fetch (``_sleep``)."""

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
            before = len(self.landed) + len(done) + len(failed)
            self._poll(now, done, failed, finished)
            progressed = len(self.landed) + len(done) + len(failed) != before
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
                    where = (f"chunk(s) {reply.unservable[:8]} of {self.stats.model} v{self.stats.version} "
                             f"({self.stats.layout})")
                    if self.stats.corrupt_reads:  # bytes were read and failed their digests: the check failed
                        raise DigestMismatch(f"no holder can serve {where}: {self.stats.corrupt_reads} read(s) "
                                             f"landed bytes that fail the chunk digests and every other source "
                                             f"failed or left")
                    raise TransferFailed(f"no holder can serve {where}; every source failed or left")
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
                    # Nothing left in flight: the exchange that reports the last landings also waits for work
                    # (the hub parks it when it has none), instead of a second exchange asking again.
                    idle = not self._inflight and not self._wan_queue
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
            self._sleep(now, unreported_since, progressed, starved_until if pending is None else 0.0)

    def _sleep(self, now: float, unreported_since: float, progressed: bool, ask_at: float) -> None:
        """Until something may have changed: a read finished or an exchange returned (the transport and the
        exchange wake this loop), a landed chunk's report is due, or (``ask_at``, when no exchange is pending) the
        hub may be asked again for the work its last reply lacked. A transport that does not wake it is polled
        every ``poll_interval_s`` while polls find progress, less often while they do not (``_POLL_BACKOFF``);
        an exchange's reply still wakes the loop at once."""
        timeout = _IDLE_WAIT_S
        if not self._transport.lands_on_own_threads:
            self._poll_s = timeout = next_poll_s(self._poll_s, self._settings.poll_interval_s, progressed)
        if (ahead := self._wan_ahead_at()) is not None:
            timeout = min(timeout, max(0.0, ahead - now))
        if unreported_since:
            timeout = min(timeout, max(0.0, unreported_since + self._settings.report_s - now))
        if ask_at > now:
            timeout = min(timeout, ask_at - now)
        self._wake.wait(timeout)
        self._wake.clear()  # a read that finishes after this is seen by the next poll, which follows at once

    def _poll(self, now: float, done: list[int], failed: list[msg.FailedRead], finished: dict[int, _Run]) -> None:
        for lease, run in list(self._inflight.items()):
            failure = self._poll_run(now, run)
            if failure is _IN_FLIGHT:
                continue
            del self._inflight[lease]
            self._release(run)
            if failure is None:
                done.append(lease)
                finished[lease] = run
            else:  # the rest of a failed run: the hub plans it again
                reason, corrupt = failure
                failed.append(msg.FailedRead(lease=lease, reason=reason, corrupt=corrupt, landed=list(run.intact)))
                if run.intact:
                    finished[lease] = run
            if run.crosses_wan and self._wan_queue and self._wan_posted() < self._settings.wan_reads_posted:
                self._post(self._wan_queue.popleft(), failed)

    def _wan_posted(self) -> int:
        return sum(run.crosses_wan for run in self._inflight.values())

    def _wan_ahead_at(self) -> float | None:
        """When to post the queued WAN read: ``wan_lead`` of a WAN chunk read's median duration before the one in
        flight is due to land (None: nothing queued, nothing posted, or no WAN read landed yet to time it by)."""
        if not self._wan_queue or not self._settings.wan_lead or Distance.WAN not in self._durations:
            return None
        posted = [run for run in self._inflight.values() if run.crosses_wan]
        if len(posted) != self._settings.wan_reads_posted:
            return None
        median = self._median(Distance.WAN)
        due = max(max(run.started, run.last_landed, self._wan_landed) + median * run.pending for run in posted)
        return due - median * self._settings.wan_lead

    def _post_wan_ahead(self, now: float, failed: list[msg.FailedRead]) -> None:
        """Posts the queued WAN read shortly before the one in flight lands: posted at its landing, the next read
        leaves the WAN idle for a round trip and two thread wake-ups."""
        ahead = self._wan_ahead_at()
        if ahead is not None and now >= ahead:
            self._post(self._wan_queue.popleft(), failed)

    def _poll_run(self, now: float, run: _Run) -> "tuple[str, bool] | None | object":
        """Polls a run's read and checks the chunks whose bytes are all in. ``_IN_FLIGHT``, None when every chunk
        landed intact, or (why, corrupt) when the run failed (``run.intact``: what landed of it)."""
        transport = self._transport
        states = [transport.poll(handle) for handle, _ in run.parts]
        if all(state is ReadState.DONE for state in states):
            self._check_landed(now, run, run.ends[-1])
            return (self._corrupt(run), True) if run.corrupt else None
        failed = ReadState.FAILED in states
        if transport.reports_progress:
            upto = 0
            for (handle, before), state in zip(run.parts, states):
                if state is not ReadState.DONE:
                    upto = before + transport.landed_bytes(handle)
                    break
            self._check_landed(now, run, upto)
        elif failed:  # what landed of it is unknown: the chunks whose digests check out did
            self._check_all(now, run)
        if run.corrupt:
            return self._corrupt(run), True
        if failed:
            self.stats.failed_reads += 1
            why = next(transport.failure(h) for (h, _), st in zip(run.parts, states) if st is ReadState.FAILED)
            return f"{run.source.holder}: {why or 'transfer error'}", False
        if self._queued_behind(run):
            return _IN_FLIGHT  # its bytes wait for the in-order reads ahead of it: timed once they landed
        took = now - self._timed_from(run)
        reason = None
        if took > self._settings.read_timeout_s:
            reason = f"no answer within {self._settings.read_timeout_s} s"
        elif took > self._straggler_limit(run):
            self._abandoned.update(range(run.first + run.seen, run.first + run.count))
            reason = f"straggler: {took:.1f} s, its peers' reads took {self._median(run.distance):.2f} s per chunk"
        if reason is None:
            return _IN_FLIGHT
        self.stats.failed_reads += 1
        return f"{run.source.holder}: {reason}", False

    def _check_landed(self, now: float, run: _Run, upto: int) -> None:
        """Checks the run's chunks whose bytes are all in (the first ``upto`` bytes of the run landed): those that
        match their digests (or have none to check) landed; a reader never serves or claims unverified bytes."""
        first_new, ends = run.seen, run.ends
        if first_new >= run.count or upto < ends[first_new]:
            return
        last = bisect.bisect_right(ends, upto, lo=first_new)
        counted, nbytes = self._spans.counted_bytes, 0
        for chunk in range(run.first + first_new, run.first + last):
            if self._intact(run, chunk):
                run.intact.append(chunk)
                nbytes += counted(chunk)
        run.landed_at.extend([now] * (len(run.intact) - len(run.landed_at)))
        run.seen = last
        if nbytes:
            bisect.insort(self._durations.setdefault(run.distance, []), (now - self._timed_from(run)) / (last - first_new))
            self._throughput.add(now, nbytes)
        run.last_landed = now
        if run.crosses_wan:
            self._wan_landed = now

    def _queued_behind(self, run: _Run) -> bool:
        """An in-order WAN read behind another WAN read in flight from its source (``_inflight`` keeps the order
        of posting)."""
        if not run.crosses_wan or not self._transport.in_order_reads:
            return False
        holder = run.source.holder
        return next(r for r in self._inflight.values() if r.crosses_wan and r.source.holder == holder) is not run

    def _timed_from(self, run: _Run) -> float:
        """When the run's next chunk started moving: its post, its previous chunk's landing, or (WAN reads share one
        stream) the fetch's latest WAN landing."""
        return max(run.started, run.last_landed, self._wan_landed if run.crosses_wan else 0.0)

    def _check_all(self, now: float, run: _Run) -> None:
        """After a failed read whose plane cannot say what landed: every chunk not yet seen that has a digest is
        checked, and those that match landed (their bytes are the version's)."""
        for chunk in range(run.first + run.seen, run.first + run.count):
            if self._checks(chunk) and self._intact(run, chunk):
                run.intact.append(chunk)
                run.landed_at.append(now)
        run.seen = run.count

    def _intact(self, run: _Run, chunk: int) -> bool:
        """Whether the chunk's landed bytes match its digest (or it has none to check); counts it corrupt if not."""
        if self._checker is None or not self._checker.checks(chunk) or self._digest(chunk) == self._checker.expected(chunk):
            return True
        logger.error("chunk %d read from %s (worker %s) does not match its digest; reading it elsewhere",
                     chunk, run.source.holder, run.source.worker)
        run.corrupt += 1
        self.stats.corrupt_reads += 1
        return False

    def _corrupt(self, run: _Run) -> str:
        self.stats.failed_reads += 1
        return f"{run.source.holder}: {run.corrupt} chunk(s) of its run fail their digests"

    def _run_chunks(self) -> int:
        """The run length to ask for: about ``run_target_s`` of this reader's measured throughput."""
        if self._settings.max_run_chunks <= 1 or self._settings.run_target_s <= 0:
            return 1
        chunks = self._throughput.bytes_per_s() * self._settings.run_target_s / self._chunk_bytes
        return max(1, min(self._settings.max_run_chunks, int(chunks)))

    def _checks(self, chunk: int) -> bool:
        """Whether the chunk's bytes are checked against its digest (or its blocks') when they land."""
        return self._checker is not None and self._checker.checks(chunk)

    def _digest(self, chunk: int) -> str:
        """The digest of what landed of the chunk, computed where the local buffers are (integrity.py)."""
        if self._views is None:
            self._views = local_views(self._local_tensors)
        return self._checker.landed(self._pieces(chunk), self._views, self._edges(chunk), self._scratch_view)

    def _edges(self, chunk: int) -> tuple[Piece, ...]:
        edges = None if self._plan is None or self._scratch is None else self._plan.edges
        return edges.get(chunk, ()) if edges else ()

    def _straggler_limit(self, run: _Run) -> float:
        """How long the run's next chunk may take: ``straggler_factor`` times the median chunk read at its distance
        (times the chunks still due, where the plane says nothing until the whole read is in)."""
        landed = self._durations.get(run.distance, ())
        if (not self._settings.straggler_factor or run.first + run.seen in self._abandoned
                or len(landed) < self._settings.straggler_samples):
            return float("inf")
        due = 1 if self._transport.reports_progress else run.pending
        return max(self._settings.straggler_floor_s, self._settings.straggler_factor * self._median(run.distance) * due)

    def _median(self, distance: Distance) -> float:
        landed = self._durations[distance]
        return landed[len(landed) // 2]

    def _book(self, reported: list[int], finished: dict[int, _Run], revoked: set[int]) -> None:
        for lease in reported:
            run = finished.pop(lease)
            if lease in revoked:
                self.stats.revoked_reads += len(run.intact)
                continue
            worker, counted = run.source.worker, self._spans.counted_bytes
            self.landed.update(run.intact)
            if self._on_landed is not None and run.intact:
                self._on_landed(list(run.intact))
            self.stats.landings.append((run.started, run.intact, run.landed_at, worker))
            nbytes = sum(counted(chunk) for chunk in run.intact)
            self.stats.bytes += nbytes
            self.stats.sources[worker] = self.stats.sources.get(worker, 0) + nbytes
            if run.source.partial:
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
            self._release(run)
            self.stats.cancelled_reads += run.pending
            logger.info("read of %d chunk(s) from %d, from %s, cancelled: the hub revoked its lease", run.pending,
                        run.first + run.seen, run.source.holder)
        if revoked and self._wan_queue:
            self._wan_queue = deque(a for a in self._wan_queue if a.lease not in revoked)

    def _assign(self, a: msg.AssignmentMsg, failed: list[msg.FailedRead]) -> None:
        if a.distance == Distance.WAN and not self._transport.in_order_reads:
            if self._wan_posted() >= self._settings.wan_reads_posted:
                self._wan_queue.append(a)
                return
        self._post(a, failed)

    def _post(self, a: msg.AssignmentMsg, failed: list[msg.FailedRead]) -> None:
        """Posts the lease as one read of its chunks' merged ranges (``run_reads.py``)."""
        source = self._sources.get(a.source)
        if source is None:
            reason = self._unusable.get(a.source, "the hub sent no address info")
            failed.append(msg.FailedRead(lease=a.lease, reason=f"{a.source}: {reason}"))
            self.stats.failed_reads += 1
            return
        regions = self._regions[a.source]
        transport = self._transport
        parts, ends = self._spans.run(a.chunk, a.count, transport.max_copies)
        whole_segments = transport.needs_grant and not (a.count == 1 and self._checkable(a.chunk))
        needed = {span[0] for part in parts for span in part.spans}
        if whole_segments:  # the grant signs the chunks' whole segments
            needed |= self._spans.segment_tensors(a.chunk, a.count)
        missing = sorted(t for t in needed if t not in regions)
        if missing:
            failed.append(msg.FailedRead(lease=a.lease, reason=f"{a.source}: no address for tensor {missing[0]}"))
            self.stats.failed_reads += 1
            return
        run = _Run(a.chunk, a.count, source, Distance(a.distance), time.monotonic(), [], ends)
        try:
            grant = self._grant(a, regions, whole_segments) if transport.needs_grant else None
            landing = {"wake": self._wake} if transport.lands_on_own_threads else {}
            if run.crosses_wan and transport.in_order_reads:
                landing["in_order"] = True
            for part in parts:
                copies = [self._copy(span, regions) for span in part.spans]
                run.parts.append((transport.start_read(source.agent_name, copies, grant, **landing), part.start))
        except ReadError as e:
            self._release(run)
            failed.append(msg.FailedRead(lease=a.lease, reason=str(e)))
            self.stats.failed_reads += 1
            return
        self._inflight[a.lease] = run

    def _copy(self, span: list[int], regions: dict[int, msg.RegionMsg]) -> Copy:
        tensor, offset, length, local, at = span
        into = self._scratch if local == SCRATCH else self._local[local]
        remote = regions[tensor]
        return Copy(into.addr + at, into.device, into.mem,
                    remote_address(remote, Segment(tensor, offset, length), self._tensor_nbytes(tensor)),
                    remote.device, remote.mem, length)

    def _release(self, run: _Run) -> None:
        for handle, _ in run.parts:
            self._transport.release(handle)

    def _grant(self, a: msg.AssignmentMsg, regions: dict[int, msg.RegionMsg], whole_segments: bool) -> Grant:
        """The lease's grant. For a run, or parts of a chunk, it signs the whole segments of every chunk of the
        lease (``grants.run_ranges``); else the copies' own ranges."""
        if not whole_segments:
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
            self._release(run)
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
