"""``apply_delta_slices`` without processes: a TP rank's rows and columns of two versions' chunks, the delta
applied to them on the device that holds them (CPU, and a GPU where there is one), checked against the
version's block digests; a rotted slice is restored to what it held and reported."""

import pytest
import torch

from tensorhub_verl.ros.client.delta_chunks import encode_delta
from tensorhub_verl.ros.client.delta_slice_apply import apply_delta_slices
from tensorhub_verl.ros.wire import delta_codec as dc
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.block_edges import widen
from tensorhub_verl.ros.wire.integrity import ChunkChecker, block_digests, chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest
from tensorhub_verl.ros.wire.ranges import Runs, TensorSlice, plan_reads

SLICES = {"layers.0.mlp.weight": TensorSlice(0, 512, 512), "embed.weight": TensorSlice(1, 512, 512)}
"""Rank 1 of 2: rows of one matrix, columns of the other; the rest whole."""
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the apply runs where the slices are")])]


def _versions(matrices: torch.dtype = torch.bfloat16) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two versions: bf16 matrices over many chunks (held as ``matrices``: float32 for the bf16 values a bf16
    trainer publishes to float32 rollouts), tiny tensors of other dtypes sharing one; a few rows move."""
    g = torch.Generator().manual_seed(0)
    v1 = {"embed.weight": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
          "layers.0.mlp.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),
          "layers.0.norm.weight": torch.randn(1024, generator=g), "step": torch.tensor([1], dtype=torch.int64)}
    v2 = {n: t.clone() for n, t in v1.items()}
    v2["layers.0.mlp.weight"][500:530] += 0.01 * torch.randn(30, 1024, generator=g).to(torch.bfloat16)
    v2["layers.0.norm.weight"][:4] += 1.0
    v2["step"] += 1
    v2["embed.weight"][:, 600:610] += 1.0  # in the rank's columns (SLICES)
    for v in (v1, v2):
        for n in ("embed.weight", "layers.0.mlp.weight"):
            v[n] = v[n].to(matrices)
    return v1, v2


def _manifest(version: int, weights):
    m = build_manifest("policy", version, "hf", weights, 64 << 10, "none")
    ordered = [weights[s.name] for s in m.tensors]
    chunks = m.chunks()
    return m.__class__(m.model, m.version, m.layout, m.tensors, m.chunk_bytes, "", chunk_digests(chunks, ordered),
                       1, lindigest.ALGORITHM, block_digests(chunks, m.tensors, ordered))


def _rank(weights, m, device):
    """The rank's buffers (manifest order; its slices, the rest whole), the plan and each tensor's slice."""
    by_index = {i: SLICES.get(s.name) for i, s in enumerate(m.tensors)}
    runs = {i: Runs.whole(s) if by_index[i] is None else Runs.of_slice(s, by_index[i]) for i, s in enumerate(m.tensors)}
    bufs = [(weights[s.name] if sl is None else weights[s.name].narrow(sl.dim, sl.start, sl.length))
            .contiguous().clone().to(device) for s, sl in zip(m.tensors, by_index.values())]
    return bufs, widen(m, plan_reads(m, runs), by_index), by_index


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("matrices", [torch.bfloat16, torch.float32])
def test_the_rank_applies_its_part_and_a_rotted_slice_is_restored_and_reported(device, matrices):
    v1, v2 = _versions(matrices)
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    order = [s.name for s in m2.tensors]
    header, blob, stats = encode_delta(m1, [v1[n] for n in order], m2, [v2[n] for n in order])
    if matrices == torch.float32:  # bf16 values in float32 words: their chunks' deltas carry the bf16 halves
        assert stats.encodings.get(dc.ULP_BF16, 0) >= 2, stats.encodings
    bufs, plan, by_index = _rank(v1, m1, device)
    want, _, _ = _rank(v2, m2, device)
    checker, base_checker = ChunkChecker(m2, plan, by_index), ChunkChecker(m1, plan, by_index)
    assert not plan.edges and all(checker.checks(c) for c in plan.pieces)

    rotted = [b.clone() for b in bufs]
    rotted[order.index("embed.weight")][4, 100] += 1.0  # a column of the rank's, in a chunk the step changes
    before = [b.clone() for b in rotted]
    rot = apply_delta_slices(m2, header, blob.to(device), plan, rotted, checker, base_checker)
    assert len(rot.bad_base) == 1 and not rot.bad_target and "base version 1" in rot.reasons[-1]
    bad = m2.chunks()[rot.bad_base[0]]
    assert any(m2.tensors[s.tensor].name == "embed.weight" for s in bad.segments)

    result = apply_delta_slices(m2, header, blob.to(device), plan, bufs, checker, base_checker)
    assert not result.failed and sorted(result.applied) == sorted(plan.pieces)
    assert all(torch.equal(a, b) for a, b in zip(bufs, want))
    # the rotted rank: every chunk but the bad one holds v2's bytes; the bad one what it held
    for chunk, pieces in plan.pieces.items():
        holds = before if chunk in rot.bad_base else want
        for p in pieces:
            got = rotted[p.tensor].reshape(-1).view(torch.uint8)[p.local:p.local + p.length]
            assert torch.equal(got, holds[p.tensor].reshape(-1).view(torch.uint8)[p.local:p.local + p.length])
