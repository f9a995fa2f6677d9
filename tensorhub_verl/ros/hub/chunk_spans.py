"""A run of chunks' bytes and tensors, answered without visiting each chunk of the run.

The hub tells a reader the bytes of each lease and the addresses of the tensors it reads. For a run of up to
1,024 chunks, summing each chunk's segments costs the run's length; here one pass over the chunk map at publish
builds prefix sums of the chunks' bytes and each tensor's stretches of consecutive chunks, so that a run's bytes
are one subtraction and its tensors one bisection (plus the tensors it reads).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Sequence

from tensorhub_verl.ros.wire.manifest import Chunk


class ChunkSpans:
    __slots__ = ("_offsets", "_starts", "_ends", "_tensors", "_monotone", "_chunks")

    def __init__(self, chunks: Sequence[Chunk]):
        self._chunks = chunks
        self._offsets = [0, *accumulate(c.nbytes for c in chunks)]
        # Each tensor's stretches of consecutive chunks, in chunk order: (first chunk, end chunk, tensor).
        stretches: list[list[int]] = []
        last: dict[int, list[int]] = {}
        for index, chunk in enumerate(chunks):
            for seg in chunk.segments:
                stretch = last.get(seg.tensor)
                if stretch is not None and stretch[1] >= index:
                    stretch[1] = index + 1
                else:
                    last[seg.tensor] = stretch = [index, index + 1, seg.tensor]
                    stretches.append(stretch)
        stretches.sort()
        self._starts = [s[0] for s in stretches]
        self._ends = [s[1] for s in stretches]
        self._tensors = [s[2] for s in stretches]
        self._monotone = all(a <= b for a, b in zip(self._ends, self._ends[1:]))
        """Stretches that end in the order they start (a plain or row-sharded chunk map): a run's tensors are
        then one slice of them. Otherwise they are read off the run's chunks."""

    def nbytes(self, start: int, end: int) -> int:
        """Bytes of chunks [start, end)."""
        return self._offsets[end] - self._offsets[start]

    def tensors(self, start: int, end: int) -> set[int]:
        """The tensors chunks [start, end) read a part of."""
        if not self._monotone:
            return {seg.tensor for c in range(start, end) for seg in self._chunks[c].segments}
        first = bisect_right(self._ends, start)  # the first stretch ending after ``start``
        last = bisect_left(self._starts, end)  # stretches from here on start at or after ``end``
        return set(self._tensors[first:last])
