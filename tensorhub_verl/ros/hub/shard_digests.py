"""A row-shard version's digests, collected on the hub from its ranks' publishes.

Each rank of a row-shard group (``manifest.row_range``) sends the digests of its own chunks and the block
digests of its own tensor segments, "" for the other ranks'. The chunk map never lets a chunk or a segment span
two ranks, so the whole version's digests are the ranks' cells put together: the sum of the ranks' linear
contributions (``lindigest``), where every cell has exactly one contributor. Once every rank is in, the version
checks whole-chunk reads and sliced reads (a TP rank's rows or columns of the trainer's version) like any other.
Pure functions of manifests: no I/O.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from tensorhub_verl.ros.wire.manifest import Manifest, TensorBlocks

logger = logging.getLogger("tensorhub_verl.ros.hub.shard_digests")


def merge_shard_digests(existing: Manifest, incoming: Manifest) -> Manifest:
    """``existing`` with the gaps in its digests filled from ``incoming`` (the same chunk map): chunk digests
    always; block digests while a row-shard group is still filling. A complete group whose block digests leave
    some segment without any (a rank that published none) keeps none: its sliced reads stay unchecked rather
    than failing against a partial sum."""
    if not incoming.chunk_digests:
        return existing
    old = existing.chunk_digests or ("",) * len(incoming.chunk_digests)
    chunks = tuple(a or b for a, b in zip(old, incoming.chunk_digests))
    blocks = existing.block_digests
    filling = existing.row_shards > 1 and not (existing.chunk_digests and all(existing.chunk_digests))
    if filling:
        blocks = _merge_blocks(existing.block_digests, incoming.block_digests)
        if all(chunks) and blocks and not _every_segment_has_blocks(blocks):
            logger.warning("%s v%d (%s): some row shard published no block digests; sliced reads of this version "
                           "are not checked", existing.model, existing.version, existing.layout)
            blocks = ()
    if chunks == existing.chunk_digests and blocks == existing.block_digests:
        return existing
    return replace(existing, chunk_digests=chunks, block_digests=blocks,
                   digest_algorithm=existing.digest_algorithm or incoming.digest_algorithm)


def _merge_blocks(old: tuple[TensorBlocks, ...], new: tuple[TensorBlocks, ...]) -> tuple[TensorBlocks, ...]:
    """Cell by cell, the one set (ranks fill disjoint cells). Block layouts are a function of the tensor specs,
    so ranks agree on them; ``old`` is kept where they do not."""
    if not old or not new:
        return old or new
    if [(b.tensor, b.dim, b.blocks, len(b.digests)) for b in old] != \
            [(b.tensor, b.dim, b.blocks, len(b.digests)) for b in new]:
        return old
    return tuple(replace(a, digests=tuple(x or y for x, y in zip(a.digests, b.digests))) for a, b in zip(old, new))


def _every_segment_has_blocks(blocks: tuple[TensorBlocks, ...]) -> bool:
    """Every segment of every tensor has at least one block digest (a rank that sent none leaves its all "")."""
    return all(any(b.digests[k:k + b.blocks]) for b in blocks for k in range(0, len(b.digests), b.blocks))


__all__ = ["merge_shard_digests"]
