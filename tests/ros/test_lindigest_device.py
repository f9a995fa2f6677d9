"""The device digest path (``lindigest._device_words``, ``lindigest_cells``), run on CPU tensors through the torch
ops a GPU runs (``lindigest.HOST_NUMPY = False``): its lanes against the byte-by-byte ``reference`` on odd
offsets, partial groups, odd byte edges, grids of one row and of many rows, and window edges that fall inside
weight groups and inside words; batches and column runs cut small so that every split is taken; and the
number of torch ops a digest of a large tensor launches, with no read back to the host on the way.
"""

from __future__ import annotations

import collections
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.integrity import block_digests, chunk_digests
from tensorhub_verl.ros.wire.lindigest_cells import cells
from tensorhub_verl.ros.wire.manifest import build_manifest


class _Ops(TorchDispatchMode):
    """Counts the torch ops dispatched inside it, by name."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.seen.values())


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(params=["numpy", "torch", pytest.param("cuda", marks=_GPU)])
def path(request, monkeypatch):
    """Host tensors through numpy (the host path), host tensors through the device path's torch ops, or (with a
    GPU) the bytes on the GPU."""
    monkeypatch.setattr(lindigest, "HOST_NUMPY", request.param == "numpy")
    return request.param


def _on(path: str, t: torch.Tensor) -> torch.Tensor:
    return t.cuda() if path == "cuda" else t


def _cell_reference(data: bytes, offset: int, rb: int, lo: int, hi: int, r0: int, r1: int) -> str:
    """``reference`` of the bytes of ``data`` (at ``offset``) in grid rows [r0, r1) and byte columns [lo, hi)."""
    parts = []
    for row in range(r0, r1):
        a, b = max(offset, row * rb + lo), min(offset + len(data), row * rb + hi)
        if a < b:
            parts.append(lindigest.reference(data[a - offset:b - offset], a, rb))
    return lindigest.add_hex(parts)


CASES = [  # (row bytes, offset, length, window cuts, band rows)
    (4097, 3, 4097 * 2 + 11, (1, 2048, 2051, 4000), None),  # odd row: cuts inside words and inside groups
    (2050, 0, 2050 * 3, (), 1),  # many rows, no windows, a band per row
    (2050, 1025, 2050 * 2 + 7, (1024, 1025, 2049), 2),  # odd start and end, cuts on and off group edges
    (6144, 5, 6144 * 2 - 9, tuple(range(384, 6144, 384)), None),  # 16 windows, 4 per group of the row
    (4100, 0, 4100, (2, 3, 2049, 2050), None),  # one row: windows of one byte, cuts in a word's two bytes
    (30, 7, 200, (3, 15, 27), 3),  # rows far shorter than a group: one partial group per row
    (9000, 8999, 2, (1,), None),  # a lone high byte, then a lone low byte of the next row
]


@pytest.mark.parametrize("rb, offset, length, cuts, band", CASES)
def test_cells_equal_the_reference_cell_by_cell(path, rb, offset, length, cuts, band):
    data = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=torch.Generator().manual_seed(rb))
    raw = bytes(data.tolist())
    got = cells(_on(path, data), offset, rb, cuts, band).cpu()
    rows = band or (offset + length) // rb + 1
    first = offset // rb // rows
    edges = [0, *cuts, rb]
    assert got.shape == (((offset + length - 1) // rb) // rows - first + 1, len(edges) - 1, lindigest.LANES)
    for i in range(got.shape[0]):
        for j in range(got.shape[1]):
            r0 = (first + i) * rows
            want = _cell_reference(raw, offset, rb, edges[j], edges[j + 1], r0, r0 + rows)
            assert lindigest.to_hex(got[i, j]) == want, (i, j)
    assert lindigest.to_hex(got.sum((0, 1))) == lindigest.reference(raw, offset, rb)


def test_every_batch_and_column_split_gives_the_same_lanes(monkeypatch):
    """Batches of a few hundred words: rows split into many batches, long rows into runs of columns (each ending
    on a group edge), on the linear host and device paths (float64 matmuls and int64 products each), and the
    cells' host and device paths."""
    monkeypatch.setattr(lindigest, "DEVICE_BATCH_WORDS", 1500)
    monkeypatch.setattr(lindigest, "_BATCH_WORDS", 1300)
    monkeypatch.setattr(lindigest, "HOST_MATMUL_WORDS", 1100)
    rng = random.Random(2)
    cpu = torch.device("cpu")
    for _ in range(12):
        rb = rng.choice([8, 2050, 4097, 6144, 20000])
        offset, length = rng.randint(0, 2 * rb), rng.randint(1, 3 * rb + 5)
        cuts = sorted(rng.sample(range(1, rb), rng.randint(0, min(15, rb - 1))))
        band = rng.choice([None, 1, 2])
        data = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=torch.Generator().manual_seed(length))
        want = lindigest.reference(bytes(data.tolist()), offset, rb)
        seen = []
        with monkeypatch.context() as m:  # int64 products on the host path
            m.setattr(lindigest, "HOST_NUMPY", True)
            m.setattr(lindigest._TABLES, "host_exact_matmul", False)
            assert lindigest.to_hex(lindigest.span(data, offset, rb)) == want
        for host in (True, False):
            monkeypatch.setattr(lindigest, "HOST_NUMPY", host)
            assert lindigest.to_hex(lindigest.span(data, offset, rb)) == want
            seen.append(cells(data, offset, rb, cuts, band).tolist())
        monkeypatch.setitem(lindigest._TABLES.exact_matmul, cpu, False)  # int64 products on the device path
        assert lindigest.to_hex(lindigest.span(data, offset, rb)) == want
        seen.append(cells(data, offset, rb, cuts, band).tolist())
        monkeypatch.delitem(lindigest._TABLES.exact_matmul, cpu)
        assert seen[0] == seen[1] == seen[2]
        assert lindigest.to_hex(torch.tensor(seen[0]).sum((0, 1))) == want


