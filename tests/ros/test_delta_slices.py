"""Deltas into slices, through a real hub and real data planes: two readers that each hold one tensor-parallel
rank's slices of version N-1 (rows of one matrix, columns of another, a norm and a counter whole) read N as the
delta and apply only their part, checked against N's block digests; a corrupt delta, a rotted slice and slices
that cover digest blocks in part each cost a full read of the chunks they concern, never a wrong byte."""

from __future__ import annotations

import torch

import tensorhub_verl as th
from tensorhub_verl.ros.client.delta_chunks import encode_delta
from tensorhub_verl.ros.client.delta_slice_apply import piece_runs
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER, delta_layout
from tensorhub_verl.ros.wire.manifest import Chunk, Segment
from tensorhub_verl.ros.wire.ranges import Piece

from tests.ros.delta_roles import CHUNK, versions

TP = 2
ROWS, COLS = "layers.0.mlp.weight", "embed.weight"
WHOLE = ("layers.0.norm.weight", "step")


def rank_slices(rank: int, tp: int = TP) -> dict[str, tuple[int, int, int]]:
    """Rank ``rank``'s slices: rows of the MLP matrix (a column-parallel weight), columns of the embedding (a
    row-parallel one)."""
    return {ROWS: (0, rank * 1024 // tp, 1024 // tp), COLS: (1, rank * 1024 // tp, 1024 // tp)}


def sliced(weights: dict[str, torch.Tensor], slices: dict[str, tuple[int, int, int]]) -> dict[str, torch.Tensor]:
    out = {n: weights[n].narrow(*slices[n]).contiguous() for n in slices}
    out.update({n: weights[n].clone() for n in WHOLE})
    return out


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_piece_runs_merge_a_column_slice_into_one_strided_run():
    chunk = Chunk(0, (Segment(0, 256, 4096),))  # rows 1..16 of a tensor with 256-byte rows
    pieces = [Piece(0, 256 + r * 256 + 64, 32, r * 32) for r in range(16)]
    assert piece_runs(chunk, pieces) == [(0, 16, 32, 64, 0, 256)]
    # pieces that do not follow each other in the local buffer stay apart
    assert piece_runs(chunk, pieces[:1] + pieces[2:3]) == [(0, 1, 32, 64, 0, 32), (0, 1, 32, 576, 64, 32)]


def test_each_rank_applies_only_its_part_of_the_delta_and_holds_its_slices_of_the_version(hub):
    v1, v2 = versions(2)
    v2[COLS][:, 500:520] += 1.0  # columns on both ranks' sides of the split
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "rank0") as r0, th.connect(hub.url, "rank1") as r1:
        trainer.publish("policy", 1, v1)
        ranks = [(r0, rank_slices(0)), (r1, rank_slices(1))]
        held = []
        for client, slices in ranks:
            into = {n: torch.empty_like(t) for n, t in sliced(v1, slices).items()}
            client.fetch_slices("policy", 1, into=into, slices=slices)
            assert equal(into, sliced(v1, slices))
            held.append(into)
        trainer.publish("policy", 2, v2)
        published = trainer.publish_delta("policy", 2, 1)
        assert published.published
        for (client, slices), into in zip(ranks, held):
            stats = client.fetch_slices("policy", 2, into=into, slices=slices, have=1)
            assert equal(into, sliced(v2, slices))
            d = stats.delta
            assert d.used and d.fallback_chunks == 0 and not d.reasons, d
            assert stats.bytes == d.delta_bytes == published.bytes  # the delta form only
        # Both ranks hold the delta form (whole) and serve it onward; neither holds 'hf' v2 (parts only).
        assert set(trainer.versions("policy", delta_layout("hf", 1))[2]) == {"trainer", "rank0", "rank1"}
        assert trainer.versions("policy", "hf")[2] == ["trainer"]


def test_a_corrupt_delta_and_a_rotted_slice_are_re_read_in_full(hub):
    v1, v2, v3 = versions(3)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "rank1") as r1:
        trainer.publish("policy", 1, v1)
        slices = rank_slices(1)
        into = {n: torch.empty_like(t) for n, t in sliced(v1, slices).items()}
        r1.fetch_slices("policy", 1, into=into, slices=slices)
        trainer.publish("policy", 2, v2)  # the hub retains two versions: v3 comes once v1 is no base any more
        m1, m2 = trainer.manifest("policy", 1), trainer.manifest("policy", 2)
        order = [s.name for s in m2.tensors]
        wrong = {n: t.clone() for n, t in v2.items()}
        wrong[COLS][9, 700] += 1.0  # in rank 1's columns: a payload that decodes, but not to v2's bytes
        header, blob, _ = encode_delta(m1, [v1[n] for n in order], m2, [wrong[n] for n in order])
        # its own chunk digests hold: only the check against v2's block digests of the slice catches it
        trainer.publish("policy", 2, {HEADER: torch.frombuffer(bytearray(header.to_bytes()), dtype=torch.uint8),
                                      BLOB: blob}, layout=delta_layout("hf", 1))
        stats = r1.fetch_slices("policy", 2, into=into, slices=slices, have=1)
        assert equal(into, sliced(v2, slices))
        d = stats.delta
        assert d.used and d.fallback_chunks == 1 and stats.bytes < m2.nbytes / 8, d
        assert any("does not give version 2" in r for r in d.reasons), d.reasons
        assert "rank1" not in trainer.versions("policy", delta_layout("hf", 1)).get(2, [])  # not served onward

        trainer.publish("policy", 3, v3)
        trainer.publish_delta("policy", 3, 2)
        into[COLS][7, 3] += 1.0  # one element of its slice rots
        stats = r1.fetch_slices("policy", 3, into=into, slices=slices, have=2)
        assert equal(into, sliced(v3, slices))
        d = stats.delta
        assert d.used and d.fallback_chunks >= 1 and any("base" in r for r in d.reasons), d


def test_chunks_whose_slices_cover_digest_blocks_in_part_are_read_in_full(hub):
    v1, v2 = versions(2)
    slices = {ROWS: (0, 341, 341), COLS: (1, 341, 341)}  # rank 1 of 3: not made of whole blocks
    into = {n: torch.empty_like(t) for n, t in sliced(v1, slices).items()}
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "rank1") as r1:
        for version, weights in ((1, v1), (2, v2)):
            trainer.publish("policy", version, weights)
        trainer.publish_delta("policy", 2, 1)
        r1.fetch_slices("policy", 1, into=into, slices=slices)
        stats = r1.fetch_slices("policy", 2, into=into, slices=slices, have=1)
        assert equal(into, sliced(v2, slices))
        d = stats.delta
        # Chunks of the sliced matrices are read in full with the edges that complete their blocks; the delta
        # applies to the chunk of the tensors read whole.
        assert d.used and d.fallback_chunks == 0 and d.full_chunks >= 1 and d.full_bytes > 0, d
        assert stats.bytes == d.delta_bytes + d.full_bytes
        assert any("in part" in r for r in d.reasons), d.reasons
