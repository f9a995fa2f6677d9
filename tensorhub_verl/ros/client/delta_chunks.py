"""Making and applying a delta over a layout's chunk map, with torch ops on the device that holds the bytes.

``encode_delta`` diffs two versions of one layout chunk by chunk (``delta_codec.encode_chunk``) and packs the
payloads into one blob beside a ``DeltaHeader``. ``apply_delta`` applies them in place into buffers that hold the
base, checking each payload against the declared base and target digests before writing and each written chunk's
digest after, restoring the bytes of a chunk that fails; it returns the chunks that failed a check, which the
caller re-reads in full.

Pure of I/O: the client (``delta.py``) reads the delta form, calls this, and re-reads what failed.
A chunk whose segments span tensors (tiny tensors share a chunk) is applied in a gathered copy and scattered
back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from tensorhub_verl.errors import DeltaCorrupt
from tensorhub_verl.ros.wire.delta_codec import ChunkChanges, decode_chunk, write_changes
from tensorhub_verl.ros.wire.delta_codec import encode_chunk as codec_encode
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.delta_digest import chunk_grid, target_digest_from_base
from tensorhub_verl.ros.wire.delta_form import SAME, DeltaHeader
from tensorhub_verl.ros.wire.integrity import shard_chunk_digests
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest, dtype_from_name

logger = logging.getLogger("tensorhub_verl.ros.delta")


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8,
                                                                                  device=t.device)


def chunk_dtype(manifest: Manifest, chunk: Chunk) -> torch.dtype:
    """The element type the codec diffs a chunk in: its tensors' dtype when they share one and every segment
    holds whole elements; bytes otherwise."""
    dtypes = {manifest.tensors[s.tensor].dtype for s in chunk.segments}
    if len(dtypes) != 1:
        return torch.uint8
    dtype = dtype_from_name(dtypes.pop())
    size = dtype.itemsize
    if any(s.offset % size or s.length % size for s in chunk.segments):
        return torch.uint8
    return dtype


def _chunk_view(flats: Sequence[torch.Tensor], chunk: Chunk,
                starts: Sequence[int] | None = None) -> tuple[torch.Tensor, bool]:
    """The chunk's bytes as one flat uint8 tensor, and whether it is a view of the buffers (one segment) rather
    than a gathered copy. ``starts[t]``: the tensor byte that ``flats[t]`` begins at (a row shard's piece)."""
    def part(s):
        at = s.offset - (starts[s.tensor] if starts else 0)
        return flats[s.tensor][at:at + s.length]

    if len(chunk.segments) == 1:
        return part(chunk.segments[0]), True
    return torch.cat([part(s) for s in chunk.segments]), False


def _scatter(flats: Sequence[torch.Tensor], chunk: Chunk, data: torch.Tensor) -> None:
    at = 0
    for s in chunk.segments:
        flats[s.tensor][s.offset:s.offset + s.length].copy_(data[at:at + s.length])
        at += s.length


@dataclass(slots=True)
class EncodeStats:
    seconds: float = 0.0
    changed_elements: int = 0
    elements: int = 0
    encodings: dict[str, int] = field(default_factory=dict)
    """encoding -> chunks encoded so."""
    payload_bytes: int = 0


def encode_delta(base: Manifest, base_tensors: Sequence[torch.Tensor], target: Manifest,
                 target_tensors: Sequence[torch.Tensor], encode_chunk: Callable = codec_encode,
                 chunks: range | None = None, starts: Sequence[int] | None = None
                 ) -> tuple[DeltaHeader, torch.Tensor, EncodeStats]:
    """The delta from ``base`` to ``target`` (one layout, one chunk map; tensors in manifest order) over
    ``chunks`` (default: all; a row shard: its own, its tensors being its pieces that begin at tensor byte
    ``starts[t]``): its header, its blob (on the target's device; at least one byte, so that it can be
    registered), and what it took."""
    started = time.monotonic()
    stats = EncodeStats()
    flats_b, flats_t = [_flat(t) for t in base_tensors], [_flat(t) for t in target_tensors]
    columns: dict[str, list] = {k: [] for k in ("encodings", "offsets", "lengths", "changed", "elements")}
    payloads: list[torch.Tensor] = []
    end = 0
    device = next((t.device for t in target_tensors), torch.device("cpu"))
    every = target.chunks()
    chunks = range(len(every)) if chunks is None else chunks
    for chunk in every[chunks.start:chunks.stop]:
        dtype = chunk_dtype(target, chunk)
        b, _ = _chunk_view(flats_b, chunk, starts)
        t, _ = _chunk_view(flats_t, chunk, starts)
        if base.chunk_digests[chunk.index] == target.chunk_digests[chunk.index] and torch.equal(b, t):
            encoding, payload, changed, elements = SAME, None, 0, chunk.nbytes // dtype.itemsize
        else:
            enc = encode_chunk(b, t, dtype=dtype)
            encoding, changed, elements = enc.encoding, int(enc.changed), int(enc.elements)
            payload = _as_u8(enc.payload, device)
        length = 0 if payload is None else payload.numel()
        if payload is not None and length:
            payloads.append(payload)
        for k, v in zip(columns, (encoding, end, length, changed, elements)):
            columns[k].append(v)
        end += length
        stats.encodings[encoding] = stats.encodings.get(encoding, 0) + 1
        stats.changed_elements += changed
        stats.elements += elements
    blob = torch.cat(payloads) if payloads else torch.zeros(1, dtype=torch.uint8, device=device)
    header = DeltaHeader(model=target.model, layout=target.layout, base_version=base.version,
                         target_version=target.version, layout_digest=target.digest,
                         digest_algorithm=target.digest_algorithm, first_chunk=chunks.start,
                         base_digests=list(base.chunk_digests[chunks.start:chunks.stop]),
                         target_digests=list(target.chunk_digests[chunks.start:chunks.stop]), **columns)
    stats.payload_bytes = end
    stats.seconds = time.monotonic() - started
    return header, blob, stats


def _as_u8(payload, device: torch.device) -> torch.Tensor:
    """A codec payload (a tensor or bytes) as a flat uint8 tensor on ``device``."""
    if isinstance(payload, torch.Tensor):
        return _flat(payload.contiguous()).to(device)
    data = bytes(payload)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
        torch.empty(0, dtype=torch.uint8, device=device)


@dataclass(slots=True)
class ApplyResult:
    applied: list[int] = field(default_factory=list)
    """Chunks whose payload was applied and whose bytes now match the target digest."""
    bad_base: list[int] = field(default_factory=list)
    """Chunks whose bytes were not the declared base (or took a write astray): they hold the bytes they held
    before, the words the payload wrote being restored."""
    bad_target: list[int] = field(default_factory=list)
    """Chunks whose payload did not apply, or does not give the target digest from bytes that are the declared
    base: they hold the bytes they held before (never written, or restored)."""
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[int]:
        return sorted({*self.bad_base, *self.bad_target})


def chunk_digests_of(manifest: Manifest, tensors: Sequence[torch.Tensor], which: set[int]) -> tuple[str, ...]:
    """The digests of chunks ``which`` of whole-tensor buffers (manifest order), computed where they lie; ""
    for the others."""
    if not which:
        return ("",) * len(manifest.chunks())
    return shard_chunk_digests(manifest.chunks(), manifest.tensors, [_flat(t) for t in tensors],
                               [0] * len(manifest.tensors), which)


DERIVE_MAX_CHANGED = 0.05
"""Above this fraction of a chunk's elements changed, deriving its target digest from the changed words costs
about as much as digesting the chunk: its base is digested before writing instead."""


def _derivable(header: DeltaHeader, k: int) -> bool:
    """Whether chunk ``k`` of the header gets its target digest derived from its declared base digest (linear
    digest, few changed elements) rather than its base digested before writing."""
    return (header.digest_algorithm == lindigest.ALGORITHM and header.encodings[k] != SAME
            and header.changed[k] <= DERIVE_MAX_CHANGED * max(1, header.elements[k]))


def apply_delta(target: Manifest, header: DeltaHeader, blob: torch.Tensor, tensors: Sequence[torch.Tensor]
                ) -> ApplyResult:
    """Applies a checked header's payloads (``delta_form.check_header``) in place into ``tensors`` (manifest
    order), which should hold the base version, reading each chunk's bytes in full once where few of its
    elements change. Per chunk:

    1. its payload is decoded without writing (``delta_codec.decode_chunk``: a malformed one is refused);
    2. the target digest follows from the header's base digest plus the decoded changes (the digest is linear,
       ``delta_digest.target_digest_from_base``): a payload that does not give the header's target digest is
       not written (``bad_target``, unless the chunk's bytes, digested then, are not the declared base:
       ``bad_base``). A chunk with many changes, or a digest that is not linear, has its base digested before
       writing instead (``bad_base`` on a mismatch, nothing written);
    3. it is written, then digested in full with the unchanged (``SAME``) chunks: a chunk without the
       target digest is restored to the bytes it held (the decoded changes name every word written) and is
       ``bad_base`` where the payload was checked against the declared base (the reader's bytes, or a write,
       were wrong), ``bad_target`` where the base itself checked out; an unchanged chunk without it is
       ``bad_base``.

    So a chunk that fails a check holds the bytes it held when this returns."""
    started = time.monotonic()
    result = ApplyResult()
    first = header.first_chunk
    chunks = target.chunks()[first:first + len(header.encodings)]
    flats = [_flat(t) for t in tensors]
    derived = {c.index for c in chunks if _derivable(header, c.index - first)}
    pre = {c.index for c in chunks if header.encodings[c.index - first] != SAME} - derived
    base_now = chunk_digests_of(target, tensors, pre)
    host = blob.device.type == "cpu"
    written: dict[int, tuple[Chunk, ChunkChanges]] = {}
    same: list[int] = []
    for chunk in chunks:
        i, k = chunk.index, chunk.index - first
        if header.encodings[k] == SAME:
            same.append(i)
            continue
        if i in pre and base_now[i] != header.base_digests[k]:
            result.bad_base.append(i)
            continue
        data, is_view = _chunk_view(flats, chunk)
        changes = decode_payload(target, header, chunk, blob, data, result)
        if changes is None:
            continue
        if i in derived and target_digest_from_base(header.base_digests[k], chunk_grid(chunk, target.tensors),
                                                    changes) != header.target_digests[k]:
            # Either the payload is wrong or the words it changes were not the base's: digesting the chunk
            # (still unwritten) tells which.
            if chunk_digests_of(target, tensors, {i})[i] != header.base_digests[k]:
                result.bad_base.append(i)
            else:
                result.bad_target.append(i)
                result.reasons.append(f"chunk {i}: its {header.encodings[k]} payload does not give version "
                                      f"{header.target_version}'s bytes; not written")
            continue
        write_changes(changes, data)
        if not is_view:
            _scatter(flats, chunk, data)
        written[i] = (chunk, changes)
    after = chunk_digests_of(target, tensors, {*written, *same})
    for i in same:
        if after[i] == header.target_digests[i - first]:
            result.applied.append(i)
        else:
            result.bad_base.append(i)
    for i, (chunk, changes) in sorted(written.items()):
        if after[i] == header.target_digests[i - first]:
            result.applied.append(i)
            continue
        _restore(flats, chunk, changes)
        if i in derived:  # the payload gives the target from the declared base: the base was not it
            result.bad_base.append(i)
            continue
        result.bad_target.append(i)
        result.reasons.append(f"chunk {i}: its {header.encodings[i - first]} payload does not give version "
                              f"{header.target_version}'s bytes; restored")
    return finish(result, header, started)


def decode_payload(target: Manifest, header: DeltaHeader, chunk: Chunk, blob: torch.Tensor, data: torch.Tensor,
                   result: ApplyResult) -> ChunkChanges | None:
    """What chunk ``chunk``'s payload changes in ``data`` (its bytes), without writing; None, with the chunk
    counted ``bad_target`` and the reason, when the payload is refused."""
    k = chunk.index - header.first_chunk
    part = blob[header.offsets[k]:header.offsets[k] + header.lengths[k]]
    payload = part.numpy() if blob.device.type == "cpu" else part.cpu().numpy()
    try:
        return decode_chunk(header.encodings[k], payload, data, dtype=chunk_dtype(target, chunk))
    except (DeltaCorrupt, ValueError) as e:
        result.bad_target.append(chunk.index)
        result.reasons.append(f"chunk {chunk.index}: its {header.encodings[k]} payload is refused: {str(e)[:200]}")
        return None


def reverted(changes: ChunkChanges) -> ChunkChanges:
    """The changes that write back the words ``changes`` overwrote."""
    return dataclasses.replace(changes, old=changes.new, new=changes.old, old_tail=changes.new_tail,
                               new_tail=changes.old_tail)


def finish(result: ApplyResult, header: DeltaHeader, started: float) -> ApplyResult:
    """Sorts ``result``'s chunks, says why the bad bases failed, and times it."""
    if result.bad_base:
        result.bad_base.sort()
        result.reasons.append(f"{len(result.bad_base)} chunk(s) did not hold base version {header.base_version} "
                              f"(first: chunk {result.bad_base[0]})")
    result.applied.sort()
    result.bad_target.sort()
    result.seconds = time.monotonic() - started
    return result


def _restore(flats: Sequence[torch.Tensor], chunk: Chunk, changes: ChunkChanges) -> None:
    """Writes back the base's words that ``changes`` overwrote."""
    data, is_view = _chunk_view(flats, chunk)
    write_changes(reverted(changes), data)
    if not is_view:
        _scatter(flats, chunk, data)


__all__ = ["ApplyResult", "EncodeStats", "apply_delta", "chunk_digests_of", "chunk_dtype", "decode_payload",
           "encode_delta", "finish", "reverted"]
