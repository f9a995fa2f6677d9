"""A run of chunks as one read: its spans merged where both sides continue, split only between chunks."""

from tensorhub_verl.ros.wire.manifest import TensorSpec, split_into_chunks
from tensorhub_verl.ros.wire.ranges import Piece, ReadPlan, Runs, plan_reads
from tensorhub_verl.ros.client.run_reads import SCRATCH, ChunkSpans
from tensorhub_verl.ros.wire.manifest import Manifest

CHUNK = 1 << 12


def _manifest(*sizes: int) -> Manifest:
    return Manifest("m", 1, "hf", tuple(TensorSpec(f"t{i}", (n,), "uint8", n) for i, n in enumerate(sizes)),
                    chunk_bytes=CHUNK)


def test_a_run_over_one_tensor_is_one_copy_whatever_its_length():
    chunks = split_into_chunks(_manifest(64 * CHUNK).tensors, CHUNK)
    parts, ends = ChunkSpans(chunks, None, False).run(3, 50)
    (part,) = parts
    assert part.spans == [[0, 3 * CHUNK, 50 * CHUNK, 0, 3 * CHUNK]]
    assert ends == [(k + 1) * CHUNK for k in range(50)] and (part.start, part.end) == (0, 50 * CHUNK)


def test_spans_merge_only_where_the_tensor_and_the_buffer_both_continue():
    # Three tensors: t0 ends inside chunk 1, t1 is small, t2 spans the rest; chunk 1 holds parts of all three.
    manifest = _manifest(CHUNK + 100, 200, 3 * CHUNK)
    chunks = manifest.chunks()
    parts, ends = ChunkSpans(chunks, None, False).run(0, len(chunks))
    (part,) = parts
    assert [span[0] for span in part.spans] == [0, 1, 2]  # one copy per tensor, in chunk order
    assert sum(span[2] for span in part.spans) == ends[-1] == sum(c.nbytes for c in chunks)
    assert ends == [sum(c.nbytes for c in chunks[:k + 1]) for k in range(len(chunks))]


def test_a_strided_slice_keeps_its_pieces_and_edges_land_apart():
    # Columns 8..24 of a 64 x 32 tensor: one piece per row; no two rows are contiguous in the source.
    manifest = Manifest("m", 1, "hf", (TensorSpec("w", (64, 32), "uint8", 64 * 32),), chunk_bytes=512)
    plan = plan_reads(manifest, {0: Runs(8, 16, 32, 64)})
    edges = {c: (Piece(0, 0, 4, 4 * c),) for c in plan.pieces}
    plan = ReadPlan(plan.pieces, plan.whole, plan.unserved, plan.regions, plan.tensor_nbytes, edges)
    spans = ChunkSpans(manifest.chunks(), plan, True)
    parts, ends = spans.run(0, 2)
    (part,) = parts
    pieces = [p for c in (0, 1) for p in plan.pieces[c]]
    assert len(part.spans) == len(pieces) + 2  # every row apart, plus each chunk's edge
    assert [s[3] for s in part.spans].count(SCRATCH) == 2
    assert spans.counted_bytes(0) == sum(p.length for p in plan.pieces[0])
    assert ends == [spans.read_bytes(0), spans.read_bytes(0) + spans.read_bytes(1)]
    assert spans.read_bytes(0) == spans.counted_bytes(0) + 4  # the edge is read, not counted


def test_a_plane_that_caps_its_copies_gets_the_run_as_reads_split_between_chunks():
    manifest = Manifest("m", 1, "hf", (TensorSpec("w", (64, 32), "uint8", 64 * 32),), chunk_bytes=512)
    plan = plan_reads(manifest, {0: Runs(8, 16, 32, 64)})  # 16 rows, 16 pieces, per 512-byte chunk
    parts, ends = ChunkSpans(manifest.chunks(), plan, False).run(0, 4, max_copies=40)
    assert [len(p.spans) for p in parts] == [32, 32]  # a third chunk would pass 40: never split inside a chunk
    assert [(p.start, p.end) for p in parts] == [(0, ends[1]), (ends[1], ends[3])]
