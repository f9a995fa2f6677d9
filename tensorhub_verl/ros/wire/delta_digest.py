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

import numpy as np
import torch

from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire import delta_codec
from tensorhub_verl.ros.wire.delta_codec import ChunkChanges
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
                  new: torch.Tensor) -> list[int]:
    """Digest lanes of the change from ``old`` to ``new`` bytes (uint8) at chunk byte ``offsets`` (int64,
    distinct): what adds (mod P) to the base chunk's digest to give the target's. Host bytes are summed with
    numpy on this thread, device bytes with torch ops on their device (as ``lindigest`` does)."""
    if offsets.device.type == "cpu" and delta_codec.HOST_NUMPY:
        return _change_lanes(grid, offsets.numpy(), old.numpy(), new.numpy(), np)
    return _change_lanes(grid, offsets, old, new, torch)


def _change_lanes(grid, offsets, old, new, xp) -> list[int]:
    host = xp is np
    differ = old != new  # bytes of a changed word that kept their value add nothing
    offsets, old, new = offsets[differ], old[differ], new[differ]
    if not (offsets.size if host else offsets.numel()):
        return [0] * lindigest.LANES
    if not grid:
        raise ValueError("an empty grid has no bytes to change")

    def table(values):
        t = np.asarray(values, dtype=np.int64)
        return t if host else torch.from_numpy(t).to(offsets.device)

    starts = table([p.start for p in grid])
    ends = table([p.start + p.length for p in grid])
    if len(grid) == 1:
        piece = offsets * 0
    else:
        piece = (np.searchsorted(starts, offsets, side="right") if host
                 else torch.searchsorted(starts, offsets, right=True)) - 1
    if bool((piece < 0).any()) or bool((offsets >= ends[piece]).any()):
        raise ValueError(f"a changed byte lies outside the chunk's {int(ends[-1])} bytes")
    tensor_off = table([p.offset for p in grid])[piece] + offsets - starts[piece]
    rb = table([p.row_bytes for p in grid])[piece]
    groups = table([lindigest._groups(p.row_bytes) for p in grid])[piece]
    row, col = tensor_off // rb, tensor_off % rb
    word, high = col // 2, col % 2
    g = row * groups + word // lindigest.GROUP
    top = int(g.max()) + 1
    if host:
        a, b = lindigest._TABLES.host(top)
        o, n = old.astype(np.int64), new.astype(np.int64)
    else:
        a, b = lindigest._TABLES.get(offsets.device, top)
        b = b.to(torch.int64)
        o, n = old.to(torch.int64), new.to(torch.int64)
    # a low byte counts as its value, a high byte as 256 times its signed value
    delta = n - o
    delta = delta + high * (255 * delta - 65536 * ((n >= 128).astype(np.int64) if host else (n >= 128).to(torch.int64))
                            + 65536 * ((o >= 128).astype(np.int64) if host else (o >= 128).to(torch.int64)))
    weighted = (delta[:, None] * b[word % lindigest.GROUP]) % lindigest.P
    lanes = ((weighted * a[g]) % lindigest.P).sum(0) % lindigest.P
    return [int(x) for x in lanes.tolist()]


def _word_aligned(grid: Sequence[GridPiece]) -> bool:
    """Every 16-bit word of the chunk is a whole word of its tensor's grid."""
    return all(p.start % 2 == 0 and p.offset % 2 == 0 and p.length % 2 == 0 and p.row_bytes % 2 == 0
               for p in grid)


def _word_lanes(grid: Sequence[GridPiece], offsets: torch.Tensor, old: torch.Tensor,
                new: torch.Tensor) -> list[int]:
    """``digest_change`` for whole words (int16 ``old`` / ``new`` at even chunk byte ``offsets``, increasing),
    with torch ops on the words' device: a word counts as its signed value. Piece by piece, so each piece's grid
    is a few scalars. A word whose value did not change adds nothing (its difference is 0): no word is filtered
    out. Host words take ``_host_word_lanes``."""
    total = [0] * lindigest.LANES
    starts = [p.start for p in grid]
    bounds = torch.tensor(starts + [grid[-1].start + grid[-1].length], device=offsets.device)
    cuts = torch.searchsorted(offsets, bounds).tolist()
    n = offsets.numel()
    if n and int(cuts[-1]) != n:
        raise ValueError(f"a changed byte lies outside the chunk's {grid[-1].start + grid[-1].length} bytes")
    group_shift = lindigest.GROUP.bit_length() - 1
    for k, piece in enumerate(grid):
        lo, hi = int(cuts[k]), int(cuts[k + 1])
        if lo == hi:
            continue
        off = offsets[lo:hi] + (piece.offset - piece.start)
        rb = piece.row_bytes
        groups = lindigest._groups(rb)
        if rb % (2 * lindigest.GROUP) == 0 or piece.offset + piece.length <= rb:
            # rows of whole groups (or all in row 0): a word's group is its tensor byte over a group's bytes
            g = off >> (group_shift + 1)
            at = (off >> 1) & (lindigest.GROUP - 1)
        else:
            row, col = off // rb, off % rb
            word = col >> 1
            g = row * groups + (word >> group_shift)
            at = word & (lindigest.GROUP - 1)
        top = int(g[-1]) + 1  # offsets increase, so groups do
        a, b = lindigest._TABLES.get(offsets.device, top)
        b = b.to(torch.int64)
        delta = new[lo:hi].to(torch.int64) - old[lo:hi].to(torch.int64)
        weighted = (delta[:, None] * b[at]) % lindigest.P
        lanes = (((weighted * a[g]) % lindigest.P).sum(0) % lindigest.P).tolist()
        total = [(t + int(v)) % lindigest.P for t, v in zip(total, lanes)]
    return total


