"""Ranged reads (``Client.fetch_slices``, ``ranges.py``): a reader reads only the bytes of its selection.

The planning is checked as a pure function against ``torch.narrow`` on many shapes; the hub's side (a ranged
reader is planned only its chunks, and never serves a chunk it read in part) on ``HubState``; the whole read
through a real hub and real clients on both data planes (NIXL/UCX and TCP streams), bytes compared exactly.
"""

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import InvalidRequest, ManifestMismatch
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.manifest import TensorSpec, build_manifest
from tensorhub_verl.ros.wire.ranges import Runs, TensorSlice, plan_reads

from tests.ros.test_hub_state import exchange, make_state, manifest, publish, register


def _apply(plan, manifest, sources):
    """What a reader's buffers hold after reading ``plan`` from full ``sources`` (bytes copied piece by piece)."""
    out = {}
    for pieces in plan.pieces.values():
        for p in pieces:
            spec = manifest.tensors[p.tensor]
            src = sources[spec.name].reshape(-1).view(torch.uint8)
            dst = out.setdefault(p.tensor, torch.full((plan_bytes(plan, p.tensor),), 255, dtype=torch.uint8))
            dst[p.local:p.local + p.length] = src[p.offset:p.offset + p.length]
    return out


def plan_bytes(plan, tensor):
    return max(p.local + p.length for pieces in plan.pieces.values() for p in pieces if p.tensor == tensor)


@pytest.mark.parametrize("shape,dim,start,length,chunk", [
    ((64, 48), 0, 16, 32, 4096), ((64, 48), 1, 12, 24, 4096), ((64, 48), 1, 0, 48, 4096),
    ((8, 6, 10), 1, 2, 3, 512), ((8, 6, 10), 2, 9, 1, 1000), ((100,), 0, 37, 50, 64), ((64, 48), 1, 5, 7, 333),
])
def test_pieces_are_exactly_the_narrowed_bytes(shape, dim, start, length, chunk):
    g = torch.Generator().manual_seed(sum(shape) + dim + start)
    full = torch.randn(shape, generator=g)
    other = torch.randn(37, generator=g)  # shares chunks with the selected tensor, never read
    tensors = {"other": other, "w": full}
    m = build_manifest("m", 1, "hf", tensors, chunk, "none")
    plan = plan_reads(m, {1: Runs.of_slice(m.tensors[1], TensorSlice(dim, start, length))})
    got = _apply(plan, m, tensors)
    want = full.narrow(dim, start, length).contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(got[1], want) and 0 not in got
    assert plan.nbytes == want.numel()
    contiguous = dim == 0 or all(d == 1 for d in shape[:dim]) or length == shape[dim]
    assert (plan.regions[1][1] == want.numel()) == contiguous
    for c in plan.pieces:  # whole chunks: all of their bytes are selected; served only if held as one range
        chunk_bytes = m.chunks()[c].nbytes
        assert (c in plan.whole) == (sum(p.length for p in plan.pieces[c]) == chunk_bytes)
        assert (c in plan.unserved) == (c not in plan.whole or not contiguous)


def test_a_bad_slice_is_refused_before_any_byte_moves():
    spec = TensorSpec("w", (4, 6), "float32", 96)
    for sl in [TensorSlice(2, 0, 1), TensorSlice(1, 4, 3), TensorSlice(0, -1, 1)]:
        with pytest.raises(ManifestMismatch, match="no slice"):
            Runs.of_slice(spec, sl)


def test_the_hub_plans_only_a_ranged_readers_chunks_and_never_serves_its_partial_ones():
    state, _ = make_state()
    m = manifest(chunks=4)
    for w in ("trainer", "ranged", "late"):
        register(state, w, node=w)
    publish(state, "trainer", m)
    state.begin_fetch(msg.BeginFetch(worker="ranged", holder="ranged", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, need=[1, 2], unserved=[2],
                                     regions=[msg.RegionMsg(addr=2000, offset=4096, nbytes=4096 + 100)]))
    got = exchange(state, "ranged", m)
    assert sorted(a.chunk for a in got.assignments) == [1, 2]
    exchange(state, "ranged", m, completed=[a.lease for a in got.assignments], want=0)
    # the late reader gets chunk 1 from whoever is idlest; chunk 2 (read in part) only ever from the trainer
    state.begin_fetch(msg.BeginFetch(worker="late", holder="late", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=3000)]))
    late = exchange(state, "late", m, want=8)
    assert {a.chunk: a.source for a in late.assignments}[2] == "trainer"
    with pytest.raises(InvalidRequest, match="cannot hold"):
        state.end_fetch(msg.EndFetch(worker="ranged", holder="ranged", model=m.model, version=m.version,
                                     layout=m.layout, ok=True, hold=True))
    with pytest.raises(InvalidRequest, match="byte range inside"):
        state.begin_fetch(msg.BeginFetch(worker="late", holder="late~x", model=m.model, version=m.version,
                                         layout=m.layout, digest=m.digest, need=[0],
                                         regions=[msg.RegionMsg(addr=2000, offset=4096 * 4)]))


@pytest.fixture(params=["nixl", "tcp"])
def two_clients(hub, request):
    """Both data planes: on TCP the reader sends the grant's whole-chunk ranges and the parts it wants."""
    a = th.connect(hub.url, "r-trainer", location="dc=dc0,rack=r0,node=n0", chunk_bytes=4096,
                   transport=request.param)
    b = th.connect(hub.url, "r-reader", location="dc=dc0,rack=r0,node=n1", transport=request.param)
    yield a, b
    b.close()
    a.close()


def test_a_tp_rank_reads_its_slices_and_nothing_else(two_clients):
    trainer, rank = two_clients
    g = torch.Generator().manual_seed(7)
    hf = {"embed": torch.randn(100, 16, generator=g), "q": torch.randn(64, 16, generator=g),
          "o": torch.randn(16, 64, generator=g), "norm": torch.randn(16, generator=g),
          "unused": torch.randn(300, 16, generator=g)}
    trainer.publish("sliced", 1, hf)
    # rank 1 of 2: rows of q, columns of o (strided), the norm whole, its rows of the embedding; no 'unused'
    fused = torch.full((40, 16), -1.0)  # a "fused" parameter: q's rows land in its first 32 rows
    into = {"q": fused[:32], "o": torch.empty(16, 32), "norm": torch.empty(16), "embed": torch.empty(50, 16)}
    slices = {"q": (0, 32, 32), "o": (1, 32, 32), "embed": (0, 50, 50)}
    stats = rank.fetch_slices("sliced", 1, into=into, slices=slices, timeout=60)
    assert torch.equal(fused[:32], hf["q"][32:]) and torch.equal(fused[32:], torch.full((8, 16), -1.0))
    assert torch.equal(into["o"], hf["o"][:, 32:]) and torch.equal(into["norm"], hf["norm"])
    assert torch.equal(into["embed"], hf["embed"][50:])
    selected = sum(t.numel() * 4 for t in into.values())
    assert stats.bytes == selected and stats.sources == {"r-trainer": selected}
    assert selected < sum(t.numel() * 4 for t in hf.values()) / 3
    assert rank.holdings() == []  # a ranged reader holds nothing afterwards
    with pytest.raises(ManifestMismatch, match="selection is"):
        rank.fetch_slices("sliced", 1, into={"o": torch.empty(16, 31)}, slices={"o": (1, 32, 32)}, timeout=60)
