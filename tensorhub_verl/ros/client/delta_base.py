"""A reader's base chunks digested off the apply's critical path, so that a chunk's payload is applied on
landing without a full pass over the chunk's bytes: from the moment the reader comes to hold the base version in
CPU memory (``BasePasses``: while its engine generates, before the next delta is even published), else from the
start of the delta's read (while the delta is on the wire).

    read of the delta starts                          payload of chunk k landed (apply thread)
      worker thread: digest base chunk 0, 1, 2, ...     k digested by the worker: decode, write, check the
      of the reader's buffers, in order, at a lower     target incrementally;
      priority, skipping chunks the applier took;       else (not reached, or being digested: the applier
      turned round once the applier caught up           takes it): decode, write, digest the chunk in full

A chunk's digest is used only if the worker finished it before the applier claimed the chunk. The digests are
plain digests of the bytes the buffers held when digested; the applier compares them with the delta's declared
base digests. The caller promises that nothing writes the buffers between ``start`` and the apply of each chunk
(a reader's own buffers during its update; the holder contract forbids anyone else), which is what makes a
digest taken ahead the digest of the bytes the payload is applied to. A pass started at the hold relies on the
same promise for longer: the holder contract forbids writing held buffers until ``unpublish`` returns, and a
reader's next delta read takes the pass (``BasePasses.take``) before it unpublishes the base to write it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Sequence

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest

logger = logging.getLogger("tensorhub_verl.ros.delta")

_CLAIMED = object()
"""The worker digests this chunk now."""
_TAKEN = object()
"""The applier took this chunk before the worker reached it."""
WORKER_NICENESS = 10
"""How much lower than its reader's threads the worker runs (Linux thread niceness): the fetch and the apply of
chunks that have landed, which the reader waits for, get the CPU first; the worker takes what is left."""


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as one flat uint8 tensor (a view)."""
    return t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8,
                                                                                  device=t.device)


def chunk_digest(flats: Sequence[torch.Tensor], rows: Sequence[int], chunk: Chunk) -> str:
    """The digest (hex) of ``chunk``'s bytes in whole-tensor buffers (``flats``, manifest order; ``rows``: each
    tensor's grid row bytes), computed where they lie."""
    acc = None
    for s in chunk.segments:
        part = lindigest.span(flats[s.tensor][s.offset:s.offset + s.length], s.offset, rows[s.tensor])
        acc = part if acc is None else acc + part.to(acc.device)
    return lindigest.many_to_hex([lindigest.zero() if acc is None else acc])[0]


def disjoint(flats: Sequence[torch.Tensor]) -> bool:
    """Whether no two of the flat buffers share a byte of memory (buffers that alias, e.g. two views mapped onto
    the same parameter bytes, would let a write to one chunk change another's bytes)."""
    spans = sorted((str(t.device), t.data_ptr(), t.data_ptr() + t.numel()) for t in flats if t.numel())
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))