def test_block_digests_of_odd_layouts_equal_the_reference(path):
    """Blocks of int8 rows whose windows are 3 bytes (edges inside words), of a 1-D tensor cut into byte windows,
    of a [1, n] tensor (dim-1 windows of its one row), of a 0-dim tensor; chunks that start mid-row."""
    g = torch.Generator().manual_seed(9)
    weights = {"b": torch.randint(-128, 127, (16, 48), generator=g, dtype=torch.int8),
               "c": torch.randint(-128, 127, (32,), generator=g, dtype=torch.int8),
               "d": torch.randint(-128, 127, (1, 96), generator=g, dtype=torch.int8),
               "x": torch.randn(8, 1500, generator=g).to(torch.bfloat16), "s": torch.tensor(3.25)}
    m = build_manifest("m", 1, "hf", weights, 1001, "none")
    chunks = m.chunks()
    raw = [bytes(weights[s.name].reshape(-1).view(torch.uint8).tolist()) for s in m.tensors]
    segments = {t: [next(s for s in c.segments if s.tensor == t) for c in chunks if any(s.tensor == t
                                                                                     for s in c.segments)]
                for t in range(len(m.tensors))}
    ordered = [_on(path, weights[s.name]) for s in m.tensors]
    for tb in block_digests(chunks, m.tensors, ordered):
        spec = m.tensors[tb.tensor]
        rb = lindigest.row_bytes(spec.shape, spec.nbytes)
        for k, seg in enumerate(segments[tb.tensor]):
            data = raw[tb.tensor][seg.offset:seg.offset + seg.length]
            for j in range(tb.blocks):
                got = tb.digests[k * tb.blocks + j]
                if tb.dim == 1:
                    w = rb // tb.blocks
                    want = _cell_reference(data, seg.offset, rb, j * w, (j + 1) * w, 0, spec.shape[0])
                else:
                    w = spec.nbytes // tb.blocks
                    a, b = max(j * w, seg.offset), min((j + 1) * w, seg.offset + seg.length)
                    want = lindigest.reference(data[a - seg.offset:b - seg.offset], a, rb) if a < b else ""
                assert got == want, (spec.name, tb.dim, k, j)
    assert {(tb.tensor, tb.dim) for tb in block_digests(chunks, m.tensors, ordered)} >= {(0, 1), (2, 1), (3, 1)}


