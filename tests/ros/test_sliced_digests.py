"""Sliced reads checked everywhere: of row-shard versions (the FSDP trainer's), and of slices that are not made
of whole blocks (TP=3).

Row shards: each rank publishes its segments' cells of the whole tensors' block digests and the hub puts them
together; the result equals what one publisher of the whole tensors computes, block for block. Unaligned slices:
the plan widens them to whole blocks (``block_edges.py``), so a wrong byte at a block edge is caught. Through real
hubs and holder processes: a TP rank reading the trainer's row-shard version from a rank that serves wrong rows,
and a TP=3 rank reading from a holder with one wrong byte per row at its slice's edge, are caught and read around.
"""

import dataclasses

import pytest
import torch

from tensorhub_verl.errors import InvalidRequest, TransferFailed
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.block_edges import widen
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.wire.integrity import (ChunkChecker, block_digests, chunk_digests, local_views,
                                               shard_chunk_digests)
from tensorhub_verl.ros.hub.limits import HubLimits, prepare_version
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec, row_range, shard_bytes, shard_chunks
from tensorhub_verl.ros.wire.ranges import Runs, TensorSlice, plan_reads
from tensorhub_verl.ros.hub.shard_digests import merge_shard_digests
from tensorhub_verl.ros.wire.convert import manifest_to_msg

from tests.ros.roles import edge_holder, sliced_holder, tp3_weights, tp_shard_holder, tp_weights


def _full(seed: int) -> dict[str, torch.Tensor]:
    """Rows that split unevenly over 3 ranks, odd int8 rows, a vector, and a matrix with rows of 1100 words."""
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(48, 96, generator=g).to(torch.bfloat16),
            "a": torch.randint(-128, 127, (7, 5), generator=g, dtype=torch.int8),
            "v": torch.randn(33, generator=g),
            "w": torch.randn(40, 1100, generator=g).to(torch.bfloat16)}


def _shard_manifest(full, ranks, rank, chunk_bytes=3000, blocks=True) -> Manifest:
    """What rank ``rank``'s ``publish_shard`` sends: its chunks' digests and its segments' block digests."""
    specs = tuple(TensorSpec.of(n, t) for n, t in full.items())
    m = Manifest("m", 1, "hf", specs, chunk_bytes, row_shards=ranks)
    chunks, own = m.chunks(), shard_chunks(m, rank)
    starts = [shard_bytes(s, rank, ranks)[0] for s in specs]
    pieces = [t[slice(*row_range(t.shape[0], rank, ranks))] for t in full.values()]
    return dataclasses.replace(m, digest_algorithm=lindigest.ALGORITHM,
                               chunk_digests=shard_chunk_digests(chunks, specs, pieces, starts, own),
                               block_digests=block_digests(chunks, specs, pieces, starts, own) if blocks else ())


def _merged(full, ranks, **kw) -> Manifest:
    merged = None
    for rank in range(ranks):
        m = _shard_manifest(full, ranks, rank, **kw)
        merged = m if merged is None else merge_shard_digests(merged, m)
    return merged


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_ranks_block_digests_put_together_equal_the_whole_tensors(ranks):
    full = _full(ranks)
    merged = _merged(full, ranks)
    ordered = list(full.values())
    chunks = merged.chunks()
    assert merged.chunk_digests == chunk_digests(chunks, ordered)
    assert merged.block_digests == block_digests(chunks, merged.tensors, ordered)
    # Block by block, the ranks' cells add up to the whole tensor's block, whatever the chunk map.
    plain = Manifest("m", 1, "hf", merged.tensors, 1 << 20)
    whole = block_digests(plain.chunks(), plain.tensors, ordered)

    def per_block(blocks):
        return {(b.tensor, b.dim, j): lindigest.add_hex(b.digests[k + j] for k in range(0, len(b.digests), b.blocks))
                for b in blocks for j in range(b.blocks)}

    assert per_block(merged.block_digests) == per_block(whole)
    assert {(b.tensor, b.dim) for b in merged.block_digests} >= {(0, 0), (0, 1), (3, 0), (3, 1)}


def test_a_group_with_a_rank_that_sent_no_block_digests_keeps_none():
    full = _full(4)
    with_blocks, without = _shard_manifest(full, 2, 0), _shard_manifest(full, 2, 1, blocks=False)
    assert merge_shard_digests(merge_shard_digests(with_blocks, without), without).block_digests == ()
    assert merge_shard_digests(without, with_blocks).block_digests == ()
    assert all(merge_shard_digests(with_blocks, without).chunk_digests)


def test_a_rank_that_sets_another_ranks_block_digests_is_refused():
    full = _full(5)
    mine, theirs = _shard_manifest(full, 2, 0, 4096), _shard_manifest(full, 2, 1, 4096)
    prepare_version(manifest_to_msg(mine), HubLimits(), 0)
    forged = dataclasses.replace(mine, block_digests=tuple(
        dataclasses.replace(a, digests=tuple(x or y for x, y in zip(a.digests, b.digests)))
        for a, b in zip(mine.block_digests, theirs.block_digests)))
    with pytest.raises(InvalidRequest, match="another row shard"):
        prepare_version(manifest_to_msg(forged), HubLimits(), 0)


def _plain_manifest(weights, chunk_bytes):
    specs = tuple(TensorSpec.of(n, t) for n, t in weights.items())
    m = Manifest("m", 1, "hf", specs, chunk_bytes)
    ordered, chunks = list(weights.values()), m.chunks()
    return dataclasses.replace(m, digest_algorithm=lindigest.ALGORITHM, chunk_digests=chunk_digests(chunks, ordered),
                               block_digests=block_digests(chunks, specs, ordered))