class BaseDigests:
    """The digests of chunks ``chunks`` (indices of ``manifest``'s chunk map) of the buffers ``tensors``
    (manifest order), made by a worker thread from ``start`` on, each chunk at most once, for the applier to
    ``claim``. The worker goes in chunk order, ahead of the delta's payloads as they land; once the applier
    claims a chunk the worker is digesting (the payloads have caught up with it), the worker leaves that chunk
    to the applier and goes on from the last chunk backwards, so that the two meet once instead of contending for
    every chunk after. Without ``start`` the applier claims every chunk undigested."""

    def __init__(self, manifest: Manifest, tensors: Sequence[torch.Tensor], chunks: range, timeout_s: float,
                 expected: Sequence[str] = ()):
        self._expected = tuple(expected)
        """The digests the buffers should have (a holding's: its manifest's chunk digests), or none."""
        self.mismatched: list[int] = []
        """Chunks whose digest was not the expected one: written while held (the next delta read refuses their
        base and re-reads them in full)."""
        self._flats = [flat_bytes(t) for t in tensors]
        self._rows = [lindigest.row_bytes(tuple(s.shape), s.nbytes) for s in manifest.tensors]
        self._chunks = manifest.chunks()
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._done: dict[int, object] = {}
        """chunk -> its digest (hex), ``_CLAIMED`` while the worker digests it, or ``_TAKEN`` once the applier
        claimed it without the worker's digest."""
        self._front, self._back = chunks.start, chunks.stop - 1
        """The worker's cursors: every chunk before ``_front`` and after ``_back`` is claimed."""
        self._backwards = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.ahead = 0
        """Chunks the worker digested (before their payload was applied)."""
        self.worker_niceness: int | None = None
        """The worker thread's niceness (None before it runs, or where threads have none)."""

    def matches(self, manifest: Manifest, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether these digests are of ``manifest``'s chunk map over the very buffers ``tensors`` (manifest order):
        what a delta read into ``tensors`` needs to use them."""
        flats = [flat_bytes(t) for t in tensors]
        same_buffers = len(flats) == len(self._flats) and all(
            (a.device, a.data_ptr(), a.numel()) == (b.device, b.data_ptr(), b.numel())
            for a, b in zip(flats, self._flats))
        return same_buffers and manifest.chunks() == self._chunks and \
            [lindigest.row_bytes(tuple(s.shape), s.nbytes) for s in manifest.tensors] == self._rows

    def start(self) -> "BaseDigests":
        """Starts digesting in a worker thread (returns self)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="tensorhub-delta-base", daemon=True)
            self._thread.start()
        return self

    def claim(self, index: int) -> str | None:
        """Chunk ``index``'s base digest if the worker has made it, else None (the worker had not reached it, is
        digesting it now, or failed to). Either way the worker's digest of the chunk is never used afterwards,
        so the caller may write it; with None the caller checks the chunk in full after writing."""
        with self._lock:
            got = self._done.get(index)
            if isinstance(got, str):
                return got
            if got is _CLAIMED:  # caught up with the worker: it leaves this chunk and turns round
                self._backwards = True
            self._done[index] = _TAKEN
            return None

    def finished(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the worker to be done with every chunk; whether it is."""
        if self._thread is None:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stops the worker after the chunk it digests (joins it, within the timeout)."""
        with self._lock:
            self._stopped = True
        if self._thread is not None:
            self._thread.join(self._timeout_s)
            if self._thread.is_alive():
                raise errors.TransferFailed(f"the base digest worker did not stop within {self._timeout_s:.0f} s")

    def _next(self) -> int | None:
        """The next chunk for the worker (claimed for it), or None when none is left or it was stopped."""
        with self._lock:
            if self._stopped:
                return None
            while self._front <= self._back and self._front in self._done:
                self._front += 1
            while self._back >= self._front and self._back in self._done:
                self._back -= 1
            if self._front > self._back:
                return None
            index = self._back if self._backwards else self._front
            self._done[index] = _CLAIMED
            return index

    def _work(self) -> None:
        self.worker_niceness = _lower_priority(WORKER_NICENESS)
        while (index := self._next()) is not None:
            try:
                digest = chunk_digest(self._flats, self._rows, self._chunks[index])
            except Exception as e:  # the applier then digests this chunk in full after writing it
                logger.warning("digesting base chunk %d ahead failed: %s", index, e)
                continue
            with self._lock:
                if self._done.get(index) is _CLAIMED:  # not taken by the applier meanwhile
                    self._done[index] = digest
                    self.ahead += 1
            if self._expected and digest != self._expected[index]:
                self.mismatched.append(index)
                logger.error("chunk %d of a held version no longer has its digest: its buffers were written while "
                             "held; the next delta read refuses it as a base and re-reads it in full", index)


class BasePasses:
    """A client's base passes started at the hold: for each version it holds in whole buffers in CPU memory
    (``key``: its holding), a ``BaseDigests`` of every chunk started when it came to hold it, so that the next
    ``fetch(have=...)`` into those buffers finds its base digested and the pause has no base pass on it.

    Buffers on a GPU are left to the read (their pass takes milliseconds there, and no digest kernels run beside
    the engine's while it generates). ``take`` hands a pass to the read that writes the buffers; ``drop`` stops
    the pass of a holding that is unpublished (its bytes may change after)."""

    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._passes: dict[tuple, BaseDigests] = {}

    def start(self, key: tuple, manifest: Manifest, tensors: Sequence[torch.Tensor]) -> bool:
        """Starts the pass of the holding ``key`` (``tensors``: its buffers in manifest order) unless it has one
        or its buffers are not all in CPU memory; whether one runs now."""
        if not tensors or any(t.device.type != "cpu" for t in tensors):
            return False
        with self._lock:
            if key not in self._passes:
                self._passes[key] = BaseDigests(manifest, tensors, range(len(manifest.chunks())),
                                                self._timeout_s, expected=manifest.chunk_digests).start()
            return True

    def take(self, key: tuple, manifest: Manifest, tensors: Sequence[torch.Tensor]) -> BaseDigests | None:
        """The pass of the holding ``key``, removed from here, when it covers ``manifest``'s chunk map over
        ``tensors`` (a delta read's target and buffers); else None (a pass that does not is stopped)."""
        with self._lock:
            found = self._passes.pop(key, None)
        if found is None or found.matches(manifest, tensors):
            return found
        _stop_quietly(found)
        return None

    def wait(self, key: tuple, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the pass of the holding ``key`` to finish; whether it has (False
        when there is none)."""
        with self._lock:
            found = self._passes.get(key)
        return found is not None and found.finished(timeout)

    def drop(self, key: tuple) -> None:
        """Stops and forgets the pass of the holding ``key``, if any."""
        with self._lock:
            found = self._passes.pop(key, None)
        if found is not None:
            _stop_quietly(found)

    def close(self) -> None:
        with self._lock:
            passes, self._passes = list(self._passes.values()), {}
        for found in passes:
            _stop_quietly(found)


def _stop_quietly(digests: BaseDigests) -> None:
    try:
        digests.stop()
    except errors.TransferFailed as e:  # a daemon thread that reads held memory only; it ends with the process
        logger.warning("%s", e)


def _lower_priority(by: int) -> int | None:
    """Raises the calling thread's niceness by ``by`` (Linux: each thread has its own); its niceness after, or
    None where that cannot be done (the thread then runs as it was)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + by)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError):
        return None


__all__ = ["BaseDigests", "BasePasses", "chunk_digest", "disjoint", "flat_bytes"]
