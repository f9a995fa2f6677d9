"""The linear chunk digest (``lindigest.py``) and the block digests that check ranged reads (``integrity.py``).

Its values are checked against a byte-by-byte Python reference of its definition; its linearity (the digest of
a union is the sum of the parts') on random cuts; the ranged checks on real plans, with the wrong bytes a liar
would serve; and, with a GPU, digests computed on the GPU against the CPU's. Through real hubs and holder
processes: a TP rank's slices read from a holder that serves the other rank's slices are caught and read again
from an honest one.
"""

import random

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.wire.integrity import ChunkChecker, block_digests, chunk_digests, local_views
from tensorhub_verl.ros.wire.manifest import build_manifest
from tensorhub_verl.ros.wire.ranges import Runs, TensorSlice, plan_reads

from tests.ros.roles import sliced_holder, tp_weights


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """Odd sizes and byte counts: int8 rows of odd length, a 0-dim tensor, rows of more than a weight group."""
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randint(-128, 127, (5, 7), generator=g, dtype=torch.int8),
            "w": torch.randn(12, 1100, generator=g).to(torch.bfloat16),
            "s": torch.tensor(3.25),
            "v": torch.randn(33, generator=g),
            "o": torch.randn(16, 64, generator=g)}


def _manifest(weights, chunk_bytes=3001):
    m = build_manifest("m", 1, "hf", weights, chunk_bytes, "none")
    ordered = [weights[s.name] for s in m.tensors]
    chunks = m.chunks()
    return m.__class__(m.model, m.version, m.layout, m.tensors, m.chunk_bytes, "", chunk_digests(chunks, ordered),
                       1, lindigest.ALGORITHM, block_digests(chunks, m.tensors, ordered))


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.reshape(-1).view(torch.uint8).tolist())


def test_chunk_digests_equal_the_reference_computed_byte_by_byte():
    weights = _weights(1)
    m = _manifest(weights)
    raw = [_bytes(weights[s.name]) for s in m.tensors]
    for chunk in m.chunks():
        want = lindigest.add_hex(lindigest.reference(raw[seg.tensor][seg.offset:seg.offset + seg.length], seg.offset,
                                                     lindigest.row_bytes(m.tensors[seg.tensor].shape,
                                                                         m.tensors[seg.tensor].nbytes))
                                 for seg in chunk.segments)
        assert m.chunk_digests[chunk.index] == want


