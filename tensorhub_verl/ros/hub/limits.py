"""What one version may cost the hub, and the checks that run before the hub takes its lock.

A publish is validated and its chunk map built here, outside ``HubState``'s lock: one oversized or
many-tensor publish must never stall other workers' heartbeats. The chunk count is derived arithmetically
(chunks are packed back to back) and checked before any chunk object is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from tensorhub_verl.errors import ConfigError, InvalidRequest, ManifestMismatch
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest, dtype_from_name, shard_bytes
from tensorhub_verl.ros.wire.convert import manifest_from_msg


@dataclass(frozen=True, slots=True, kw_only=True)
class HubLimits:
    max_tensors: int = 65_536
    """Tensors in one version of one layout (a 70B dense model has ~1k; a large MoE with per-expert
    tensors tens of thousands)."""
    max_tensor_bytes: int = 1 << 40
    """Bytes of one tensor (1 TiB)."""
    max_version_bytes: int = 4 << 40
    """Bytes of one version in one layout (4 TiB)."""
    max_chunks: int = 1 << 18
    """Chunks of one version: the hub keeps a chunk map per version (~100 bytes per chunk). 2**18 chunks
    of the default 8 MiB is 2 TiB; with tiny chunks, raise chunk_bytes rather than this."""
    max_shard_pieces: int = 1 << 21
    """Tensors x row shards of one row-sharded version: its chunk map is cut piece by piece (1k tensors
    on 2k FSDP ranks)."""
    max_pending_shards_per_worker: int = 8
    """Shards one worker may have pending at once: published into shard groups (``shard_count`` > 1) that
    are not complete yet. A trainer rank has one per version in flight; each costs the hub a chunk map."""
    max_pending_pieces_per_worker: int = 1 << 22
    """Tensors x row shards over one worker's pending shards' versions: what their chunk maps cost the hub
    (about 130 bytes of hub memory per piece; two versions at ``max_shard_pieces``)."""
    max_pending_pieces_per_job: int | None = None
    """The same over all pending versions of one job's workers, each version counted once (worker ids are free to
    make: a budget per id alone bounds nothing). None: twice ``max_pending_pieces_per_worker`` (about 1 GiB of
    hub memory at the defaults)."""
    max_pending_pieces: int | None = None
    """The same over the whole hub (job keys are free to make too). None: four times the job's budget."""

    def __post_init__(self) -> None:
        if self.max_pending_pieces_per_job is None:
            object.__setattr__(self, "max_pending_pieces_per_job", 2 * self.max_pending_pieces_per_worker)
        if self.max_pending_pieces is None:
            object.__setattr__(self, "max_pending_pieces", 4 * self.max_pending_pieces_per_job)
        for name in ("max_tensors", "max_tensor_bytes", "max_version_bytes", "max_chunks", "max_shard_pieces",
                     "max_pending_shards_per_worker", "max_pending_pieces_per_worker", "max_pending_pieces_per_job",
                     "max_pending_pieces"):
            if getattr(self, name) < 1:
                raise ConfigError(f"HubLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tensors > msg.MAX_TENSORS or self.max_chunks > msg.MAX_CHUNKS:
            raise ConfigError(f"HubLimits may not exceed the wire caps ({msg.MAX_TENSORS} tensors, "
                              f"{msg.MAX_CHUNKS} chunks)")


@dataclass(frozen=True, slots=True)
class PreparedVersion:
    manifest: Manifest
    chunks: tuple[Chunk, ...]
    shard_chunks: frozenset[int] | None = None
    """The chunks that the publishing row shard holds (``Publish.shard_rank``); None: a full holder."""


def prepare_version(m: msg.ManifestMsg, limits: HubLimits, shard_rank: int | None = None) -> PreparedVersion:
    """Checks a published manifest against ``limits`` and builds its chunk map. No hub state is touched.

    ``shard_rank``: the publisher is that row shard (``Publish.shard_rank``), so its digests may be "" for
    the chunks of other ranks, and only for those."""
    if len(m.tensors) > limits.max_tensors:
        raise InvalidRequest(f"{len(m.tensors)} tensors in one version exceed the hub's limit of "
                             f"{limits.max_tensors} (HubLimits.max_tensors)")
    if len(m.tensors) * m.row_shards > limits.max_shard_pieces:
        raise InvalidRequest(f"{len(m.tensors)} tensors in {m.row_shards} row shards exceed the hub's limit of "
                             f"{limits.max_shard_pieces} pieces (HubLimits.max_shard_pieces)")
    manifest = manifest_from_msg(m)
    specs = manifest.tensors
    total = 0
    for spec in specs:
        expected = _numel(spec.shape) * _itemsize(spec.dtype)
        if spec.nbytes != expected:
            raise InvalidRequest(f"tensor {spec.name!r}: nbytes {spec.nbytes} does not match shape "
                                 f"{list(spec.shape)} of {spec.dtype} ({expected} bytes)")
        if spec.nbytes > limits.max_tensor_bytes:
            raise InvalidRequest(f"tensor {spec.name!r} has {spec.nbytes} bytes, over the hub's limit of "
                                 f"{limits.max_tensor_bytes} per tensor (HubLimits.max_tensor_bytes)")
        total += spec.nbytes
    if total == 0:
        raise InvalidRequest("a version must hold at least one byte")
    if total > limits.max_version_bytes:
        raise InvalidRequest(f"version of {total} bytes exceeds the hub's limit of {limits.max_version_bytes} "
                             f"(HubLimits.max_version_bytes)")
    runs = rank_chunk_runs(specs, m.chunk_bytes, m.row_shards)
    chunks = sum(ranks * per_rank for ranks, per_rank in runs)
    if chunks > limits.max_chunks:
        raise InvalidRequest(f"{total} bytes in chunks of {m.chunk_bytes} make {chunks} chunks, over the hub's "
                             f"limit of {limits.max_chunks}; publish with a larger chunk_bytes")
    if len({s.name for s in specs}) != len(specs):
        raise InvalidRequest("tensor names in a manifest must be unique")
    if m.chunk_digests and len(m.chunk_digests) != chunks:
        raise InvalidRequest(f"{len(m.chunk_digests)} chunk digests for {chunks} chunks; send one per chunk or none")
    if shard_rank is not None and m.row_shards == 1:
        raise InvalidRequest(f"shard_rank {shard_rank} needs a manifest with row_shards > 1; publish whole "
                             f"tensors without shard_rank")
    if shard_rank is not None and shard_rank >= m.row_shards:
        raise InvalidRequest(f"shard_rank {shard_rank} is out of range for {m.row_shards} row shards "
                             f"(0..{m.row_shards - 1})")
    own = None if shard_rank is None else _rank_span(runs, shard_rank)
    _check_digests(m.chunk_digests, own)
    chunk_map = manifest.chunks()
    _check_blocks(manifest, chunk_map, None if own is None else set(own))
    return PreparedVersion(manifest, chunk_map, None if own is None else frozenset(own))


def rank_chunk_runs(specs, chunk_bytes: int, row_shards: int) -> list[tuple[int, int]]:
    """The chunks of each rank's part of the chunk map (``manifest.rank_chunk_counts``) as runs of equal ranks,
    ``[(ranks, chunks of each), ...]`` in rank order, in O(tensors log tensors) whatever ``row_shards`` is: a
    tensor gives ``ceil(rows / row_shards)`` rows to each of its first ranks, the rest to one more, none to
    the others (``manifest.row_range``), so each rank's byte total changes only at a tensor's two boundaries.
    The hub checks a publish's chunk count with this before anything costs per rank or per piece."""
    if row_shards == 1:
        total = sum(spec.nbytes for spec in specs)
        return [(1, -(-total // chunk_bytes))]
    steps: dict[int, int] = {}  # rank -> change of the per-rank byte total at that rank

    def add(start: int, stop: int, nbytes: int) -> None:
        if nbytes and start < stop:
            steps[start] = steps.get(start, 0) + nbytes
            steps[stop] = steps.get(stop, 0) - nbytes

    for spec in specs:
        if not spec.shape:
            add(0, 1, spec.nbytes)  # a 0-dim tensor: rank 0 holds it
            continue
        rows = spec.shape[0]
        if rows == 0:
            continue
        per = -(-rows // row_shards)
        row = spec.nbytes // rows
        full = rows // per  # ranks with ``per`` rows; the next one holds the rest, if any
        add(0, full, per * row)
        add(full, full + 1, (rows - full * per) * row)
    runs: list[tuple[int, int]] = []
    total, at = 0, 0
    for rank in sorted(steps) + [row_shards]:
        if rank > at:
            runs.append((min(rank, row_shards) - at, -(-total // chunk_bytes)))
            at = rank
        if rank >= row_shards:
            break
        total += steps.get(rank, 0)
    return runs


def _rank_span(runs: list[tuple[int, int]], rank: int) -> range:
    """The indices of ``rank``'s chunks, from ``rank_chunk_runs``."""
    first = 0
    for ranks, per_rank in runs:
        if rank < ranks:
            start = first + rank * per_rank
            return range(start, start + per_rank)
        first += ranks * per_rank
        rank -= ranks
    raise InvalidRequest(f"row shard {rank} is past the manifest's ranks")


def _check_blocks(manifest: Manifest, chunks: tuple, own: set[int] | None) -> None:
    """Block digests name a tensor, a dim it has, a block count that divides that dim, and one digest per
    block and segment of the tensor: what a ranged reader indexes (integrity.py). A row shard (``own``: its
    chunks) sets no cell of another rank's segments: the hub puts the ranks' cells together."""
    if not manifest.block_digests:
        return
    segments: dict[int, int] = {}
    foreign: dict[int, list[int]] = {}
    for chunk in chunks:
        for seg in chunk.segments:
            if own is not None and chunk.index not in own:
                foreign.setdefault(seg.tensor, []).append(segments.get(seg.tensor, 0))
            segments[seg.tensor] = segments.get(seg.tensor, 0) + 1
    for b in manifest.block_digests:
        spec = manifest.tensors[b.tensor] if b.tensor < len(manifest.tensors) else None
        size = None if spec is None else (spec.shape[b.dim] if b.dim < len(spec.shape) else 1 if b.dim == 0 else None)
        if size is None or size % b.blocks or len(b.digests) != segments.get(b.tensor, 0) * b.blocks:
            raise InvalidRequest(f"block digests of tensor {b.tensor} dim {b.dim} do not fit the manifest: send "
                                 f"{b.blocks} per segment of a tensor that has that dim, or none")
        if any(any(b.digests[k * b.blocks:(k + 1) * b.blocks]) for k in foreign.get(b.tensor, ())):
            raise InvalidRequest(f"block digests of tensor {b.tensor} dim {b.dim} set cells of another row shard's "
                                 f"segments; a row shard sends '' for the segments of the other ranks' chunks")


def _check_digests(digests: list[str], own: range | None) -> None:
    """Every digest is set, but a row shard (``own``: its chunks) sends "" for the other ranks' chunks."""
    if not digests:
        return
    for index, digest in enumerate(digests):
        if bool(digest) != (own is None or index in own):
            what = "every chunk, or none" if own is None else \
                f"its chunks {own.start}..{own.stop - 1} and '' for the other row shards' chunks"
            raise InvalidRequest(f"chunk digest {index} is {'set' if digest else 'empty'}; send a digest for {what}")


def check_regions(regions: list[msg.RegionMsg], manifest: Manifest, shard_rank: int | None,
                  ranged: bool = False) -> None:
    """One region per tensor, covering exactly what the holder holds: the whole tensor (offset 0), or for
    row shard ``shard_rank`` its rows of it, or for a ``ranged`` reader any byte range inside the tensor.
    Readers compute remote addresses from these, so a region that claims other bytes would make them read the
    wrong memory."""
    if len(regions) != len(manifest.tensors):
        raise InvalidRequest(f"{len(regions)} memory regions for {len(manifest.tensors)} tensors; send one "
                             f"region per tensor")
    for spec, region in zip(manifest.tensors, regions):
        if ranged:
            if region.nbytes is None or region.offset + region.nbytes > spec.nbytes:
                raise InvalidRequest(f"tensor {spec.name!r}: a ranged reader's region must name a byte range "
                                     f"inside the tensor's {spec.nbytes} bytes")
            continue
        start, stop = (0, spec.nbytes) if shard_rank is None else shard_bytes(spec, shard_rank, manifest.row_shards)
        nbytes = stop - start if region.nbytes is None and shard_rank is None else region.nbytes
        if region.offset != start or nbytes != stop - start:
            raise InvalidRequest(
                f"tensor {spec.name!r}: region covers bytes [{region.offset}, "
                f"{'end' if region.nbytes is None else region.offset + region.nbytes}) but this holder holds "
                f"[{start}, {stop}){'' if shard_rank is None else f' (row shard {shard_rank} of {manifest.row_shards})'}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    try:
        return torch.empty((), dtype=dtype_from_name(dtype)).element_size()
    except ManifestMismatch as e:
        raise InvalidRequest(str(e)) from None


def check_row_shard(req: msg.Publish) -> None:
    """A row shard is one of ``row_shards`` publishes of one version, grouped and counted as such."""
    if req.shard_rank is None:
        return  # prepare_version checked the rank against row_shards
    if req.shard_count != req.manifest.row_shards or req.shard_group is None:
        raise InvalidRequest(f"a row shard publishes with shard_count == row_shards ({req.manifest.row_shards}, got "
                             f"{req.shard_count}) and a shard_group naming its trainer")


def check_same_chunk_map(existing: Manifest, incoming: Manifest) -> None:
    """A row shard serves only its rank's chunks of the version's chunk map: it must be cut the same way."""
    if (existing.chunk_bytes, existing.row_shards) != (incoming.chunk_bytes, incoming.row_shards):
        raise ManifestMismatch(
            f"{incoming.model} v{incoming.version} ({incoming.layout}) is published with chunk_bytes "
            f"{existing.chunk_bytes} and {existing.row_shards} row shard(s); a row shard must publish the same "
            f"(got {incoming.chunk_bytes} and {incoming.row_shards})")
