"""The reader's loop: ask the hub for chunk assignments, post one-sided reads, report what landed.

          hub                      reader                         holders
           |  <-- exchange(done, failed, want) --  |                    |
           |  -- assignments (lease, chunk, src) ->|                    |
           |                                       |== READ chunk ====> | (holder or a reader still filling)
           |  <-- exchange(done=[lease]) ---------  |                    |
           |      (the reader now serves that chunk to later readers)    |

A read that fails or outlives ``read_timeout_s`` is reported as failed; the hub re-plans that chunk
on another source. Only chunks whose reads completed and were not revoked count as landed.
"""

from __future__ import annotations

import base64
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.manifest import Chunk
from tensorhub_verl.ros.transport import Copy, ReadError, Region, Transport

logger = logging.getLogger("tensorhub_verl.ros.fetch")

_STARVED_RETRY_S = 0.02


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
    chunks: int = 0
    buffers: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    """The filled buffers (those passed as ``into``, or allocated when it was None)."""

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds else 0.0


@dataclass(slots=True)
class _Read:
    handle: object
    chunk: int
    source: msg.SourceInfo
    started: float


@dataclass(slots=True)
class FetchSettings:
    window: int
    read_timeout_s: float
    deadline: float
    poll_interval_s: float


class ChunkFetcher:
    """Runs one fetch to completion. ``exchange`` is the hub call (bound to model, version, layout)."""

    def __init__(self, transport: Transport, chunks: tuple[Chunk, ...], local: list[torch.Tensor],
                 exchange: Callable[..., msg.ExchangeReply], settings: FetchSettings, stats: FetchStats):
        self._transport = transport
        self._chunks = chunks
        self._local = [Region.of_tensor(t) for t in local]
        self._exchange = exchange
        self._settings = settings
        self.stats = stats
        self.landed: set[int] = set()
        self._sources: dict[str, msg.SourceInfo] = {}
        self._inflight: dict[int, _Read] = {}

    def run(self) -> None:
        """Reads until every chunk has landed. Hub exchanges run on a helper thread, one at a time,
        so that reads keep being polled and posted while the hub answers."""
        with ThreadPoolExecutor(1, thread_name_prefix="tensorhub-exchange") as hub:
            self._run(hub)

    def _run(self, hub: ThreadPoolExecutor) -> None:
        done: list[int] = []
        failed: list[msg.FailedRead] = []
        finished: dict[int, _Read] = {}
        pending: Future | None = None
        reported: list[int] = []
        asked_for = 0
        starved_until = 0.0
        total = len(self._chunks)
        window = self._settings.window
        while True:
            now = time.monotonic()
            if now > self._settings.deadline:
                raise TransferFailed(f"fetch timed out with {len(self.landed)} of {total} chunks landed")
            self._poll(now, done, failed, finished)
            if pending is not None and pending.done():
                reply = pending.result()
                pending = None
                self._book(reported, finished, set(reply.revoked))
                if len(self.landed) == total and not self._inflight:
                    return
                if reply.unservable and not reply.assignments and not self._inflight and not done:
                    raise TransferFailed(f"no holder can serve chunk(s) {reply.unservable[:8]} of "
                                         f"{self.stats.model} v{self.stats.version} ({self.stats.layout}); "
                                         f"every source failed or left")
                for info in reply.sources:
                    self._transport.load_peer(info.agent_name, _b64(info.agent_metadata_b64))
                    self._sources[info.holder] = info
                for a in reply.assignments:
                    self._post(a, failed)
                if len(reply.assignments) < asked_for:
                    starved_until = time.monotonic() + _STARVED_RETRY_S
                continue
            if pending is None:
                room = window - len(self._inflight)
                # Report every landed chunk at once (it becomes a source for the readers behind this one:
                # the sooner, the faster a version spreads) and every failure; ask for work when half the
                # window is free. Exchanges run beside the reads, so this costs the reads nothing.
                report = bool(failed) or bool(done)
                ask = (room * 2 >= window or not self._inflight) and now >= starved_until
                if report or ask:
                    idle = not self._inflight and not done and not failed
                    reported, asked_for = done, max(room, 0)
                    pending = hub.submit(self._exchange, completed=done, failed=failed, want=asked_for,
                                         wait_s=0.2 if idle else 0.0, known_sources=self._known())
                    done, failed = [], []
                    continue
            time.sleep(self._settings.poll_interval_s)

    def _poll(self, now: float, done: list[int], failed: list[msg.FailedRead], finished: dict[int, _Read]) -> None:
        for lease, read in list(self._inflight.items()):
            state = self._transport.poll(read.handle)
            if state == "PROC" and now - read.started > self._settings.read_timeout_s:
                state, reason = "ERR", f"no answer within {self._settings.read_timeout_s} s"
            else:
                reason = "transfer error"
            if state == "PROC":
                continue
            self._transport.release(read.handle)
            del self._inflight[lease]
            if state == "DONE":
                done.append(lease)
                finished[lease] = read
            else:
                failed.append(msg.FailedRead(lease=lease, reason=f"{read.source.holder}: {reason}"))
                self.stats.failed_reads += 1

    def _book(self, done: list[int], finished: dict[int, _Read], revoked: set[int]) -> None:
        for lease in done:
            read = finished.pop(lease)
            if lease in revoked:
                self.stats.revoked_reads += 1
                continue
            chunk = self._chunks[read.chunk]
            self.landed.add(read.chunk)
            self.stats.bytes += chunk.nbytes
            self.stats.sources[read.source.worker] = self.stats.sources.get(read.source.worker, 0) + chunk.nbytes
            if read.source.partial:
                self.stats.partial_source_bytes += chunk.nbytes

    def _post(self, a: msg.AssignmentMsg, failed: list[msg.FailedRead]) -> None:
        source = self._sources.get(a.source)
        if source is None:
            failed.append(msg.FailedRead(lease=a.lease, reason=f"hub sent no address info for {a.source}"))
            return
        copies = []
        for seg in self._chunks[a.chunk].segments:
            local, remote = self._local[seg.tensor], source.regions[seg.tensor]
            copies.append(Copy(local.addr + seg.offset, local.device, local.mem,
                               remote.addr + seg.offset, remote.device, remote.mem, seg.length))
        try:
            handle = self._transport.start_read(source.agent_name, copies)
        except ReadError as e:
            failed.append(msg.FailedRead(lease=a.lease, reason=str(e)))
            self.stats.failed_reads += 1
            return
        self._inflight[a.lease] = _Read(handle, a.chunk, source, time.monotonic())

    @property
    def deadline(self) -> float:
        return self._settings.deadline

    def _known(self) -> dict[str, int]:
        return {holder: info.generation for holder, info in self._sources.items()}

    def abandon(self) -> None:
        """Cancels the reads still in flight (after an error)."""
        for read in self._inflight.values():
            self._transport.release(read.handle)
        self._inflight.clear()


def _b64(text: str) -> bytes:
    return base64.b64decode(text)