def _ops(fn) -> _Ops:
    fn()  # tables made, the self-check run
    with _Ops() as ops:
        fn()
    return ops


def test_a_large_digest_launches_few_ops_and_reads_nothing_back_until_the_end(monkeypatch):
    """32 MiB of a [4096, 4096] bf16 tensor on the device path: its chunk digests (4 chunks) and its block
    digests along both dims launch a few dozen ops per chunk, whatever the blocks; one whole-tensor digest a
    handful; nothing is read back to the host on the way (``_local_scalar_dense`` is ``.item()``)."""
    monkeypatch.setattr(lindigest, "HOST_NUMPY", False)
    w = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    m = build_manifest("m", 1, "hf", {"w": w}, 8 << 20, "none")
    chunks = m.chunks()
    whole = _ops(lambda: lindigest.span(w.view(-1).view(torch.uint8), 0, 8192))
    linear = _ops(lambda: chunk_digests(chunks, [w]))
    blocks = _ops(lambda: block_digests(chunks, m.tensors, [w]))
    assert whole.total <= 40, whole.seen  # one batch
    assert linear.total <= 40 * len(chunks), linear.seen
    assert blocks.total <= 80 * len(chunks), blocks.seen
    for ops in (whole, linear, blocks):
        assert "aten._local_scalar_dense.default" not in ops.seen and "aten.nonzero.default" not in ops.seen


def test_the_digest_bench_measures_the_device_path_here_and_prints_json_last():
    """``bench.digest --device-path`` on the CPU: the torch path's figures and its ops per GiB, JSON last; the host
    path is the default again after it."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tensorhub_verl.bench.digest", "--size-mb", "8", "--repeats", "1",
                           "--devices", "cpu", "--device-path"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cpu_path"] == "torch" and result["linear_cpu_gbps"] > 0 and result["blocks_cpu_gbps"] > 0
    assert 0 < result["ops_per_gib_linear_cpu"] <= 40 * 128 and 0 < result["ops_per_gib_blocks_cpu"] <= 80 * 128
    from tensorhub_verl.bench import digest

    digest.run(1, 1, 1, devices=["cpu"], device_path=True)
    assert lindigest.HOST_NUMPY is True


def test_the_self_check_catches_batched_products_that_round(monkeypatch, caplog):
    """A device whose batched float64 products lose bits (as an emulated double GEMM could) fails the cells'
    self-check though its plain matmul is exact, and its cells then use int64 products: the same lanes."""
    from tensorhub_verl.ros.wire import lindigest_cells

    cpu = torch.device("cpu")
    assert lindigest._check_matmul(cpu) and lindigest_cells._check_products(cpu)
    data = torch.randint(0, 256, (9000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    want = cells(data, 3, 4097, (1, 2048, 2051), None)
    einsum = torch.einsum
    monkeypatch.setattr(torch, "einsum", lambda *args: einsum(*args).to(torch.float32).to(torch.float64))
    assert not lindigest_cells._check_products(cpu)
    monkeypatch.setattr(lindigest, "HOST_NUMPY", False)
    monkeypatch.setitem(lindigest_cells._EXACT, cpu, None)
    with caplog.at_level("WARNING", logger="tensorhub_verl.ros.wire.lindigest_cells"):
        assert torch.equal(cells(data, 3, 4097, (1, 2048, 2051), None), want)
    assert lindigest_cells._EXACT[cpu] is False and "not exact" in caplog.text


def test_cells_refuse_cuts_outside_the_row_or_out_of_order_and_bands_of_no_rows():
    data = torch.zeros(64, dtype=torch.uint8)
    for cuts, band, what in [((5, 3), None, "sorted"), ((0,), None, "inside a row"), ((16,), None, "inside a row"),
                             ((4, 4), None, "distinct"), ((), 0, "positive number of rows")]:
        with pytest.raises(ValueError, match=what):
            cells(data, 0, 16, cuts, band)