def test_the_digest_of_a_union_is_the_sum_of_its_parts():
    rng = random.Random(3)
    data = torch.randint(0, 256, (9000,), dtype=torch.uint8)
    for rb in (8, 2050, 4097, 9000):
        whole = lindigest.to_hex(lindigest.span(data, 0, rb))
        cuts = sorted(rng.sample(range(1, data.numel()), 5))
        parts = [lindigest.to_hex(lindigest.span(data[a:b], a, rb)) for a, b in zip([0, *cuts], [*cuts, 9000])]
        assert lindigest.add_hex(parts) == whole
        windows = [lindigest.to_hex(lindigest.span(data, 0, rb, window=(a, b))) for a, b in
                   zip([0, rb // 3], [rb // 3, rb])]
        assert lindigest.add_hex(windows) == whole


def test_block_digests_add_up_to_each_segment_along_every_dim():
    weights = _weights(2)
    m = _manifest(weights)
    per_chunk: dict[int, list[str]] = {}
    segment_of = {}
    for chunk in m.chunks():
        for seg in chunk.segments:
            segment_of.setdefault(seg.tensor, []).append(chunk.index)
    for tb in m.block_digests:
        for k, chunk in enumerate(segment_of[tb.tensor]):
            total = lindigest.add_hex(tb.digests[k * tb.blocks:(k + 1) * tb.blocks])
            per_chunk.setdefault((chunk, tb.dim), []).append(total)
    for chunk in m.chunks():
        assert lindigest.add_hex(per_chunk[(chunk.index, 0)]) == m.chunk_digests[chunk.index]
    assert {(tb.tensor, tb.dim) for tb in m.block_digests} >= {(1, 1), (4, 1)}  # the bf16 and f32 matrices


def test_a_ranged_read_is_checked_against_the_blocks_it_covers_and_a_wrong_slice_fails():
    weights = _weights(4)
    m = _manifest(weights, chunk_bytes=4096)
    names = [s.name for s in m.tensors]
    cases = {"w": TensorSlice(1, 550, 275), "o": TensorSlice(1, 32, 16), "v": None}
    runs = {names.index(n): Runs.whole(m.tensors[names.index(n)]) if sl is None else
            Runs.of_slice(m.tensors[names.index(n)], sl) for n, sl in cases.items()}
    plan = plan_reads(m, runs)
    checker = ChunkChecker(m, plan, {names.index(n): sl for n, sl in cases.items()})
    partial = [c for c in plan.pieces if c not in plan.whole]
    assert partial and all(checker.checks(c) for c in plan.pieces)
    right = [torch.empty(0, dtype=torch.uint8)] * len(names)
    wrong = list(right)
    for n, sl in cases.items():
        full = weights[n]
        right[names.index(n)] = full.clone() if sl is None else full.narrow(sl.dim, sl.start, sl.length).contiguous()
        other = full.flip(0) if sl is None else full.narrow(sl.dim, sl.start - sl.length, sl.length).contiguous()
        wrong[names.index(n)] = other  # another rank's slice (or the tensor's rows mixed up)
    good, bad = local_views(right), local_views(wrong)
    for c in plan.pieces:
        assert checker.landed(plan.pieces[c], good) == checker.expected(c)
        assert checker.landed(plan.pieces[c], bad) != checker.expected(c)


def test_slices_not_made_of_whole_blocks_are_not_checked():
    weights = _weights(5)
    m = _manifest(weights, chunk_bytes=4096)
    sl = TensorSlice(1, 5, 7)  # 64 columns in 16 blocks of 4: not aligned
    plan = plan_reads(m, {4: Runs.of_slice(m.tensors[4], sl)})
    checker = ChunkChecker(m, plan, {4: sl})
    assert not any(checker.checks(c) for c in plan.pieces if c not in plan.whole)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: compares GPU digests with the CPU's")
def test_digests_computed_on_the_gpu_equal_the_cpus():
    weights = _weights(6) | {"big": torch.randn(3, 5000, 700).to(torch.bfloat16)}
    m = build_manifest("m", 1, "hf", weights, 1 << 20, "none")
    chunks = m.chunks()
    cpu = [weights[s.name] for s in m.tensors]
    gpu = [t.cuda() for t in cpu]
    assert chunk_digests(chunks, gpu) == chunk_digests(chunks, cpu)
    assert block_digests(chunks, m.tensors, gpu) == block_digests(chunks, m.tensors, cpu)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_tp_rank_reading_from_a_holder_that_serves_the_wrong_slices_reads_them_elsewhere(hub, roles):
    chunk = 16 << 10
    config = ClientConfig.from_fields(window=4, transport="tcp")
    roles(sliced_holder, hub.url, "liar", chunk, True, "tcp").result(120)
    want = tp_weights()
    slices = {"o": (1, 256, 256), "q": (0, 256, 256)}
    with Client(hub.url, "rank1", config=config) as rank:
        into = {"o": torch.empty(256, 256), "q": torch.empty(256, 256, dtype=torch.bfloat16)}
        with pytest.raises(TransferFailed, match="no holder can serve"):  # every read from the liar fails its check
            rank.fetch_slices("policy", 1, into=into, slices=slices, timeout=60)
        roles(sliced_holder, hub.url, "honest", chunk, False, "tcp").result(120)
        stats = rank.fetch_slices("policy", 1, into=into, slices=slices, timeout=60)
    assert torch.equal(into["o"], want["o"][:, 256:]) and torch.equal(into["q"], want["q"][256:])
    assert set(stats.sources) == {"honest"}


def test_a_reader_republishes_what_it_fetched_with_the_digests_it_checked(hub, monkeypatch):
    weights = _weights(7)
    with th.connect(hub.url, "trainer", chunk_bytes=4096) as trainer, \
            th.connect(hub.url, "engine", chunk_bytes=4096) as engine:
        published = trainer.publish("policy", 1, weights)
        buffers = published.allocate()
        stats = engine.fetch("policy", 1, into=buffers, hold=False)
        assert stats.manifest is not None and stats.manifest.chunk_digests == published.chunk_digests

        def no_second_pass(*args, **kwargs):
            raise AssertionError("digests of verified bytes are computed again")

        monkeypatch.setattr("tensorhub_verl.ros.client.client.chunk_digests", no_second_pass)
        again = engine.publish("policy", 1, buffers, verified=stats.manifest)
        assert again.chunk_digests == published.chunk_digests and again.block_digests == published.block_digests
        with pytest.raises(AssertionError, match="computed again"):  # another chunk map: computed, not reused
            engine.publish("policy", 1, buffers, chunk_bytes=8192, verified=stats.manifest)


def test_host_memory_is_digested_in_numpy_with_the_lanes_of_the_device_path():
    """The host path (numpy float64 matmuls on the calling thread) against the device path (torch float64
    matmuls) run on the same CPU words: odd column offsets and widths, grid rows past the first, and rows longer
    than a batch."""
    rng = torch.Generator().manual_seed(7)
    cases = [((1, 3 * lindigest._BATCH_WORDS + 517), 0, 0, 1600), ((1, 70_000), 5, 1000, 90),
             ((37, 2100), 3, 1000, 4), ((513, 64), 0, 5, 1), ((4, 1024), 1, 0, 2), ((1, 1), 9, 1023, 2)]
    for shape, row0, col0, groups in cases:
        words = torch.randint(-(1 << 15), 1 << 15, shape, generator=rng, dtype=torch.int32).to(torch.int16)
        host = lindigest._words(words, row0, col0, groups)
        assert host.dtype == torch.int64 and host.shape == (lindigest.LANES,)
        assert host.tolist() == lindigest._device_words(words, row0, col0, groups).remainder(lindigest.P).tolist()
        strided = words.t().contiguous().t()  # a column-major view: numpy reads it through its strides
        assert lindigest._words(strided, row0, col0, groups).tolist() == host.tolist()


def test_host_digest_without_an_exact_float64_matmul_uses_int64_products(monkeypatch, caplog):
    """The host path's int64 products give the float64 matmul's lanes, and a host whose self-check fails takes
    them, with a warning; numpy here passes the self-check."""
    assert lindigest._check_host_matmul()
    rng = torch.Generator().manual_seed(12)
    cases = [((1, 3 * lindigest.HOST_MATMUL_WORDS + 517), 0, 0, 1600), ((37, 2100), 3, 1000, 4),
             ((5, 7), 2, 1023, 1)]
    for shape, row0, col0, groups in cases:
        words = torch.randint(-(1 << 15), 1 << 15, shape, generator=rng, dtype=torch.int32).to(torch.int16).numpy()
        assert (lindigest._host_words(words, row0, col0, groups, exact_matmul=False)
                == lindigest._host_words(words, row0, col0, groups, exact_matmul=True)).all()
    monkeypatch.setattr(lindigest, "_check_host_matmul", lambda: False)
    monkeypatch.setattr(lindigest._TABLES, "host_exact_matmul", None)
    words = torch.randint(-(1 << 15), 1 << 15, (3, 3000), generator=rng, dtype=torch.int32).to(torch.int16)
    with caplog.at_level("WARNING", logger="tensorhub_verl.ros.wire.lindigest"):
        assert lindigest._words(words, 1, 0, 3).tolist() == lindigest._device_words(words, 1, 0, 3).tolist()
    assert lindigest._TABLES.host_exact_matmul is False and "not exact" in caplog.text


def test_device_digest_without_an_exact_float64_matmul_uses_int64_products(monkeypatch, caplog):
    """The device path's int64 fallback (for a BLAS whose double GEMM is not exact) gives the host's lanes, and a
    device whose self-check fails takes it, with a warning; CPU torch passes the self-check."""
    assert lindigest._check_matmul(torch.device("cpu"))
    rng = torch.Generator().manual_seed(11)
    cases = [((1, 2 * lindigest.GROUP + 517), 0, 0, 4), ((37, 2100), 3, 1000, 4), ((5, 7), 2, 1023, 1)]
    for shape, row0, col0, groups in cases:
        words = torch.randint(-(1 << 15), 1 << 15, shape, generator=rng, dtype=torch.int32).to(torch.int16)
        host = lindigest._words(words, row0, col0, groups).tolist()
        assert lindigest._device_words(words, row0, col0, groups, exact_matmul=False).tolist() == host
    cpu = torch.device("cpu")  # the device path run on CPU tensors, as if the CPU's self-check had failed
    monkeypatch.setattr(lindigest, "_check_matmul", lambda device: False)
    monkeypatch.setitem(lindigest._TABLES.exact_matmul, cpu, None)
    words = torch.randint(-(1 << 15), 1 << 15, (3, 3000), generator=rng, dtype=torch.int32).to(torch.int16)
    with caplog.at_level("WARNING", logger="tensorhub_verl.ros.wire.lindigest"):
        assert lindigest._device_words(words, 1, 0, 3).tolist() == lindigest._words(words, 1, 0, 3).tolist()
    assert lindigest._TABLES.exact_matmul[cpu] is False and "not exact" in caplog.text