def _host_word_lanes(grid: Sequence[GridPiece], words: np.ndarray, old: np.ndarray,
                     new: np.ndarray) -> list[int]:
    """``_word_lanes`` in numpy on this thread: int16 ``old`` / ``new`` at the chunk's 16-bit words ``words``
    (int64 indices, increasing; chunk byte ``2 * words``). Per piece, per weight group: the sum of
    (new - old) * B over the group's changed words, reduced mod P, times the group's A, mod P, summed. Both lanes
    at once, as the real and imaginary parts of complex128 (B's pairs, ``lindigest._Tables.host_pairs``), each
    exact in float64: a term is below 2**37 (|new - old| < 2**16, |B| < 2**21) and a group sums at most
    ``GROUP`` of them. The groups come from the words' own order (a word's group never decreases along the
    chunk), so only the groups that hold a changed word are touched."""
    total = [0] * lindigest.LANES
    n = words.size
    if not n:
        return total
    end = grid[-1].start + grid[-1].length
    if int(words[-1]) * 2 + 1 >= end or int(words[0]) < 0:
        raise ValueError(f"a changed byte lies outside the chunk's {end} bytes")
    delta = np.subtract(new, old, dtype=np.float64)
    if len(grid) == 1:
        cuts = (0, n)
    else:
        cuts = np.searchsorted(words, [p.start // 2 for p in grid] + [end // 2]).tolist()
    group_shift = lindigest.GROUP.bit_length() - 1
    for k, piece in enumerate(grid):
        lo, hi = cuts[k], cuts[k + 1]
        if lo == hi:
            continue
        shift = (piece.offset - piece.start) // 2  # chunk word -> the tensor's word (both offsets even)
        rb = piece.row_bytes
        skipped = 0
        if rb % (2 * lindigest.GROUP) == 0 or piece.offset + piece.length <= rb:
            # rows of whole groups (or all in row 0): a word's group is its tensor word over a group's words; a
            # piece that starts on a group edge counts its groups from there (no pass to shift its words)
            if shift % lindigest.GROUP:
                word = words[lo:hi] + shift
            else:
                word, skipped = words[lo:hi], shift >> group_shift
            g = word >> group_shift
            at = word & (lindigest.GROUP - 1)
        else:
            row, col = np.divmod(words[lo:hi] + shift, rb // 2)
            g = row * lindigest._groups(rb) + (col >> group_shift)
            at = col & (lindigest.GROUP - 1)
        starts = np.empty(g.size, dtype=bool)
        starts[0] = True
        np.not_equal(g[1:], g[:-1], out=starts[1:])
        firsts = np.flatnonzero(starts)  # each group's first changed word
        ids = g[firsts]
        if skipped:
            ids += skipped
        a, b = lindigest._TABLES.host_pairs(int(ids[-1]) + 1)
        weighted = np.take(b, at)
        weighted *= delta[lo:hi]
        sums = np.add.reduceat(weighted, firsts).view(np.float64).reshape(-1, lindigest.LANES).astype(np.int64)
        sums %= lindigest.P
        sums *= np.take(a, ids, axis=0)  # each below 2**62
        sums %= lindigest.P
        for lane in range(lindigest.LANES):  # a column at a time: numpy sums a 1-D run faster than axis 0
            total[lane] = (total[lane] + int(sums[:, lane].sum())) % lindigest.P  # below 2**31 per group
    return total


def target_digest_from_base(base_digest: str, grid: Sequence[GridPiece], changes: ChunkChanges) -> str:
    """The target chunk's digest (hex) from the base chunk's and the changes a delta makes
    (``delta_codec.decode_chunk``), reading only the changed words. Whole 16-bit words where the chunk's words
    are its tensors' grid words (the common case), byte by byte otherwise."""
    w = changes.word_bytes
    if w % 2 == 0 and grid and _word_aligned(grid):
        per = w // 2
        dev = changes.positions.device
        if dev.type == "cpu" and delta_codec.HOST_NUMPY:  # numpy on this thread, as lindigest does
            pos = changes.positions.numpy()
            words = pos if per == 1 else (pos[:, None] * per + np.arange(per)[None]).reshape(-1)
            lanes = _host_word_lanes(grid, words, changes.old.numpy().reshape(-1).view(np.int16),
                                     changes.new.numpy().reshape(-1).view(np.int16))
        else:
            old = changes.old.reshape(-1).view(torch.int16)
            new = changes.new.reshape(-1).view(torch.int16)
            offs = ((changes.positions[:, None] * per + torch.arange(per, device=dev)[None]) * 2).reshape(-1)
            lanes = _word_lanes(grid, offs, old, new)
        if changes.old_tail != changes.new_tail:
            k = len(changes.new_tail)
            tail = digest_change(grid, torch.arange(changes.tail_offset, changes.tail_offset + k),
                                 torch.frombuffer(bytearray(changes.old_tail), dtype=torch.uint8),
                                 torch.frombuffer(bytearray(changes.new_tail), dtype=torch.uint8))
            lanes = [(x + y) % lindigest.P for x, y in zip(lanes, tail)]
    else:
        lanes = digest_change(grid, *changes.byte_changes())
    return lindigest.to_hex([(x + y) % lindigest.P for x, y in zip(lindigest.from_hex(base_digest), lanes)])
