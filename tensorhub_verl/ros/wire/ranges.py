"""Ranged reads: which bytes of which chunks a reader reads when it wants only parts of a version's tensors.

A reader selects, per tensor, ``full.narrow(dim, start, length)`` (a tensor-parallel rank's slice: rows of a
column-parallel weight, columns of a row-parallel one) or the whole tensor; tensors it does not name are not
read. The selected bytes of a tensor are ``count`` runs of ``run`` bytes, ``stride`` apart, from byte ``first``
(``Runs``): a dim-0 narrow is one run, the columns of a 2-D tensor one run per row. The reader's buffer is the
contiguous narrowed tensor: the runs land back to back.

Pure functions of the manifest's chunk map (the same chunks every holder serves and the planner plans), so a
ranged read is served by any holder of the covering chunks, and per chunk:

- a chunk with no selected byte is not read;
- a chunk whose bytes are all selected is read whole (its pieces, in order, are the chunk's bytes: the chunk
  digest is checked); when every tensor it touches is selected as one contiguous byte range, the reader's
  buffer holds it as a plain holder would, and it serves the chunk to later readers like any landed chunk;
- a chunk partly selected is read only for the selected pieces, checked against the sum of the manifest's block
  digests they cover where the slice is made of whole blocks (``integrity.py``), and the reader never serves
  that chunk (``ReadPlan.unserved``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tensorhub_verl.errors import ManifestMismatch
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec


@dataclass(frozen=True, slots=True)
class TensorSlice:
    """``full.narrow(dim, start, length)`` of one tensor."""

    dim: int
    start: int
    length: int

    @classmethod
    def of(cls, value: TensorSlice | tuple[int, int, int]) -> TensorSlice:
        if isinstance(value, TensorSlice):
            return value
        try:
            dim, start, length = (int(x) for x in value)
        except (TypeError, ValueError):
            raise ManifestMismatch(f"a slice is (dim, start, length), got {value!r}") from None
        return cls(dim, start, length)

    def shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """The narrowed shape; raises ManifestMismatch when the slice is not inside the tensor."""
        if not 0 <= self.dim < len(spec.shape) or self.start < 0 or self.length < 0 or \
                self.start + self.length > spec.shape[self.dim]:
            raise ManifestMismatch(f"tensor {spec.name!r} of shape {list(spec.shape)} has no slice "
                                   f"narrow(dim={self.dim}, start={self.start}, length={self.length})", tensor=spec.name)
        return spec.shape[:self.dim] + (self.length,) + spec.shape[self.dim + 1:]


@dataclass(frozen=True, slots=True)
class Runs:
    """The selected bytes of one tensor: ``count`` runs of ``run`` bytes, ``stride`` apart, from ``first``."""

    first: int
    run: int
    stride: int
    count: int

    @classmethod
    def whole(cls, spec: TensorSpec) -> Runs:
        return cls(0, spec.nbytes, spec.nbytes, 1)

    @classmethod
    def of_slice(cls, spec: TensorSpec, sl: TensorSlice) -> Runs:
        sl.shape(spec)  # checks it
        inner = spec.nbytes
        for d in spec.shape[:sl.dim + 1]:
            inner = inner // d if d else 0
        outer = 1
        for d in spec.shape[:sl.dim]:
            outer *= d
        runs = cls(sl.start * inner, sl.length * inner, spec.shape[sl.dim] * inner, outer)
        # Every run back to back (rows of dim 0, or the whole extent of a dim): one contiguous range.
        return cls(runs.first, runs.nbytes, runs.nbytes, 1) if runs.contiguous else runs

    @property
    def nbytes(self) -> int:
        return self.run * self.count

    @property
    def contiguous(self) -> bool:
        return self.count <= 1 or self.run == self.stride

    def overlap(self, offset: int, length: int) -> Iterator[tuple[int, int, int]]:
        """(tensor offset, length, buffer offset) of the selected bytes within [offset, offset + length)."""
        if not self.run or not self.count or length <= 0:
            return
        end = offset + length
        first_k = max(0, (offset - self.first) // self.stride)
        last_k = min(self.count - 1, (end - 1 - self.first) // self.stride)
        for k in range(first_k, last_k + 1):
            start = self.first + k * self.stride
            lo, hi = max(start, offset), min(start + self.run, end)
            if lo < hi:
                yield lo, hi - lo, k * self.run + (lo - start)


@dataclass(frozen=True, slots=True)
class Piece:
    """``length`` bytes at byte ``offset`` of tensor ``tensor``, landing at byte ``local`` of the reader's buffer."""

    tensor: int
    offset: int
    length: int
    local: int


@dataclass(frozen=True, slots=True)
class ReadPlan:
    pieces: Mapping[int, tuple[Piece, ...]]
    """chunk index -> what to read of it, for every chunk with a selected byte."""
    whole: frozenset[int]
    """Chunks read whole (checked against their chunk digest)."""
    unserved: frozenset[int]
    """Chunks of ``pieces`` this reader's buffers do not hold as a plain holder would: never served from it."""
    regions: Mapping[int, tuple[int, int]]
    """tensor index -> (first byte, bytes) of the tensor the reader's buffer holds as one contiguous range;
    (0, 0) for a tensor not read, or read strided."""
    tensor_nbytes: tuple[int, ...]
    """The whole tensors' bytes, in manifest order."""
    edges: Mapping[int, tuple[Piece, ...]] | None = None
    """chunk -> the bytes outside the slices that complete the blocks the slices cover in part, landing at
    ``local`` of a scratch buffer (``block_edges.widen``); None: not widened, so such slices go unchecked."""

    @property
    def edge_bytes(self) -> int:
        """The scratch buffer the edges land in."""
        return sum(p.length for pieces in (self.edges or {}).values() for p in pieces)

    @property
    def nbytes(self) -> int:
        return sum(p.length for pieces in self.pieces.values() for p in pieces)


def plan_reads(manifest: Manifest, runs: Mapping[int, Runs]) -> ReadPlan:
    """The ``ReadPlan`` of reading ``runs`` (tensor index -> selected bytes) of ``manifest``'s version."""
    pieces: dict[int, tuple[Piece, ...]] = {}
    whole, unserved = set(), set()
    for chunk in manifest.chunks():
        got: list[Piece] = []
        contiguous = True
        for seg in chunk.segments:
            sel = runs.get(seg.tensor)
            if sel is None:
                continue
            got.extend(Piece(seg.tensor, o, n, local) for o, n, local in sel.overlap(seg.offset, seg.length))
            contiguous = contiguous and sel.contiguous
        if not got:
            continue
        pieces[chunk.index] = tuple(got)
        if sum(p.length for p in got) == chunk.nbytes:
            whole.add(chunk.index)
            if contiguous:
                continue
        unserved.add(chunk.index)
    regions = {i: ((r.first, r.nbytes) if r.contiguous else (0, 0)) for i, r in runs.items()}
    return ReadPlan(pieces, frozenset(whole), frozenset(unserved), regions,
                    tuple(spec.nbytes for spec in manifest.tensors))


__all__ = ["Piece", "ReadPlan", "Runs", "TensorSlice", "plan_reads"]