@pytest.mark.parametrize("dim", [0, 1])
def test_a_tp3_slice_is_widened_to_whole_blocks_and_a_wrong_byte_at_a_block_edge_fails(dim):
    g = torch.Generator().manual_seed(6)
    weights = {"x": torch.randn(96, 384, generator=g).to(torch.bfloat16), "y": torch.randn(40, generator=g)}
    m = _plain_manifest(weights, 5000)  # chunk bounds inside rows: dim-0 slices start and end in chunks read in part
    size = weights["x"].shape[dim]
    sl = TensorSlice(dim, size // 3, size // 3)  # rank 1 of 3: 16 blocks of size / 16, so both ends mid-block
    plan = plan_reads(m, {0: Runs.of_slice(m.tensors[0], sl)})
    partial = [c for c in plan.pieces if c not in plan.whole]
    assert partial and not any(ChunkChecker(m, plan, {0: sl}).checks(c) for c in partial)  # not widened: unchecked
    plan = widen(m, plan, {0: sl})
    checker = ChunkChecker(m, plan, {0: sl})
    assert all(checker.checks(c) for c in partial) and plan.edge_bytes
    bs = size // 16
    edge_bytes = (sl.start - sl.start // bs * bs + -(-(sl.start + sl.length) // bs) * bs - sl.start - sl.length) * \
        (weights["x"].numel() // size) * 2
    # The partial blocks' bytes outside the slice, where they lie in chunks read in part (columns: every chunk).
    assert plan.edge_bytes == edge_bytes if dim == 1 else 0 < plan.edge_bytes <= edge_bytes
    full = weights["x"]
    scratch = torch.empty(plan.edge_bytes, dtype=torch.uint8)
    for c, edges in plan.edges.items():  # what a holder serves into the scratch buffer
        flat = full.reshape(-1).view(torch.uint8)
        for p in edges:
            scratch[p.local:p.local + p.length] = flat[p.offset:p.offset + p.length]
    right = full.narrow(dim, sl.start, sl.length).contiguous()
    wrong = right.clone()
    wrong.narrow(dim, 0, 1).view(torch.uint8)[..., 0] += 1  # one byte of the slice's first row or column
    local = [right, torch.empty(0, dtype=torch.uint8)]
    bad_local = [wrong, local[1]]
    bad_scratch = scratch.clone()
    bad_scratch[-1] += 1  # one byte outside the slice, in the partial block at its end
    caught = set()
    for c in partial:
        edges = plan.edges.get(c, ())
        assert checker.landed(plan.pieces[c], local_views(local), edges, scratch) == checker.expected(c)
        if checker.landed(plan.pieces[c], local_views(bad_local), edges, scratch) != checker.expected(c):
            caught.add("slice")
        if edges and checker.landed(plan.pieces[c], local_views(local), edges, bad_scratch) != checker.expected(c):
            caught.add("edge")
    assert caught == {"slice", "edge"}


def test_aligned_slices_read_no_edges():
    weights = {"x": torch.randn(64, 256)}
    m = _plain_manifest(weights, 4096)
    for dim in (0, 1):
        sl = TensorSlice(dim, weights["x"].shape[dim] // 4, weights["x"].shape[dim] // 4)
        plan = widen(m, plan_reads(m, {0: Runs.of_slice(m.tensors[0], sl)}), {0: sl})
        assert plan.edge_bytes == 0 and all(ChunkChecker(m, plan, {0: sl}).checks(c) for c in plan.pieces)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_tp_rank_reading_the_trainers_row_shards_from_a_rank_that_serves_wrong_rows_reads_them_elsewhere(hub,
                                                                                                          roles):
    chunk = 16 << 10
    config = ClientConfig.from_fields(window=4, transport="tcp")
    roles(tp_shard_holder, hub.url, "rank-0", 0, 2, chunk, False, "tcp").result(120)
    roles(tp_shard_holder, hub.url, "rank-1", 1, 2, chunk, True, "tcp").result(120)
    want = tp_weights()
    slices = {"o": (1, 256, 256)}  # the second TP rank's columns of every row: both FSDP ranks' chunks, in part
    with Client(hub.url, "tp1", config=config) as rank:
        assert rank.manifest("policy", 1).block_digests, "the hub put the ranks' block digests together"
        into = {"o": torch.empty(256, 256)}
        with pytest.raises(TransferFailed, match="no holder can serve"):  # rank-1's rows fail their blocks
            rank.fetch_slices("policy", 1, into=into, slices=slices, timeout=60)
        roles(sliced_holder, hub.url, "honest", chunk, False, "tcp").result(120)
        stats = rank.fetch_slices("policy", 1, into=into, slices=slices, timeout=60)
    assert torch.equal(into["o"], want["o"][:, 256:])
    assert "rank-1" not in stats.sources and "honest" in stats.sources


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_tp3_rank_reading_from_a_holder_with_a_wrong_byte_at_its_slice_edge_reads_it_elsewhere(hub, roles):
    chunk = 16 << 10
    config = ClientConfig.from_fields(window=4, transport="tcp")
    roles(edge_holder, hub.url, "liar", chunk, True, "tcp").result(120)
    want = tp3_weights()["o3"][:, 128:256]
    with Client(hub.url, "tp1", config=config) as rank:
        into = {"o3": torch.empty(96, 128)}
        with pytest.raises(TransferFailed, match="no holder can serve"):
            rank.fetch_slices("policy", 1, into=into, slices={"o3": (1, 128, 128)}, timeout=60)
        roles(edge_holder, hub.url, "honest", chunk, False, "tcp").result(120)
        stats = rank.fetch_slices("policy", 1, into=into, slices={"o3": (1, 128, 128)}, timeout=60)
    assert torch.equal(into["o3"], want)
    assert set(stats.sources) == {"honest"}
