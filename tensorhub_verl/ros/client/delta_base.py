"""A reader's base chunks digested while the delta is on the wire, so that a chunk's payload is applied on
landing without a full pass over the chunk's bytes.

    read of the delta starts                          payload of chunk k landed (apply thread)
      worker thread: digest base chunk 0, 1, 2, ...     k's base digest: the worker's (waited for while it
      of the reader's buffers, in order, at a lower     digests k): decode, write, check incrementally;
      priority, skipping chunks the applier took        or none yet (the applier takes k): decode, write,
                                                        digest the written chunk in full

The worker and the applier never both read a chunk: whichever claims it first has it. The digests are plain
digests of the bytes the buffers held when digested; the applier compares them with the delta's declared base
digests. The caller promises that nothing writes the buffers between ``start`` and the apply of each chunk (a
reader's own buffers during its update; the holder contract forbids anyone else), which is what makes a digest
taken ahead the digest of the bytes the payload is applied to.
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
    (manifest order), made once each: by a worker thread in chunk order from ``start`` on, or by ``take`` when
    the worker has not reached the chunk. Without ``start`` every digest is made by ``take``."""

    def __init__(self, manifest: Manifest, tensors: Sequence[torch.Tensor], chunks: range, timeout_s: float):
        self._flats = [flat_bytes(t) for t in tensors]
        self._rows = [lindigest.row_bytes(tuple(s.shape), s.nbytes) for s in manifest.tensors]
        self._chunks = manifest.chunks()
        self._order = chunks
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._done: dict[int, object] = {}
        """chunk -> its digest (hex), ``_CLAIMED`` while the worker digests it, ``_TAKEN`` once the applier took it
        first, or the exception that failed the worker's digest."""
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.ahead = 0
        """Chunks the worker digested (before their payload was applied)."""
        self.worker_niceness: int | None = None
        """The worker thread's niceness (None before it runs, or where threads have none)."""

    def start(self) -> "BaseDigests":
        """Starts digesting in a worker thread (returns self)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="tensorhub-delta-base", daemon=True)
            self._thread.start()
        return self

    def claim(self, index: int) -> str | None:
        """Chunk ``index``'s base digest if the worker made it (waited for while the worker digests it), else
        None. Either way the worker never reads the chunk afterwards, so the caller may write it; with None the
        caller checks the chunk in full after writing."""
        with self._cond:
            got = self._done.get(index)
            if got is None or got is _TAKEN:
                self._done[index] = _TAKEN
                return None
            if not self._cond.wait_for(lambda: self._done[index] is not _CLAIMED, self._timeout_s):
                raise errors.TransferFailed(f"digesting base chunk {index} did not end within "
                                            f"{self._timeout_s:.0f} s")
            got = self._done[index]
        if isinstance(got, BaseException):
            raise got
        return got

    def stop(self) -> None:
        """Stops the worker after the chunk it digests (joins it, within the timeout)."""
        with self._cond:
            self._stopped = True
        if self._thread is not None:
            self._thread.join(self._timeout_s)
            if self._thread.is_alive():
                raise errors.TransferFailed(f"the base digest worker did not stop within {self._timeout_s:.0f} s")

    def _work(self) -> None:
        self.worker_niceness = _lower_priority(WORKER_NICENESS)
        for index in self._order:
            with self._cond:
                if self._stopped:
                    return
                if index in self._done:
                    continue
                self._done[index] = _CLAIMED
            try:
                got: object = chunk_digest(self._flats, self._rows, self._chunks[index])
            except BaseException as e:  # handed to the applier, which then reads the version in full
                logger.warning("digesting base chunk %d failed: %s", index, e)
                got = e
            with self._cond:
                self._done[index] = got
                if not isinstance(got, BaseException):
                    self.ahead += 1
                self._cond.notify_all()


def _lower_priority(by: int) -> int | None:
    """Raises the calling thread's niceness by ``by`` (Linux: each thread has its own); its niceness after, or
    None where that cannot be done (the thread then runs as it was)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + by)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError):
        return None


__all__ = ["BaseDigests", "chunk_digest", "disjoint", "flat_bytes"]
