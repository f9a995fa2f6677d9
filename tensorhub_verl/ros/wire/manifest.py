"""A version's manifest: the tensors of one layout, and how their bytes are cut into chunks.

The chunk map is a pure function of (tensor specs, chunk size, row shards), so every holder and reader
of a layout derives the same chunks without shipping them. Tiny tensors share a chunk; large ones span many.

Row shards: a version may be published by ``row_shards`` workers that each hold a contiguous dim-0 row
range of every tensor (FSDP2's shards, ``torch.chunk`` semantics: see ``row_range``). Its chunk map then
packs rank 0's rows of every tensor, then rank 1's, and so on, and never lets a chunk span two ranks:
every chunk is served whole by the one rank that has it, or by any full holder.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch

from tensorhub_verl.errors import DtypeMismatch, ManifestMismatch

DEFAULT_CHUNK_BYTES = 8 << 20
HF_LAYOUT = "hf"
"""The trainer's layout: HF checkpoint names and shapes, what every engine can load."""
_SAMPLE_WINDOW = 4096
_SAMPLE_COUNT = 16

_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
        torch.int16, torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ManifestMismatch(f"unsupported dtype {name!r}; supported: {sorted(_DTYPES)}") from None


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> "TensorSpec":
        return cls(name, tuple(tensor.shape), dtype_name(tensor.dtype), tensor.numel() * tensor.element_size())


@dataclass(frozen=True, slots=True)
class Segment:
    """``length`` bytes of tensor number ``tensor`` starting at byte ``offset`` of that tensor."""

    tensor: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass(frozen=True, slots=True)
