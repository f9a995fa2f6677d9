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
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.manifest import Chunk, Manifest, TensorSpec, dtype_from_name


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

    def __post_init__(self) -> None:
        for name in ("max_tensors", "max_tensor_bytes", "max_version_bytes", "max_chunks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"HubLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tensors > msg.MAX_TENSORS or self.max_chunks > msg.MAX_CHUNKS:
            raise ConfigError(f"HubLimits may not exceed the wire caps ({msg.MAX_TENSORS} tensors, "
                              f"{msg.MAX_CHUNKS} chunks)")


@dataclass(frozen=True, slots=True)
class PreparedVersion:
    manifest: Manifest
    chunks: tuple[Chunk, ...]


def prepare_version(m: msg.ManifestMsg, limits: HubLimits) -> PreparedVersion:
    """Checks a published manifest against ``limits`` and builds its chunk map. No hub state is touched."""
    if len(m.tensors) > limits.max_tensors:
        raise InvalidRequest(f"{len(m.tensors)} tensors in one version exceed the hub's limit of "
                             f"{limits.max_tensors} (HubLimits.max_tensors)")
    specs = tuple(TensorSpec(t.name, tuple(t.shape), t.dtype, t.nbytes) for t in m.tensors)
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
    chunks = -(-total // m.chunk_bytes)
    if chunks > limits.max_chunks:
        raise InvalidRequest(f"{total} bytes in chunks of {m.chunk_bytes} make {chunks} chunks, over the hub's "
                             f"limit of {limits.max_chunks}; publish with a larger chunk_bytes")
    if len({s.name for s in specs}) != len(specs):
        raise InvalidRequest("tensor names in a manifest must be unique")
    if m.chunk_digests and len(m.chunk_digests) != chunks:
        raise InvalidRequest(f"{len(m.chunk_digests)} chunk digests for {chunks} chunks; send one per chunk or none")
    manifest = Manifest(m.model, m.version, m.layout, specs, m.chunk_bytes, m.fingerprint, tuple(m.chunk_digests))
    return PreparedVersion(manifest, manifest.chunks())


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
