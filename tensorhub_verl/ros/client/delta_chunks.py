"""Making and applying a delta over a layout's chunk map, with torch ops on the device that holds the bytes.

``encode_delta`` diffs two versions of one layout chunk by chunk (``delta_codec.encode_chunk``) and packs the
payloads into one blob beside a ``DeltaHeader``. ``apply_delta`` applies them in place into buffers that hold the
base, checking each chunk's bytes against the declared base digest before writing (``delta_base``) and the
written chunk against the target digest after, incrementally (``delta_digest``: from the base digest and the
changed words alone), restoring the bytes of a chunk that fails; it returns the chunks that failed a check,
which the caller re-reads in full.

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
from tensorhub_verl.ros.client.delta_base import BaseDigests, chunk_digest, disjoint, flat_bytes
from tensorhub_verl.ros.wire import delta_codec
from tensorhub_verl.ros.wire.delta_codec import ChunkChanges, decode_chunk, write_changes
from tensorhub_verl.ros.wire.delta_codec import encode_chunk as codec_encode
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.delta_digest import chunk_grid, target_digest_from_base
from tensorhub_verl.ros.wire.delta_form import SAME, DeltaHeader
from tensorhub_verl.ros.wire.integrity import shard_chunk_digests
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest, dtype_from_name

logger = logging.getLogger("tensorhub_verl.ros.delta")


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
    flats_b, flats_t = [flat_bytes(t) for t in base_tensors], [flat_bytes(t) for t in target_tensors]
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
        return flat_bytes(payload.contiguous()).to(device)
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
    landed_digests: int = 0
    """Full chunk digests made after a chunk's payload landed (its base was not digested ahead, or it failed a
    check): the digest passes on the apply's critical path."""

    @property
    def failed(self) -> list[int]:
        return sorted({*self.bad_base, *self.bad_target})


def chunk_digests_of(manifest: Manifest, tensors: Sequence[torch.Tensor], which: set[int]) -> tuple[str, ...]:
    """The digests of chunks ``which`` of whole-tensor buffers (manifest order), computed where they lie; ""
    for the others."""
    if not which:
        return ("",) * len(manifest.chunks())
    return shard_chunk_digests(manifest.chunks(), manifest.tensors, [flat_bytes(t) for t in tensors],
                               [0] * len(manifest.tensors), which)


