"""Loads a version's HF tensors into an engine through its own loader, a bounded bucket at a time.

The general path for every architecture the engine can load (used whenever no in-place mapping applies):

    manifest ──plan_buckets──► [layer 0..k] [layer k+1..] ...     (whole decoder layers, <= bucket_bytes each)
    for each bucket: fetch_slices(those tensors) ──► load_hf(bucket) ──► free the bucket

Peak extra memory per rank: one bucket (at least one decoder layer) in the manifest's dtype, never the whole
model. A decoder layer is never split across buckets, because vLLM's ``reload_weights`` processes a layer once
all of its weights arrived within one call. Names the engine has no parameter for and its own loader would
skip (``skip``: the head of tied embeddings) are not read at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT, Manifest, dtype_from_name
from tensorhub_verl.vllm.verify import VersionRefused, layer_key

logger = logging.getLogger("tensorhub_verl.vllm.buckets")

LoadHF = Callable[[Iterable[tuple[str, torch.Tensor]]], None]
DEFAULT_BUCKET_BYTES = 512 << 20


def plan_buckets(tensors: Sequence[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """Groups ``(name, nbytes)`` (manifest order) into buckets of whole decoder layers (``verify.layer_key``),
    each at most ``bucket_bytes`` unless one layer alone is larger (then that layer is its own bucket)."""
    if bucket_bytes <= 0:
        raise errors.ConfigError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    groups: dict[str, list[tuple[str, int]]] = {}
    for name, nbytes in tensors:
        groups.setdefault(layer_key(name), []).append((name, nbytes))
    buckets: list[list[str]] = []
    current: list[str] = []
    size = 0
    for members in groups.values():
        group_bytes = sum(n for _, n in members)
        if current and size + group_bytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.extend(name for name, _ in members)
        size += group_bytes
    if current:
        buckets.append(current)
    return buckets


@dataclass(slots=True)
class BucketStats:
    """What one bucketed load moved (the shape of ``FetchStats`` that ``EngineHolder.apply`` reports)."""

    bytes: int = 0
    seconds: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)
    buckets: int = 0
    peak_bucket_bytes: int = 0
    """The largest bucket: the extra memory this load needed on top of the parameters."""


def load_in_buckets(client, model: str, version: int, manifest: Manifest, load_hf: LoadHF, *,
                    bucket_bytes: int, device: torch.device, skip: Iterable[str] = (),
                    timeout: float) -> BucketStats:
    """Reads ``version``'s HF tensors bucket by bucket and hands each bucket to ``load_hf`` (the engine's
    loader). A loader error is a ``VersionRefused`` naming the bucket; a read error propagates as it is."""
    if manifest.layout != HF_LAYOUT:
        raise errors.InvalidRequest(f"bucketed loads read the 'hf' layout, not {manifest.layout!r}")
    skipped = set(skip)
    specs = {s.name: s for s in manifest.tensors if s.name not in skipped}
    sizes = [(s.name, s.nbytes) for s in specs.values()]
    stats = BucketStats()
    started = time.monotonic()
    deadline = started + timeout
    for bucket in plan_buckets(sizes, bucket_bytes):
        into = {n: torch.empty(specs[n].shape, dtype=dtype_from_name(specs[n].dtype), device=device) for n in bucket}
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.TransferFailed(f"v{version}: bucketed load ran past its {timeout} s limit")
        got = client.fetch_slices(model, version, into=into, layout=HF_LAYOUT, timeout=left)
        stats.bytes += int(getattr(got, "bytes", 0))
        for src, n in (getattr(got, "sources", None) or {}).items():
            stats.sources[src] = stats.sources.get(src, 0) + n
        stats.peak_bucket_bytes = max(stats.peak_bucket_bytes, sum(t.numel() * t.element_size()
                                                                   for t in into.values()))
        try:
            with torch.no_grad():
                load_hf(iter(into.items()))
        except Exception as e:  # the engine's loader raises whatever its model code raises
            raise VersionRefused(f"v{version}: the engine's loader rejected a bucket of {len(bucket)} HF tensors "
                                 f"(first {bucket[0]!r}): {e!r}") from e
        stats.buckets += 1
        del into
    stats.seconds = time.monotonic() - started
    return stats


__all__ = ["DEFAULT_BUCKET_BYTES", "BucketStats", "load_in_buckets", "plan_buckets"]
