"""A run lease as one data-plane read: its chunks' bytes merged into contiguous copies, in chunk order.

A fetch computes each chunk's spans once (``ChunkSpans``): where its bytes lie in the source's tensors and where
they land here (a local buffer, or the scratch buffer a ranged read's block edges land in). A run of consecutive
chunks is then read with as few copies as its memory allows: a span that continues the one before it on both
sides (the next bytes of the same tensor, landing at the next bytes of the same buffer) is merged into it, so a
run over one tensor is one copy whatever its length.

The copies keep chunk order, so the bytes a plane reports landed in order (``DataPlane.landed_bytes``) say which
chunks are whole: the run's chunk ``k`` is whole once ``ends[k]`` of its bytes landed. A plane that takes at most
``max_copies`` copies per read gets the run as several reads (``Part``), split at chunk boundaries; their bytes
follow each other in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorhub_verl.ros.wire.manifest import Chunk
from tensorhub_verl.ros.wire.ranges import ReadPlan

SCRATCH = -1
"""The ``local`` of a span that lands in the fetch's scratch buffer (a ranged read's block edges)."""

Span = tuple[int, int, int, int, int]
"""(tensor, offset in the tensor, length, local buffer index or SCRATCH, offset in that buffer)."""


@dataclass(slots=True)
class Part:
    """One read of a run: ``spans`` (merged), landing bytes ``start``..``end`` of the run's bytes."""

    spans: list[list[int]]
    start: int
    end: int


class ChunkSpans:
    """Each chunk's spans and byte counts, computed at a chunk's first read and kept for the fetch."""

    __slots__ = ("_chunks", "_plan", "_scratch", "_spans", "_read", "_counted")

    def __init__(self, chunks: tuple[Chunk, ...], plan: ReadPlan | None, scratch: bool):
        """``scratch``: whether the fetch has a scratch buffer for the plan's edges (else they are not read)."""
        self._chunks = chunks
        self._plan = plan
        self._scratch = scratch
        self._spans: list[tuple[Span, ...] | None] = [None] * len(chunks)
        self._read = [0] * len(chunks)
        """Bytes a read of the chunk moves (its pieces and edges)."""
        self._counted = [0] * len(chunks)
        """Bytes of the chunk's pieces: what lands in the reader's buffers (the fetch's stats count these)."""

    def spans(self, chunk: int) -> tuple[Span, ...]:
        spans = self._spans[chunk]
        if spans is None:
            spans = self._compute(chunk)
        return spans

    def read_bytes(self, chunk: int) -> int:
        return self._read[chunk] or self._bytes(chunk)[0]

    def counted_bytes(self, chunk: int) -> int:
        return self._counted[chunk] or self._bytes(chunk)[1]

    def _bytes(self, chunk: int) -> tuple[int, int]:
        if self._plan is None:
            self._read[chunk] = self._counted[chunk] = sum([s.length for s in self._chunks[chunk].segments])
        else:
            self._compute(chunk)
        return self._read[chunk], self._counted[chunk]

    def _compute(self, chunk: int) -> tuple[Span, ...]:
        plan = self._plan
        if plan is None:
            spans = tuple([(s.tensor, s.offset, s.length, s.tensor, s.offset) for s in self._chunks[chunk].segments])
            counted = read = sum([s[2] for s in spans])
        else:
            spans = tuple([(p.tensor, p.offset, p.length, p.tensor, p.local) for p in plan.pieces[chunk]])
            counted = sum([s[2] for s in spans])
            edges = plan.edges.get(chunk, ()) if plan.edges and self._scratch else ()
            spans += tuple([(p.tensor, p.offset, p.length, SCRATCH, p.local) for p in edges])
            read = sum([s[2] for s in spans])
        self._spans[chunk] = spans
        self._counted[chunk] = counted
        self._read[chunk] = read
        return spans

    def run(self, first: int, count: int, max_copies: int = 0) -> tuple[list[Part], list[int]]:
        """The reads of chunks ``first``..``first + count - 1`` (each at most ``max_copies`` merged spans when
        nonzero, split only between chunks), and the run's byte count at the end of each of its chunks."""
        if self._plan is None:
            return self._whole_run(first, count, max_copies)
        parts: list[Part] = []
        spans: list[list[int]] = []
        ends: list[int] = []
        total = start = 0
        cached = self._spans
        for chunk in range(first, first + count):
            mine = cached[chunk] or self._compute(chunk)
            if max_copies and spans and len(spans) + len(mine) > max_copies:
                parts.append(Part(spans, start, total))
                spans, start = [], total
            for tensor, offset, length, local, at in mine:
                last = spans[-1] if spans else None
                if last is not None and last[0] == tensor and last[1] + last[2] == offset and last[3] == local \
                        and last[4] + last[2] == at:
                    last[2] += length
                else:
                    spans.append([tensor, offset, length, local, at])
            total += self._read[chunk]
            ends.append(total)
        if spans or not parts:
            parts.append(Part(spans, start, total))
        return parts, ends

    def _whole_run(self, first: int, count: int, max_copies: int) -> tuple[list[Part], list[int]]:
        """``run`` for a whole read: straight from the chunks' segments (each lands at its own offset of its
        tensor's buffer), keeping nothing per chunk but its byte count."""
        parts: list[Part] = []
        spans: list[list[int]] = []
        ends: list[int] = []
        total = start = 0
        sizes = self._read
        for chunk in self._chunks[first:first + count]:
            segments = chunk.segments
            if max_copies and spans and len(spans) + len(segments) > max_copies:
                parts.append(Part(spans, start, total))
                spans, start = [], total
            size = 0
            for seg in segments:
                tensor, offset, length = seg.tensor, seg.offset, seg.length
                size += length
                last = spans[-1] if spans else None
                if last is not None and last[0] == tensor and last[1] + last[2] == offset:
                    last[2] += length
                else:
                    spans.append([tensor, offset, length, tensor, offset])
            sizes[chunk.index] = self._counted[chunk.index] = size
            total += size
            ends.append(total)
        if spans or not parts:
            parts.append(Part(spans, start, total))
        return parts, ends

    def segment_tensors(self, first: int, count: int) -> set[int]:
        """Tensors the run's chunks' whole segments touch (what a grant over them needs addresses for)."""
        return {seg.tensor for c in range(first, first + count) for seg in self._chunks[c].segments}


__all__ = ["ChunkSpans", "Part", "SCRATCH", "Span"]
