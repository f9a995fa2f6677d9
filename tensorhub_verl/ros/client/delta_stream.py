"""Applying a delta form while it is still on the wire: each chunk of the version is applied as soon as the
delta form's chunks that hold its payload have landed.

    fetcher thread                     apply thread (one per delta form)
      delta chunk d landed, checked  -->  header whole?  open it: parse, check (``open_header``), or refuse it
                                          payload of version chunk k whole?  decode, write, digest (``ChunkApply``)

Nothing is written before the header has landed in full and passed its checks; a header that fails them is
refused (``refused``) and nothing is ever written. A delta abandoned part way (its read failed) is undone: every
chunk applied so far gets its base words back (``abandon``). The version is served only once ``close`` returns
and every chunk checked.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.client.delta_chunks import ApplyResult, ChunkApply
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER, DeltaHeader
from tensorhub_verl.ros.wire.manifest import Manifest

_DONE = object()


class DeltaStream:
    """Applies one delta form (manifest ``form``, landing into ``buffers``) as its chunks land.

    ``open_header(raw bytes) -> ChunkApply`` parses and checks the header and returns the applier over the
    reader's buffers; it raises ``DeltaRefused`` to refuse the delta (nothing is written then). ``landed`` is the
    fetch's ``on_landed``."""

    def __init__(self, form: Manifest, buffers: dict[str, torch.Tensor],
                 open_header: Callable[[bytes], ChunkApply], timeout_s: float):
        self._buffers, self._open_header, self._timeout_s = buffers, open_header, timeout_s
        names = [spec.name for spec in form.tensors]
        self._header_t, self._blob_t = names.index(HEADER), names.index(BLOB)
        self._blob_ranges: list[tuple[int, int]] = []
        """Per delta chunk: the blob bytes [lo, hi) it holds (lo == hi: none)."""
        self._header_chunks: set[int] = set()
        for chunk in form.chunks():
            lo = hi = 0
            for s in chunk.segments:
                if s.tensor == self._header_t:
                    self._header_chunks.add(chunk.index)
                elif s.tensor == self._blob_t:
                    lo, hi = (s.offset, s.offset + s.length) if lo == hi else (min(lo, s.offset),
                                                                               max(hi, s.offset + s.length))
            self._blob_ranges.append((lo, hi))
        self._landed: set[int] = set()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.header: DeltaHeader | None = None
        self.applier: ChunkApply | None = None
        self.refused: errors.DeltaRefused | None = None
        """Why the header was refused (nothing written)."""
        self.error: BaseException | None = None
        """A fault of the apply itself (the buffers' state is unknown)."""
        self._waiting: dict[int, set[int]] = {}
        """version chunk -> delta chunks its payload still waits for."""
        self._users: dict[int, list[int]] = {}
        """delta chunk -> version chunks whose payload it holds a part of."""
        self._thread = threading.Thread(target=self._loop, name="tensorhub-delta-apply", daemon=True)
        self._thread.start()

    def landed(self, chunks: list[int]) -> None:
        """The fetch's ``on_landed``: hands the chunks to the apply thread."""
        self._queue.put(chunks)

    def close(self) -> ApplyResult | None:
        """After the delta form's fetch has landed every chunk: applies what is left and returns the result (None
        when the header was refused, ``refused`` says why). Raises ``TransferFailed`` on a fault of the apply."""
        self._stop()
        self._guarded(list(range(len(self._blob_ranges))))  # every chunk has landed: whatever is left
        if self.error is not None:
            raise errors.TransferFailed(f"applying the delta failed ({type(self.error).__name__}: {self.error})") \
                from self.error
        if self.refused is not None:
            return None
        return self.applier.finish()

    def abandon(self) -> None:
        """The delta's read failed: stops applying and puts back the base's words in every chunk written."""
        self._stop()
        if self.applier is not None:
            self.applier.undo()

    def _stop(self) -> None:
        self._queue.put(_DONE)
        self._thread.join(self._timeout_s)
        if self._thread.is_alive():
            raise errors.TransferFailed(f"applying the delta did not end within {self._timeout_s:.0f} s")

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            self._guarded(item)

    def _guarded(self, chunks: list[int]) -> None:
        if self.error is not None or self.refused is not None:
            return
        try:
            self._take(chunks)
        except errors.DeltaRefused as e:
            self.refused = e
        except BaseException as e:  # reported by close(); the fetch goes on to its end
            self.error = e

    def _take(self, chunks: list[int]) -> None:
        fresh = [d for d in chunks if d not in self._landed]
        self._landed.update(fresh)
        if self.applier is None:
            if not self._header_chunks <= self._landed:
                return
            raw = self._buffers[HEADER].numpy().tobytes()
            self.applier = self._open_header(raw)
            self.header = self.applier.header
            self._index_payloads()
            ready = [k for k, wait in self._waiting.items() if not wait]
        else:
            ready = []
            for d in fresh:
                for k in self._users.get(d, ()):
                    wait = self._waiting[k]
                    wait.discard(d)
                    if not wait:
                        ready.append(k)
        if ready:
            self.applier.apply(self._buffers[BLOB], sorted(ready))

    def _index_payloads(self) -> None:
        """Which delta chunks each version chunk's payload lies in, less those already landed."""
        header = self.applier.header
        starts = sorted((lo, d) for d, (lo, hi) in enumerate(self._blob_ranges) if hi > lo)
        for k, (offset, length) in enumerate(zip(header.offsets, header.lengths)):
            chunk = header.first_chunk + k
            need = set()
            if length:
                for lo, d in starts:
                    hi = self._blob_ranges[d][1]
                    if lo < offset + length and hi > offset:
                        need.add(d)
            need -= self._landed
            self._waiting[chunk] = need
            for d in need:
                self._users.setdefault(d, []).append(chunk)


__all__ = ["DeltaStream"]
