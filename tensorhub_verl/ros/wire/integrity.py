"""Chunk and block digests: computed by the publisher, carried in the manifest, checked by every reader.

A reader checks each chunk as it lands, before it reports the chunk to the hub, so it never serves or claims
bytes it has not verified. The digest (``lindigest.py``) is linear and runs as torch ops on the device that
holds the bytes: no device-to-host copy of data, on the publisher or the reader. Not cryptographic: it catches
torn, stale, garbage and mixed-up bytes, not a forger who picks colliding bytes -- that one would first need a
credential to publish at all.

Ranged reads (``ranges.py``): a chunk read whole is checked against its chunk digest; a chunk read in part (a
TP rank's rows or columns of it) against the sum of the manifest's block digests that its slice covers
(``TensorBlocks``: up to ``MAX_BLOCKS`` blocks along dims 0 and 1, per chunk segment, so every power-of-two TP
degree up to it is aligned). A slice that covers blocks in part (TP=3) is widened to whole blocks: the reader
also reads the edges (``block_edges.py``). Slices along a dim without block digests (dim 2+) are not checked.

``tensor_digests`` is another thing: xxh3 of whole tensors, for the end-to-end ``verify_digests`` of verl jobs.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

import torch
import xxhash

from tensorhub_verl.ros.wire import lindigest, lindigest_cells
from tensorhub_verl.ros.wire.block_edges import block_span
from tensorhub_verl.ros.wire.lindigest import ALGORITHM, row_bytes
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest, TensorBlocks, TensorSpec
from tensorhub_verl.ros.wire.ranges import Piece, ReadPlan, TensorSlice

logger = logging.getLogger("tensorhub_verl.ros.wire.integrity")

DIGEST_CHARS = 16
MAX_BLOCKS = 16
"""Blocks per dim of a tensor's block digests: the largest power of two up to this that divides the dim."""

__all__ = ["ALGORITHM", "ChunkChecker", "block_digests", "chunk_digests", "shard_chunk_digests", "tensor_digests"]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8,
                                                                                  device=t.device)


def _blocks(size: int) -> int:
    n = 1
    while n < MAX_BLOCKS and size % (2 * n) == 0 and size >= 2 * n:
        n *= 2
    return n


def _segments(chunks: Iterable[Chunk]) -> dict[int, dict[int, int]]:
    """tensor -> {chunk: k}: the tensor's segments, numbered in chunk order."""
    out: dict[int, dict[int, int]] = {}
    for chunk in chunks:
        for seg in chunk.segments:
            per = out.setdefault(seg.tensor, {})
            per[chunk.index] = len(per)
    return out


def chunk_digests(chunks: Iterable[Chunk], tensors: Iterable[torch.Tensor]) -> tuple[str, ...]:
    """One digest per chunk, each computed on the device that holds its bytes."""
    tensors = list(tensors)
    return _digests(chunks, [_flat(t) for t in tensors], [0] * len(tensors), [_rb(t) for t in tensors], None)


def shard_chunk_digests(chunks: Iterable[Chunk], specs: Sequence[TensorSpec], pieces: Iterable[torch.Tensor],
                        starts: Sequence[int], own: set[int]) -> tuple[str, ...]:
    """A row shard's digests: of the chunks in ``own`` (all within its pieces), "" for the other ranks' chunks.
    Piece ``i`` holds bytes from ``starts[i]`` of tensor ``i`` (whose full spec is ``specs[i]``)."""
    return _digests(chunks, [_flat(p) for p in pieces], starts, [row_bytes(s.shape, s.nbytes) for s in specs], own)


def _rb(t: torch.Tensor) -> int:
    return row_bytes(tuple(t.shape), t.numel() * t.element_size())


def _digests(chunks: Iterable[Chunk], flats: list[torch.Tensor], starts: Sequence[int], rbs: Sequence[int],
             own: set[int] | None) -> tuple[str, ...]:
    chunks = list(chunks)
    lanes, index = [], []
    for chunk in chunks:
        if own is not None and chunk.index not in own:
            continue
        acc = None
        for seg in chunk.segments:
            data, start = flats[seg.tensor], starts[seg.tensor]
            part = lindigest.span(data[seg.offset - start:seg.offset - start + seg.length], seg.offset,
                                  rbs[seg.tensor])
            acc = part if acc is None else acc + part.to(acc.device)
        lanes.append(lindigest.zero() if acc is None else acc)
        index.append(chunk.index)
    device = lanes[0].device if lanes else None
    out = [""] * len(chunks)
    for i, digest in zip(index, lindigest.many_to_hex([v.to(device) for v in lanes])):
        out[i] = digest
    return tuple(out)


