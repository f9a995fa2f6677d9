"""Per-chunk digests: computed by the publisher, carried in the manifest, checked by every reader.

A reader checks each chunk as it lands, before it reports the chunk to the hub, so it never serves or
claims bytes it has not verified. xxh3-64 is not a cryptographic hash: it catches torn, stale and
mixed-up bytes (a holder that changed its tensor after publishing, a read from the wrong address), not a
forger who can pick colliding bytes -- that one would first need a credential to publish at all.

CPU tensors are hashed in place (zero-copy numpy views); CUDA tensors are hashed after a device-to-host
copy of each segment, which costs a PCIe transfer: turn ``ClientConfig.chunk_digests`` off there if that
matters more than the check.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
import xxhash

from tensorhub_verl.ros.manifest import Chunk

ALGORITHM = "xxh3_64"
DIGEST_CHARS = 16


class _DeviceBytes:
    """Byte slices of a CUDA tensor, copied to the host on demand."""

    def __init__(self, flat: torch.Tensor):
        self._flat = flat

    def __getitem__(self, span: slice):
        return self._flat[span].cpu().numpy()


def byte_views(tensors: Iterable[torch.Tensor]) -> list:
    """One sliceable byte view per tensor, in manifest order."""
    views = []
    for t in tensors:
        flat = t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        views.append(flat.numpy() if flat.device.type == "cpu" else _DeviceBytes(flat))
    return views


def new_hasher() -> "xxhash.xxh3_64":
    """A streaming hasher of ALGORITHM: ``update`` bytes in a chunk's order, then ``hexdigest`` equals
    ``chunk_digest`` of the same bytes."""
    return xxhash.xxh3_64()


def chunk_digest(chunk: Chunk, views: Sequence) -> str:
    h = new_hasher()
    for seg in chunk.segments:
        h.update(views[seg.tensor][seg.offset:seg.offset + seg.length])
    return h.hexdigest()


def chunk_digests(chunks: Iterable[Chunk], tensors: Iterable[torch.Tensor]) -> tuple[str, ...]:
    views = byte_views(tensors)
    return tuple(chunk_digest(c, views) for c in chunks)


def tensor_digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """xxh3-64 of each tensor's dtype, shape and bytes: proves end to end that a reader holds, tensor by tensor,
    what a publisher published (``verify_digests`` in verl jobs). Non-contiguous views are read through a copy."""
    out = {}
    for name, t in tensors.items():
        h = xxhash.xxh3_64(f"{t.dtype}|{tuple(t.shape)}|".encode())
        (view,) = byte_views([t.detach().contiguous()])
        h.update(view[0:t.numel() * t.element_size()])
        out[name] = h.hexdigest()
    return out


class _Shifted:
    """A byte view of a row shard's piece, indexed by offsets in the whole tensor (the piece starts at ``start``)."""

    def __init__(self, view, start: int):
        self._view, self._start = view, start

    def __getitem__(self, span: slice):
        return self._view[span.start - self._start:span.stop - self._start]


def shard_chunk_digests(chunks: Iterable[Chunk], pieces: Iterable[torch.Tensor], starts: Sequence[int],
                        own: set[int]) -> tuple[str, ...]:
    """A row shard's digests: of the chunks in ``own`` (all within its pieces), "" for the other ranks' chunks.
    Piece ``i`` holds bytes from ``starts[i]`` of tensor ``i``."""
    views = [_Shifted(view, start) for view, start in zip(byte_views(pieces), starts)]
    return tuple(chunk_digest(c, views) if c.index in own else "" for c in chunks)