class TensorBlocks:
    """Digests of one tensor's blocks along ``dim`` (``blocks`` equal runs of its indices in that dim), per chunk
    segment of the tensor: ``digests[k * blocks + j]`` covers the bytes of the tensor's ``k``-th segment (in
    chunk order) that lie in block ``j`` ("" where there are none). A ranged read of a chunk whose slice is made
    of whole blocks is checked against the sum of the blocks it covers (``integrity.py``)."""

    tensor: int
    dim: int
    blocks: int
    digests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a version looks like in one layout. Holder-independent: addresses live with each holder."""

    model: str
    version: int
    layout: str
    tensors: tuple[TensorSpec, ...]
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    fingerprint: str = ""
    chunk_digests: tuple[str, ...] = ()
    """One digest per chunk (``integrity.py``), computed by the publisher; empty when it computed none. A row
    shard's publish has "" for the chunks of other ranks; the hub merges the shards' digests."""
    row_shards: int = 1
    """How many dim-0 row shards the chunk map is aligned to (1: the plain chunk map)."""
    digest_algorithm: str = ""
    """The algorithm of ``chunk_digests`` and ``block_digests`` (``lindigest.ALGORITHM``); "" without digests."""
    block_digests: tuple[TensorBlocks, ...] = ()
    """Per-tensor block digests that check ranged reads of chunks read in part; empty: those are unchecked."""
    shares: tuple["Manifest", ...] = ()
    """A version split over the shards of a hub run as several processes (``ShardedClient``): each shard's
    manifest of its share, in shard order, which carry the chunk maps and digests; this manifest lists every
    tensor of the version (``tensors``) and describes no chunk map of its own. Empty: one hub's manifest."""

    @staticmethod
    def of_shares(shares: Sequence["Manifest"], layout: str) -> "Manifest":
        """The whole version's manifest in ``layout`` from its shares' manifests (in shard order)."""
        first = shares[0]
        return Manifest(first.model, first.version, layout, tuple(t for m in shares for t in m.tensors),
                        first.chunk_bytes, shares=tuple(shares))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def digest(self) -> str:
        """Identifies the layout's shape: equal digests mean raw bytes can be copied between holders."""
        return layout_digest(self.layout, self.tensors, self.chunk_bytes, self.row_shards)

    def chunks(self) -> tuple[Chunk, ...]:
        """The chunk map: computed once per layout and kept (a fetch of 12,800 chunks would otherwise build 25,600
        objects each time, and the garbage collector's passes over them cost the reader more than its reads)."""
        try:
            return _chunk_map(self.tensors, self.chunk_bytes, self.row_shards)
        except TypeError:  # a spec whose shape is a list is not hashable: not kept
            return split_into_chunks(self.tensors, self.chunk_bytes, self.row_shards)

    def allocate(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Empty buffers matching this manifest, ready to pass as ``fetch(into=...)``."""
        return {t.name: torch.empty(t.shape, dtype=dtype_from_name(t.dtype), device=device) for t in self.tensors}


def layout_digest(layout: str, tensors: Iterable[TensorSpec], chunk_bytes: int, row_shards: int = 1) -> str:
    h = hashlib.blake2b(digest_size=16)
    # row_shards == 1 hashes exactly what it always did: existing digests stay valid.
    h.update(f"{layout}|{chunk_bytes}".encode() + (f"|rows{row_shards}".encode() if row_shards > 1 else b""))
    for t in tensors:
        h.update(f"|{t.name}:{t.dtype}:{'x'.join(map(str, t.shape))}:{t.nbytes}".encode())
    return h.hexdigest()


def row_range(rows: int, rank: int, ranks: int) -> tuple[int, int]:
    """Rows [start, stop) of dim 0 that ``rank`` of ``ranks`` holds, with ``torch.chunk`` semantics (FSDP2's):
    every rank gets ceil(rows / ranks) rows but the last ones, which get fewer or none."""
    if ranks < 1 or not 0 <= rank < ranks or rows < 0:
        raise ValueError(f"row_range needs rows >= 0 and 0 <= rank < ranks, got {rows}, {rank}, {ranks}")
    per = -(-rows // ranks)
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def shard_bytes(spec: TensorSpec, rank: int, ranks: int) -> tuple[int, int]:
    """Bytes [start, stop) of ``spec`` that ``rank`` holds. A 0-dim tensor has no rows: rank 0 holds it."""
    if not spec.shape:
        return (0, spec.nbytes) if rank == 0 else (spec.nbytes, spec.nbytes)
    start, stop = row_range(spec.shape[0], rank, ranks)
    row = spec.nbytes // spec.shape[0] if spec.shape[0] else 0
    return start * row, stop * row


def rank_chunk_counts(tensors: Iterable[TensorSpec], chunk_bytes: int, row_shards: int) -> list[int]:
    """Chunks of each rank's part of the chunk map, arithmetically (no chunk is built): the hub checks its
    limits with this before building a chunk map. ``[total]`` when row_shards is 1."""
    totals = [0] * row_shards
    for spec in tensors:
        for rank in range(row_shards):
            start, stop = shard_bytes(spec, rank, row_shards)
            totals[rank] += stop - start
    return [-(-total // chunk_bytes) for total in totals]


def shard_chunks(manifest: Manifest, rank: int) -> set[int]:
    """Indices of the chunks that row shard ``rank`` holds: a contiguous run, as ranks are packed in order."""
    counts = rank_chunk_counts(manifest.tensors, manifest.chunk_bytes, manifest.row_shards)
    first = sum(counts[:rank])
    return set(range(first, first + counts[rank]))


@functools.lru_cache(maxsize=8)
def _chunk_map(tensors: tuple[TensorSpec, ...], chunk_bytes: int, row_shards: int) -> tuple[Chunk, ...]:
    return split_into_chunks(tensors, chunk_bytes, row_shards)


def split_into_chunks(tensors: tuple[TensorSpec, ...], chunk_bytes: int, row_shards: int = 1) -> tuple[Chunk, ...]:
    """Packs tensors in manifest order into chunks of at most ``chunk_bytes`` (the last may be smaller).

    With ``row_shards`` > 1, rank by rank: rank 0's rows of every tensor, then rank 1's, ...; a rank's last
    chunk may be smaller, so that no chunk holds bytes of two ranks. With 1 it is the plain packing."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    chunks: list[Chunk] = []
    for rank in range(row_shards):
        current: list[Segment] = []
        room = chunk_bytes
        for index, spec in enumerate(tensors):
            offset, stop = shard_bytes(spec, rank, row_shards)
            while offset < stop:
                length = min(room, stop - offset)
                current.append(Segment(index, offset, length))
                offset += length
                room -= length
                if room == 0:
                    chunks.append(Chunk(len(chunks), tuple(current)))
                    current, room = [], chunk_bytes
        if current:
            chunks.append(Chunk(len(chunks), tuple(current)))
    return tuple(chunks)


def content_fingerprint(tensors: Mapping[str, torch.Tensor], mode: str = "sample") -> str:
    """A digest of the bytes, used to refuse a second publish of a version with different bytes.

    ``sample`` hashes a few 4 KiB windows of each tensor (cheap even for GPU tensors and large models;
    catches a wrong checkpoint, not a single flipped bit); ``full`` hashes every byte; ``none`` skips.
    """
    if mode == "none":
        return ""
    if mode not in ("sample", "full"):
        raise ValueError(f"fingerprint mode must be 'sample', 'full' or 'none', got {mode!r}")
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in tensors.items():
        raw = _as_bytes(tensor)
        h.update(name.encode())
        if mode == "full" or raw.numel() <= _SAMPLE_WINDOW * _SAMPLE_COUNT:
            h.update(raw.cpu().numpy().tobytes())
            continue
        stride = (raw.numel() - _SAMPLE_WINDOW) // (_SAMPLE_COUNT - 1)
        starts = [i * stride for i in range(_SAMPLE_COUNT)]
        if raw.device.type == "cpu":
            view = raw.numpy()  # zero-copy: slicing numpy views beats a torch gather on a busy host
            for start in starts:
                h.update(view[start:start + _SAMPLE_WINDOW].tobytes())
        else:  # one device-to-host copy of the sampled windows
            h.update(torch.cat([raw[s:s + _SAMPLE_WINDOW] for s in starts]).cpu().numpy().tobytes())
    return h.hexdigest()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def build_manifest(
    model: str,
    version: int,
    layout: str,
    tensors: Mapping[str, torch.Tensor],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    fingerprint_mode: str = "sample",
) -> Manifest:
    specs = tuple(TensorSpec.of(name, t) for name, t in tensors.items())
    return Manifest(model, version, layout, specs, chunk_bytes, content_fingerprint(tensors, fingerprint_mode))


def check_buffers(manifest: Manifest, into: Mapping[str, torch.Tensor]) -> None:
    """Raises ManifestMismatch naming the first tensor that differs, before any byte moves."""
    for spec in manifest.tensors:
        if spec.name not in into:
            raise ManifestMismatch(
                f"buffer for tensor {spec.name!r} is missing (expected shape {list(spec.shape)} {spec.dtype}); "
                f"allocate buffers with client.manifest(...).allocate()", tensor=spec.name)
        buf = into[spec.name]
        check_dtype(manifest, spec, buf)
        if tuple(buf.shape) != spec.shape or dtype_name(buf.dtype) != spec.dtype:
            raise ManifestMismatch(
                f"tensor {spec.name!r}: buffer is {list(buf.shape)} {dtype_name(buf.dtype)}, "
                f"version {manifest.version} ({manifest.layout}) has {list(spec.shape)} {spec.dtype}",
                tensor=spec.name)
        if not buf.is_contiguous():
            raise ManifestMismatch(f"tensor {spec.name!r}: buffer is not contiguous; pass a contiguous tensor",
                                   tensor=spec.name)
    extra = [name for name in into if name not in {s.name for s in manifest.tensors}]
    if extra:
        raise ManifestMismatch(
            f"tensor {extra[0]!r} is not in version {manifest.version} ({manifest.layout}); "
            f"remove it from the buffers or fetch a layout that has it", tensor=extra[0])


def check_dtype(manifest: Manifest, spec: TensorSpec, buf: torch.Tensor,
                shape: tuple[int, ...] | None = None) -> None:
    """Raises DtypeMismatch when ``buf`` has the expected shape (``shape``, default the whole tensor's) but not
    the version's dtype: the publisher and the reader disagree on the dtype only, and the message says who
    sets it. Nothing is read."""
    have = dtype_name(buf.dtype)
    if have == spec.dtype or tuple(buf.shape) != tuple(spec.shape if shape is None else shape):
        return
    raise DtypeMismatch(
        f"tensor {spec.name!r}: the buffer is {have}, version {manifest.version} of {manifest.model!r} "
        f"({manifest.layout}) was published in {spec.dtype}; only the dtype differs, nothing was read. Publish "
        f"versions in the readers' dtype (a verl job: set actor_rollout_ref.rollout.dtype={have}, or "
        f"tensorhub.rollout_dtype={have}, the dtype the rollout engines serve), or read into {spec.dtype} "
        f"buffers (client.manifest(...).allocate())",
        tensor=spec.name, buffer_dtype=have, published_dtype=spec.dtype)


def check_same_tensors(existing: Manifest, incoming: Manifest) -> None:
    """Two publishes of one (model, version, layout) must agree tensor by tensor and byte for byte.

    Their chunk maps may differ (chunk size, row shards): a full holder serves any byte range, and readers
    use the version's first one. Chunk digests are compared where both publishes have one.
    """
    for old, new in zip(existing.tensors, incoming.tensors):
        if old != new:
            raise ManifestMismatch(
                f"tensor {new.name!r} differs from the published version {existing.version} ({existing.layout}): "
                f"published {old.name} {list(old.shape)} {old.dtype}, got {list(new.shape)} {new.dtype}",
                tensor=new.name)
    if len(existing.tensors) != len(incoming.tensors):
        longer = existing.tensors if len(existing.tensors) > len(incoming.tensors) else incoming.tensors
        name = longer[min(len(existing.tensors), len(incoming.tensors))].name
        raise ManifestMismatch(f"tensor {name!r} is in only one of the two publishes of version "
                               f"{existing.version} ({existing.layout})", tensor=name)
    if existing.chunk_digests and incoming.chunk_digests and existing.digest_algorithm != incoming.digest_algorithm:
        raise ManifestMismatch(
            f"version {existing.version} of {existing.model!r} ({existing.layout}) is published with "
            f"{existing.digest_algorithm or 'unnamed'} digests, this publish has {incoming.digest_algorithm or 'unnamed'}"
            f" ones; run every publisher of a model at the same tensorhub_verl version")
    same_map = existing.chunk_bytes == incoming.chunk_bytes and existing.row_shards == incoming.row_shards
    # A row shard knows only its own chunks' digests (the others are ""): compare where both know one.
    first = next((i for i, (a, b) in enumerate(zip(existing.chunk_digests, incoming.chunk_digests))
                  if a and b and a != b), None) if same_map else None
    if first is not None:
        name = existing.tensors[existing.chunks()[first].segments[0].tensor].name
        raise ManifestMismatch(
            f"version {existing.version} of {existing.model!r} ({existing.layout}) is already published with "
            f"different bytes (chunk {first}, tensor {name!r}); versions are immutable: publish these bytes as "
            f"a new version number", tensor=name)
    if existing.fingerprint and incoming.fingerprint and existing.fingerprint != incoming.fingerprint:
        raise ManifestMismatch(
            f"version {existing.version} of {existing.model!r} ({existing.layout}) is already published with "
            f"different bytes; versions are immutable: publish these bytes as a new version number")