def block_digests(chunks: Iterable[Chunk], specs: Sequence[TensorSpec], tensors: Sequence[torch.Tensor],
                  starts: Sequence[int] | None = None, own: set[int] | None = None) -> tuple[TensorBlocks, ...]:
    """Every tensor's block digests along dim 0 (every tensor: a 0-dim one has one block) and, for a tensor of
    2+ dims whose grid rows are its dim-0 rows, along dim 1. Blocks are placed in the whole tensor.

    One pass over each segment's bytes gives both dims (``lindigest_cells``): a dim-0 block is a band of grid
    rows (or, on a grid of one row, a window of its columns), a dim-1 block a window of columns; the lanes of
    every block come to the host in one copy per device.

    A row shard passes its pieces as ``tensors`` (piece ``i`` holds bytes from ``starts[i]`` of tensor ``i``) and
    its chunks as ``own``: it fills the cells of its own segments, "" for the other ranks' (``merge_blocks``
    collects the ranks' cells into the whole tensor's)."""
    chunks = list(chunks)
    seg_of = {t: sorted(per, key=per.get) for t, per in _segments(chunks).items()}
    by_chunk = {c.index: c for c in chunks}
    out: list[tuple[int, int, int, list]] = []
    lanes: dict[torch.device, list[torch.Tensor]] = {}
    counts: dict[torch.device, int] = {}

    def keep(values: torch.Tensor) -> tuple[torch.device, int]:
        """Queue [k, LANES] lanes for the one copy to the host; the place of the first."""
        dev = values.device
        lanes.setdefault(dev, []).append(values)
        at = counts.get(dev, 0)
        counts[dev] = at + len(values)
        return dev, at

    for t, spec in enumerate(specs):
        flat, rb = _flat(tensors[t]), row_bytes(spec.shape, spec.nbytes)
        base = 0 if starts is None else starts[t]
        dims = dict(_block_dims(spec))
        one_row = rb >= spec.nbytes  # a grid of one row: dim-0 blocks are windows of its columns
        width0 = spec.nbytes // dims[0]
        if one_row:
            band_rows, cuts = None, [j * width0 for j in range(1, dims[0])]
        else:
            band_rows, cuts = spec.shape[0] // dims[0], []
        if 1 in dims:
            cuts = [j * rb // dims[1] for j in range(1, dims[1])]  # dims[0] is 1 on a grid of one row
        cells0: list = []
        cells1: list = []
        for c in seg_of.get(t, []):
            seg = next(s for s in by_chunk[c].segments if s.tensor == t)
            if own is not None and c not in own:
                cells0.extend([None] * dims[0])
                cells1.extend([None] * dims.get(1, 0))
                continue
            data = flat[seg.offset - base:seg.offset - base + seg.length]
            grid = lindigest_cells.cells(data, seg.offset, rb, cuts, band_rows)
            touched = [j for j in range(dims[0]) if j * width0 < seg.offset + seg.length and
                       seg.offset < (j + 1) * width0]
            per_block0 = grid[0] if one_row and dims[0] > 1 else grid.sum(1)
            first = 0 if one_row else seg.offset // rb // band_rows  # the first band of ``grid``
            dev, at = keep(per_block0)
            cells0.extend((dev, at + j - first) if j in touched else None for j in range(dims[0]))
            if 1 in dims:
                dev, at = keep(grid.sum(0))
                cells1.extend((dev, at + j) for j in range(dims[1]))
        out.append((t, 0, dims[0], cells0))
        if 1 in dims:
            out.append((t, 1, dims[1], cells1))
    values = {dev: torch.cat(parts).tolist() for dev, parts in lanes.items()}
    return tuple(TensorBlocks(t, dim, nb, tuple("" if c is None else lindigest.to_hex(values[c[0]][c[1]])
                                                for c in cells))
                 for t, dim, nb, cells in out)


def _block_dims(spec: TensorSpec) -> list[tuple[int, int]]:
    """(dim, blocks) of the tensor's block digests: dim 0 always; dim 1 where its grid rows are dim-0 rows."""
    rb = row_bytes(spec.shape, spec.nbytes)
    dims = [(0, _blocks(spec.shape[0]) if spec.shape else 1)]
    if len(spec.shape) >= 2 and spec.shape[0] and rb == spec.nbytes // spec.shape[0] and _blocks(spec.shape[1]) > 1:
        dims.append((1, _blocks(spec.shape[1])))
    return dims


def _expected(manifest: Manifest, plan: ReadPlan, slices: Mapping[int, TensorSlice | None]) -> dict[int, str]:
    """chunk -> the digest of what a ranged read reads of it (with its edges, ``block_edges.py``), for each chunk
    read in part whose every touched tensor is read whole, by a slice of whole blocks, or by a slice the plan
    widened to whole blocks."""
    blocks = {(b.tensor, b.dim): b for b in manifest.block_digests}
    segments = _segments(manifest.chunks())
    out = {}
    for chunk, pieces in plan.pieces.items():
        if chunk in plan.whole:
            continue
        parts = []
        for t in sorted({p.tensor for p in pieces}):
            sl = slices.get(t)
            spec = manifest.tensors[t]
            dim, start, length = (0, 0, spec.shape[0] if spec.shape else 1) if sl is None else \
                (sl.dim, sl.start, sl.length)
            tb = blocks.get((t, dim))
            if tb is None or (spec.shape[dim] if spec.shape else 1) % tb.blocks:
                parts = None
                break
            j0, j1, bs = block_span(spec, tb, start, length)
            if plan.edges is None and (j0 * bs, j1 * bs) != (start, start + length):
                parts = None  # not made of whole blocks, and not widened to them
                break
            k = segments[t][chunk]
            parts.extend(tb.digests[k * tb.blocks + j] for j in range(j0, j1))
        if parts is not None:
            out[chunk] = lindigest.add_hex(parts)
    return out


class ChunkChecker:
    """What a fetch checks of each landed chunk, and how: its chunk digest when it reads the chunk whole, the
    sum of its block digests when it reads a slice of whole blocks of it (or a slice the plan widened to whole
    blocks: slice plus edges), nothing otherwise."""

    def __init__(self, manifest: Manifest, plan: ReadPlan | None = None,
                 slices: Mapping[int, TensorSlice | None] | None = None):
        self._digests = manifest.chunk_digests
        self._plan = plan
        self._rbs = [row_bytes(s.shape, s.nbytes) for s in manifest.tensors]
        self._partial = {} if plan is None or not manifest.block_digests else _expected(manifest, plan, slices or {})
        if plan is not None:
            unchecked = len(plan.pieces) - len(plan.whole) - len(self._partial)
            if unchecked:
                logger.info("%s v%d: %d chunk(s) read in part are not checked (no block digests along the "
                            "slices' dims, or slices not widened to whole blocks)", manifest.model, manifest.version, unchecked)

    def checks(self, chunk: int) -> bool:
        if self._plan is None or chunk in self._plan.whole:
            return bool(self._digests and self._digests[chunk])
        return chunk in self._partial

    def expected(self, chunk: int) -> str:
        return self._partial[chunk] if self._plan is not None and chunk not in self._plan.whole \
            else self._digests[chunk]

    def landed(self, pieces: Sequence[Piece], local: Sequence[torch.Tensor], edges: Sequence[Piece] = (),
               scratch: torch.Tensor | None = None) -> str:
        """The digest of ``pieces`` as they lie in the local buffers (``local``: flat uint8 views), plus that of
        ``edges`` as they lie in ``scratch`` (a flat uint8 view), all taken at their places in the whole tensors."""
        acc = self._lanes(pieces, lambda t: local[t])
        if edges:
            more = self._lanes(edges, lambda t: scratch)
            acc = more if acc is None else acc + more.to(acc.device)
        return lindigest.to_hex(lindigest.zero() if acc is None else acc)

    def _lanes(self, pieces: Sequence[Piece], data_of) -> torch.Tensor | None:
        """Digest lanes of ``pieces`` lying at their ``local`` offsets of ``data_of(tensor)``. Runs of equal
        pieces one row apart (a column slice) go at once."""
        acc = None
        i = 0
        while i < len(pieces):
            p = pieces[i]
            rb, data = self._rbs[p.tensor], data_of(p.tensor)
            n = 1
            if p.offset % rb + p.length <= rb:
                while i + n < len(pieces) and _next_row(pieces[i + n - 1], pieces[i + n], rb):
                    n += 1
            if n > 1:
                block = data[p.local:p.local + n * p.length].view(n, p.length)
                part = lindigest.rect(block, p.offset // rb, p.offset % rb, rb)
            else:
                part = lindigest.span(data[p.local:p.local + p.length], p.offset, rb)
            acc = part if acc is None else acc + part.to(acc.device)
            i += n
        return acc


def _next_row(p: Piece, q: Piece, rb: int) -> bool:
    return (q.tensor == p.tensor and q.length == p.length and q.offset == p.offset + rb
            and q.local == p.local + p.length)


def local_views(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Flat byte views of a fetch's local buffers, for ``ChunkChecker.landed``."""
    return [_flat(t) for t in tensors]


def tensor_digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """xxh3-64 of each tensor's dtype, shape and bytes: proves end to end that a reader holds, tensor by tensor,
    what a publisher published (``verify_digests`` in verl jobs). Non-contiguous views are read through a copy;
    CUDA tensors through a copy to the host (an opt-in check, off the weight-update path)."""
    out = {}
    for name, t in tensors.items():
        h = xxhash.xxh3_64(f"{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(_flat(t.detach().contiguous()).cpu().numpy())
        out[name] = h.hexdigest()
    return out
