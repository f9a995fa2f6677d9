"""Sliced reads that are not made of whole blocks: the extra bytes that make them checkable.

A manifest's block digests (``integrity.py``) cut dims 0 and 1 of a tensor into equal blocks (a power of two of
them), so a tensor-parallel rank's slice covers whole blocks only when the TP degree divides the block count.
Any other slice (TP=3, or one rank's rows that start mid-block) is widened to the blocks it touches: the reader
also reads the bytes of those blocks that lie outside its slice (the edges: at most one partial block at each
end of the slice, per chunk segment) into a scratch buffer, and checks slice plus edges against the sum of the
whole blocks' digests. The edges are read from the same holder in the same lease as the slice, never written
to the reader's buffers, and never served.

Why widen rather than finer digests: any slice of a dim is then checked whatever the TP degree, the manifest
stays the same size, and aligned slices (power-of-two TP) read not one byte more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tensorhub_verl.ros.wire.manifest import Manifest, TensorBlocks, TensorSpec
from tensorhub_verl.ros.wire.ranges import Piece, ReadPlan, Runs, TensorSlice


def block_span(spec: TensorSpec, tb: TensorBlocks, start: int, length: int) -> tuple[int, int, int]:
    """(first block, end block, block size) of the blocks of ``tb`` that indices [start, start + length) of its
    dim touch."""
    size = spec.shape[tb.dim] if spec.shape else 1
    bs = size // tb.blocks
    return start // bs, -(-(start + length) // bs), bs


def widen(manifest: Manifest, plan: ReadPlan, slices: Mapping[int, TensorSlice | None]) -> ReadPlan:
    """``plan`` with the edges of every chunk read in part: for each sliced tensor it touches whose slice is
    not made of whole blocks (and that has block digests along the slice's dim), the bytes of the partial
    blocks outside the slice, within the chunk's segment of the tensor."""
    blocks = {(b.tensor, b.dim): b for b in manifest.block_digests}
    segments = {c.index: {s.tensor: s for s in c.segments} for c in manifest.chunks() if c.index in plan.pieces}
    sides: dict[int, list[Runs]] = {}
    unchecked = set()
    for t, sl in slices.items():
        tb = blocks.get((t, 0 if sl is None else sl.dim))
        if tb is None:
            unchecked.add(t)  # no digests to check it against: its chunks' edges would be read for nothing
        if tb is None or sl is None:
            continue
        spec = manifest.tensors[t]
        j0, j1, bs = block_span(spec, tb, sl.start, sl.length)
        outside = [(j0 * bs, sl.start - j0 * bs), (sl.start + sl.length, j1 * bs - sl.start - sl.length)]
        sides[t] = [Runs.of_slice(spec, TensorSlice(sl.dim, a, n)) for a, n in outside if n > 0]
    edges: dict[int, tuple[Piece, ...]] = {}
    at = 0
    for chunk, pieces in plan.pieces.items():
        if chunk in plan.whole:
            continue
        touched = sorted({p.tensor for p in pieces})
        if unchecked.intersection(touched):
            continue
        got = []
        for t in touched:
            seg = segments[chunk][t]
            for runs in sides.get(t, ()):
                for offset, length, _ in runs.overlap(seg.offset, seg.length):
                    got.append(Piece(t, offset, length, at))
                    at += length
        if got:
            edges[chunk] = tuple(got)
    return replace(plan, edges=edges)


__all__ = ["block_span", "widen"]
