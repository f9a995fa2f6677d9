"""Applying a delta to a ranged reader's slices: a tensor-parallel rank holds only its rows or columns of each
tensor, while the delta's payloads and digests cover whole chunks.

Per chunk the rank touches, its bytes of the base are gathered at their places in a chunk-sized scratch
buffer (zeros elsewhere), the whole chunk's payload is decoded and written there (``delta_codec``: every
encoding is element by element, so the bytes of the rank's places come out right whatever lies elsewhere), and
the rank's places are copied back into its buffers. The check is the one a ranged read of the version makes:
the digest of the rank's bytes of the chunk against the sum of the version's block digests they cover
(``integrity.ChunkChecker``), for the written chunks and the unchanged ones alike. A chunk that fails is
restored to the bytes it held (the decoded changes name every word written) and reported, so that the caller
re-reads it in full.

Pure of I/O: ``delta_slices.py`` reads the delta form, calls this, and re-reads what failed.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from tensorhub_verl.ros.client.delta_chunks import ApplyResult, decode_payload, finish, reverted
from tensorhub_verl.ros.wire.delta_codec import ChunkChanges, write_changes
from tensorhub_verl.ros.wire.delta_form import SAME, DeltaHeader
from tensorhub_verl.ros.wire.integrity import ChunkChecker, local_views
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest
from tensorhub_verl.ros.wire.ranges import Piece, ReadPlan

Run = tuple[int, int, int, int, int, int]
"""(tensor, count, length, position in the chunk, offset in the local buffer, stride in the chunk): ``count``
pieces of ``length`` bytes, one ``stride`` apart in the chunk and back to back in the local buffer."""


def piece_runs(chunk: Chunk, pieces: Sequence[Piece]) -> list[Run]:
    """Where a ranged read's pieces of ``chunk`` lie in the chunk's bytes, pieces one row apart (a column
    slice) merged into one strided run."""
    starts, at = {}, 0
    for seg in chunk.segments:
        starts[seg.tensor] = (seg.offset, seg.length, at)
        at += seg.length
    runs: list[list[int]] = []
    for p in pieces:
        seg_offset, seg_length, seg_start = starts[p.tensor]
        if not (seg_offset <= p.offset and p.offset + p.length <= seg_offset + seg_length):
            raise ValueError(f"a piece of tensor {p.tensor} lies outside chunk {chunk.index}")
        pos = seg_start + p.offset - seg_offset
        last = runs[-1] if runs else None
        if last is not None and last[0] == p.tensor and last[2] == p.length \
                and last[4] + last[1] * last[2] == p.local:
            stride = pos - (last[3] + (last[1] - 1) * last[5]) if last[1] > 1 else pos - last[3]
            if stride > 0 and (last[1] == 1 or stride == last[5]) and stride >= p.length:
                last[1] += 1
                last[5] = stride
                continue
        runs.append([p.tensor, 1, p.length, pos, p.local, p.length])
    return [tuple(r) for r in runs]


def _in_chunk(scratch: torch.Tensor, run: Run) -> torch.Tensor:
    _, count, length, pos, _, stride = run
    return scratch[pos:pos + (count - 1) * stride + length].as_strided((count, length), (stride, 1))


def _in_local(flats: Sequence[torch.Tensor], run: Run) -> torch.Tensor:
    tensor, count, length, _, local, _ = run
    return flats[tensor][local:local + count * length].view(count, length)


def gather(scratch: torch.Tensor, flats: Sequence[torch.Tensor], runs: Sequence[Run]) -> None:
    """The local bytes of ``runs`` into their places of the chunk ``scratch`` (the rest zeroed)."""
    scratch.zero_()
    for run in runs:
        _in_chunk(scratch, run).copy_(_in_local(flats, run))


def scatter(scratch: torch.Tensor, flats: Sequence[torch.Tensor], runs: Sequence[Run]) -> None:
    """The places of ``runs`` in the chunk ``scratch`` back into the local buffers."""
    for run in runs:
        _in_local(flats, run).copy_(_in_chunk(scratch, run))


def apply_delta_slices(target: Manifest, header: DeltaHeader, blob: torch.Tensor, plan: ReadPlan,
                       tensors: Sequence[torch.Tensor], checker: ChunkChecker,
                       base_checker: ChunkChecker | None = None) -> ApplyResult:
    """Applies a checked header's payloads (``delta_form.check_header``) to the chunks of ``plan`` (a ranged
    read without block edges) whose pieces lie in ``tensors`` (the ranged read's buffers, manifest order), which
    should hold the base version's bytes of them. ``checker`` checks the version's ranged read of ``plan``
    (every chunk of the plan checkable); ``base_checker`` the base version's, to tell a wrong base from a wrong
    delta when a chunk fails (without it, such a chunk counts as a wrong base).

    Returns what ``delta_chunks.apply_delta`` returns: a chunk that fails a check holds the bytes it held."""
    started = time.monotonic()
    result = ApplyResult()
    first = header.first_chunk
    flats = local_views(tensors)
    device = next((t.device for t in tensors if t.numel()), torch.device("cpu"))
    scratch: torch.Tensor | None = None
    written: dict[int, tuple[list[Run], ChunkChanges]] = {}
    same: list[int] = []
    for chunk in target.chunks()[first:first + len(header.encodings)]:
        i = chunk.index
        pieces = plan.pieces.get(i)
        if not pieces:
            continue
        if header.encodings[i - first] == SAME:
            same.append(i)
            continue
        runs = piece_runs(chunk, pieces)
        if scratch is None or scratch.numel() < chunk.nbytes:
            scratch = torch.empty(max(chunk.nbytes, target.chunk_bytes), dtype=torch.uint8, device=device)
        data = scratch[:chunk.nbytes]
        gather(data, flats, runs)
        changes = decode_payload(target, header, chunk, blob, data, result)
        if changes is None:
            continue
        write_changes(changes, data)
        scatter(data, flats, runs)
        written[i] = (runs, changes)
    for i in same:
        (result.applied if _holds(checker, plan, flats, i) else result.bad_base).append(i)
    for i, (runs, changes) in sorted(written.items()):
        if _holds(checker, plan, flats, i):
            result.applied.append(i)
            continue
        chunk = target.chunks()[i]
        data = scratch[:chunk.nbytes]
        gather(data, flats, runs)
        write_changes(reverted(changes), data)
        scatter(data, flats, runs)
        if base_checker is not None and _holds(base_checker, plan, flats, i):
            result.bad_target.append(i)
            result.reasons.append(f"chunk {i}: its {header.encodings[i - first]} payload does not give version "
                                  f"{header.target_version}'s bytes of these slices; restored")
        else:
            result.bad_base.append(i)
    return finish(result, header, started)


def _holds(checker: ChunkChecker, plan: ReadPlan, flats: Sequence[torch.Tensor], chunk: int) -> bool:
    """Whether the local bytes of ``chunk``'s pieces have the digest ``checker`` expects of them."""
    return checker.landed(plan.pieces[chunk], flats) == checker.expected(chunk)


__all__ = ["apply_delta_slices", "gather", "piece_runs", "scatter"]
