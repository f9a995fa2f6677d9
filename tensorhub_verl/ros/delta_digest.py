"""A chunk's target digest from its base digest and the changed bytes alone.

The package's digest (``lindigest``) is linear in the bytes of a chunk: a low byte of a word counts as its value,
a high byte as 256 times its signed value, each times a weight fixed by the byte's place on its tensor's grid.
So ``digest(target) = digest(base) + sum over changed bytes of (value(new) - value(old)) * weight`` (mod P, per
lane): a reader that applied a delta checks the result against version N's chunk digest while reading only the
words the delta changed, and a publisher derives N's digests from N-1's the same way.

A chunk's bytes are its segments' bytes in order (``manifest.Chunk``); ``chunk_grid`` names, for each, where it
lies on its tensor's grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.delta_codec import ChunkChanges
from tensorhub_verl.ros.wire.manifest import Chunk, TensorSpec


@dataclass(frozen=True, slots=True)
class GridPiece:
    """One segment of a chunk: ``length`` bytes from chunk byte ``start``, which are the bytes from ``offset`` of
    a tensor whose grid rows are ``row_bytes`` long (``lindigest.row_bytes``)."""

    start: int
    length: int
    offset: int
    row_bytes: int


def chunk_grid(chunk: Chunk, specs: Sequence[TensorSpec]) -> tuple[GridPiece, ...]:
    """Where each byte of ``chunk`` lies on its tensor's grid (``specs``: the manifest's tensors)."""
    pieces, start = [], 0
    for seg in chunk.segments:
        spec = specs[seg.tensor]
        pieces.append(GridPiece(start, seg.length, seg.offset, lindigest.row_bytes(spec.shape, spec.nbytes)))
        start += seg.length
    return tuple(pieces)


def digest_change(grid: Sequence[GridPiece], offsets: torch.Tensor, old: torch.Tensor,
                  new: torch.Tensor) -> torch.Tensor:
    """Digest lanes (int64 [LANES] on the bytes' device) of the change from ``old`` to ``new`` bytes (uint8) at
    chunk byte ``offsets`` (int64, distinct): what adds to the base chunk's digest to give the target's."""
    dev = offsets.device
    if not offsets.numel():
        return lindigest.zero(dev)
    if not grid:
        raise ValueError("an empty grid has no bytes to change")
    starts = torch.tensor([p.start for p in grid], dtype=torch.int64, device=dev)
    ends = torch.tensor([p.start + p.length for p in grid], dtype=torch.int64, device=dev)
    piece = torch.searchsorted(starts, offsets, right=True) - 1
    if bool((piece < 0).any()) or bool((offsets >= ends[piece]).any()):
        raise ValueError(f"a changed byte lies outside the chunk's {int(ends[-1])} bytes")
    tensor_off = torch.tensor([p.offset for p in grid], dtype=torch.int64, device=dev)[piece] + offsets - starts[piece]
    rb = torch.tensor([p.row_bytes for p in grid], dtype=torch.int64, device=dev)[piece]
    groups = torch.tensor([lindigest._groups(p.row_bytes) for p in grid], dtype=torch.int64, device=dev)[piece]
    row, col = tensor_off // rb, tensor_off % rb
    word, high = col // 2, col % 2
    g = row * groups + word // lindigest.GROUP
    a, b = lindigest._TABLES.get(dev, int(g.max()) + 1)
    signed = lambda x: x.to(torch.int64) - 256 * (x.to(torch.int64) >= 128).to(torch.int64)  # noqa: E731
    delta = torch.where(high.bool(), 256 * (signed(new) - signed(old)), new.to(torch.int64) - old.to(torch.int64))
    weighted = (delta[:, None] * b[word % lindigest.GROUP].to(torch.int64)).remainder_(lindigest.P)
    return (weighted * a[g]).remainder_(lindigest.P).sum(0).remainder_(lindigest.P)


def target_digest_from_base(base_digest: str, grid: Sequence[GridPiece], changes: ChunkChanges) -> str:
    """The target chunk's digest (hex) from the base chunk's and the changes a delta makes
    (``delta_codec.decode_chunk``), reading only the changed words."""
    lanes = digest_change(grid, *changes.byte_changes()).tolist()
    return lindigest.to_hex([(x + y) % lindigest.P for x, y in zip(lindigest.from_hex(base_digest), lanes)])