class ChunkApply:
    """Applies a checked header's payloads (``delta_form.check_header``) chunk by chunk, in place, into
    ``tensors`` (manifest order), which should hold the base version: each chunk is applied as soon as its
    payload is there (``apply``), so a reader applies the first chunks while the later ones are on the wire.
    Each chunk's bytes are read in full once: ahead, by ``base``'s worker (``delta_base.BaseDigests``, started
    as the delta's read began), or, for a chunk the worker has not reached, after it is written. Per chunk:

    1. with a base digest made ahead: without the declared base digest the chunk is ``bad_base`` and not a
       byte is written (an unchanged ``SAME`` chunk: with the target digest, which a checked header makes the
       same, it is applied);
    2. its payload is decoded without writing (``delta_codec.decode_chunk``: a malformed one is refused,
       ``bad_target``, nothing written), and the changes are written;
    3. with a base digest made ahead, the target digest is checked incrementally: the base digest plus
       ``delta_digest`` of the change from the base's words to the words read back at the changed places must
       be the target digest; without it the words written are put back (the decoded changes name every word
       written and the base's word there) and the chunk is ``bad_target``;
    4. without a base digest made ahead, the written chunk is digested in full: with the target digest it is
       applied; without it its words are put back and it is digested again to say why: with the declared base
       digest the payload is wrong (``bad_target``), without it the reader's bytes were not the base, or a
       write went astray (``bad_base``).

    The incremental check is exactly as strong as digesting the written chunk in full: the digest is linear,
    the chunk's bytes are the base's (verified in step 1, and nothing writes the buffers in between) except at
    the changed words, and those are read back after the write, so base digest + change is the digest of the
    chunk's bytes as they are. That needs buffers that share no memory (so that writing one chunk cannot
    change another's bytes) and a write confined to the changed words (``write_changes`` writes by their
    positions alone). Buffers that alias (``delta_base.disjoint``: a mapping that put two tensors on the same
    bytes) are checked as in step 4 whatever the worker did.

    So a chunk that fails a check holds the bytes it held before. ``undo`` puts back every chunk applied so far
    (a delta abandoned part way, before its version is served); ``finish`` returns the ``ApplyResult``."""

    def __init__(self, target: Manifest, header: DeltaHeader, tensors: Sequence[torch.Tensor],
                 base: BaseDigests | None = None):
        self._target, self._header = target, header
        self.header = header
        self._first = header.first_chunk
        self.chunks = target.chunks()[self._first:self._first + len(header.encodings)]
        """The header's chunks of the version's chunk map."""
        self._flats = [flat_bytes(t) for t in tensors]
        self._base = base if base is not None else BaseDigests(
            target, tensors, range(self._first, self._first + len(self.chunks)), 60.0)
        """The base chunks' digests made ahead (by a worker started as the delta's read began; without one, none:
        every chunk is checked in full after its write)."""
        self._incremental = disjoint(self._flats)
        """Whether a written chunk whose base was digested ahead is checked from its base digest and changed
        words (else digested in full)."""
        self._rows = [lindigest.row_bytes(tuple(s.shape), s.nbytes) for s in target.tensors]
        self._written: dict[int, tuple[Chunk, ChunkChanges]] = {}
        self._done: set[int] = set()
        self.result = ApplyResult()

    def apply(self, blob: torch.Tensor, which: Sequence[int]) -> None:
        """Applies chunks ``which`` (indices of the version's chunk map, each at most once) from ``blob``, whose
        bytes for those chunks' payloads have landed."""
        started = time.monotonic()
        for i in which:
            if i not in self._done:
                self._done.add(i)
                self._one(blob, self.chunks[i - self._first])
        self.result.seconds += time.monotonic() - started

    def undo(self) -> None:
        """Puts back the base's words in every chunk written so far."""
        for chunk, changes in self._written.values():
            _restore(self._flats, chunk, changes)
        self._written.clear()

    def finish(self) -> ApplyResult:
        return _sorted_and_said(self.result, self._header)

    def _one(self, blob: torch.Tensor, chunk: Chunk) -> None:
        header, result = self._header, self.result
        i, k = chunk.index, chunk.index - self._first
        base = self._base.claim(i)
        if header.encodings[k] == SAME:
            digest = base if base is not None else self._full_digest(chunk)
            (result.applied if digest == header.target_digests[k] else result.bad_base).append(i)
            return
        if base is not None and base != header.base_digests[k]:
            result.bad_base.append(i)  # nothing written
            return
        data, is_view = _chunk_view(self._flats, chunk)
        changes = decode_payload(self._target, header, chunk, blob, data, result)
        if changes is None:
            return
        write_changes(changes, data)
        if not is_view:
            _scatter(self._flats, chunk, data)
        incremental = base is not None and self._incremental
        written = self._target_digest(chunk, changes, data, k) if incremental else self._full_digest(chunk)
        if written == header.target_digests[k]:
            result.applied.append(i)
            self._written[i] = (chunk, changes)
            return
        _restore(self._flats, chunk, changes)
        if not incremental and self._full_digest(chunk) != header.base_digests[k]:
            result.bad_base.append(i)  # not the base, or a write astray
            return
        result.bad_target.append(i)
        result.reasons.append(f"chunk {i}: its {header.encodings[k]} payload does not give version "
                              f"{header.target_version}'s bytes; restored")

    def _full_digest(self, chunk: Chunk) -> str:
        self.result.landed_digests += 1
        return chunk_digest(self._flats, self._rows, chunk)

    def _target_digest(self, chunk: Chunk, changes: ChunkChanges, data: torch.Tensor, k: int) -> str:
        """The digest of the chunk as written: the verified base digest plus the change from the base's words to
        the words read back from ``data`` at the changed places."""
        written = dataclasses.replace(changes, new=read_back(changes, data),
                                      new_tail=data[changes.tail_offset:].cpu().numpy().tobytes()
                                      if changes.new_tail else changes.new_tail)
        return target_digest_from_base(self._header.base_digests[k], chunk_grid(chunk, self._target.tensors),
                                       written)


def read_back(changes: ChunkChanges, data: torch.Tensor) -> torch.Tensor:
    """The words of ``data`` (a chunk's bytes) at ``changes``' positions, as ``changes.new`` holds them."""
    w = changes.word_bytes
    if data.device.type == "cpu" and delta_codec.HOST_NUMPY:  # numpy on this thread, as the codec does
        words = data[:changes.tail_offset].numpy().view(changes.new.numpy().dtype)
        return torch.from_numpy(words[changes.positions.numpy()])
    offs = (changes.positions[:, None] * w + torch.arange(w, device=data.device)[None]).reshape(-1)
    return data[offs].view(changes.new.dtype)


def apply_delta(target: Manifest, header: DeltaHeader, blob: torch.Tensor, tensors: Sequence[torch.Tensor]
                ) -> ApplyResult:
    """Applies every chunk of a checked header whose blob has landed in full (``ChunkApply``)."""
    applier = ChunkApply(target, header, tensors)
    applier.apply(blob, [c.index for c in applier.chunks])
    return applier.finish()


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
    result.seconds = time.monotonic() - started
    return _sorted_and_said(result, header)


def _sorted_and_said(result: ApplyResult, header: DeltaHeader) -> ApplyResult:
    """Sorts ``result``'s chunks and says why the bad bases failed."""
    for part in (result.applied, result.bad_base, result.bad_target):
        part.sort()
    if result.bad_base:
        result.reasons.append(f"{len(result.bad_base)} chunk(s) did not hold base version {header.base_version} "
                              f"(first: chunk {result.bad_base[0]})")
    return result


def _restore(flats: Sequence[torch.Tensor], chunk: Chunk, changes: ChunkChanges) -> None:
    """Writes back the base's words that ``changes`` overwrote."""
    data, is_view = _chunk_view(flats, chunk)
    write_changes(reverted(changes), data)
    if not is_view:
        _scatter(flats, chunk, data)


__all__ = ["ApplyResult", "ChunkApply", "EncodeStats", "apply_delta", "chunk_digests_of", "chunk_dtype",
           "decode_payload", "encode_delta", "finish", "reverted"]
