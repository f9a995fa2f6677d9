"""``Client.fetch_slices(..., have=...)``: a tensor-parallel rank that holds its slices of version N-1 reads N as
the delta from it and applies only its part.

    rank (into: its slices of N-1)                   hub / holders
      ranged plan of its slices; each chunk's check: the sum of N's block digests its slices cover
                                                      <-- the delta form (whole: it is small), each chunk checked
      per chunk it touches: decode the whole chunk's payload onto its bytes, write its places
      digest its bytes of every chunk it touches (changed or not) against N's block digests
      failed chunks restored, then re-read in full (its slices of them) from verified holders of N

Fail closed as ``fetch(have=...)``: a header that does not describe the reader's base and N's chunk map is
refused before a byte is written; a chunk that fails its check is restored and re-read; when that re-read fails
too, the error names the chunks that hold neither version. A chunk whose slices cover digest blocks only in
part (a vocabulary padded per rank, a TP degree that is not a power of two) cannot be checked without the other
ranks' bytes: it is read in full (``DeltaStats.full_chunks``), with the edges that complete its blocks.
The rank holds the delta form it read (whole, self-contained) and serves it onward; never the version, of
which it holds parts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.client.delta import DeltaStats, _add, _read_delta, apply_and_reread
from tensorhub_verl.ros.client.delta_slice_apply import apply_delta_slices
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.wire.integrity import ChunkChecker
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.wire.ranges import ReadPlan, TensorSlice

if TYPE_CHECKING:
    from tensorhub_verl.ros.client.client import Client

def unchecked_chunks(plan: ReadPlan, checker: ChunkChecker) -> list[int]:
    """The chunks of ``plan`` whose slices a delta cannot be checked on without the other ranks' bytes: slices
    that cover digest blocks in part (checked with their edges, which only a full read brings), or slices along a
    dim without block digests."""
    return sorted(c for c in plan.pieces if (plan.edges and plan.edges.get(c)) or not checker.checks(c))


def fetch_slices_with_delta(client: "Client", manifest: Manifest, into: Mapping[str, torch.Tensor],
                            tensors: dict[str, torch.Tensor], plan: ReadPlan,
                            by_index: Mapping[int, TensorSlice | None], started: float, timeout: float | None,
                            have: int, mode: str = "auto") -> FetchStats:
    """``Client.fetch_slices(..., have=...)`` once the version's manifest is known and the slices planned
    (``tensors``, ``plan``, ``by_index``: the ranged read ``Client.fetch_slices`` made of ``into``): reads the
    version's slices as the delta from ``have`` where one is published, else in full; ``into`` must hold
    ``have``'s slices. Chunks the delta cannot be checked on (``unchecked_chunks``) are read in full."""
    model, layout = manifest.model, manifest.layout
    if have >= manifest.version:
        raise errors.InvalidRequest(f"into holds v{have} of {model!r}; v{manifest.version} is not newer: nothing "
                                    f"to fetch")
    delta = DeltaStats(have)
    checker = ChunkChecker(manifest, plan, by_index)
    full = unchecked_chunks(plan, checker)
    if full:
        delta.reasons.append(f"{len(full)} chunk(s) of the slices (first: {full[0]}) read in full: the slices cover "
                             f"their digest blocks in part (a vocabulary or TP degree that does not split into "
                             f"whole blocks), so their bytes cannot be checked without the other ranks'")
    read = None
    if mode != "off" and len(full) < len(plan.pieces):
        read = _read_delta(client, manifest, have, tensors, True, started, timeout, delta)
    if read is None:  # N's slices in full, as a rank without N-1 reads them
        stats = client._run_fetch(manifest, tensors, plan, False, started, timeout, by_index)
        delta.fallback_chunks, delta.fallback_bytes = len(plan.pieces), stats.bytes
        stats.buffers, stats.delta = dict(into), delta
        return stats
    try:
        base = client.manifest(model, have, layout)
        base_checker = ChunkChecker(base, plan, by_index) if base.digest == manifest.digest else None
    except errors.VersionNotFound:
        base_checker = None  # out of retention: a failed chunk counts as a wrong base
    ordered = list(tensors.values())
    applied = _sub_plan(plan, sorted(set(plan.pieces) - set(full)))
    stats = apply_and_reread(
        client, manifest, have, read,
        lambda header, blob: apply_delta_slices(manifest, header, blob, applied, ordered, checker, base_checker),
        lambda failed: client._run_fetch(manifest, tensors, _sub_plan(plan, failed), False, started, timeout,
                                         by_index),
        delta, True, timeout)
    if full:
        more = client._run_fetch(manifest, tensors, _sub_plan(plan, full), False, started, timeout, by_index)
        delta.full_chunks, delta.full_bytes = len(full), more.bytes
        _add(stats, more)
    stats.chunks = len(plan.pieces)
    stats.seconds = time.monotonic() - started
    stats.buffers, stats.delta = dict(into), delta
    return stats


def _sub_plan(plan: ReadPlan, chunks: list[int]) -> ReadPlan:
    """The ranged read of ``plan`` restricted to ``chunks`` (its edges kept whole: their places in the scratch
    buffer stay those of ``plan``)."""
    keep = frozenset(chunks)
    return ReadPlan({c: plan.pieces[c] for c in sorted(keep)}, plan.whole & keep, plan.unserved & keep,
                    plan.regions, plan.tensor_nbytes, plan.edges)


__all__ = ["fetch_slices_with_delta", "unchecked_chunks"]
