"""The per-chunk delta codec: every encoding round-trips exactly on random and realistic chunks, the chooser
picks by the measured change, a malformed payload is refused before a byte is written, and the target digest
follows from the base digest and the changed words alone. Pure functions: no processes."""

from __future__ import annotations

import struct

import pytest
import torch

from tensorhub_verl.errors import DeltaCorrupt, TensorHubError
from tensorhub_verl.ros.wire import delta_codec as dc
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.delta_digest import _word_aligned, chunk_grid, target_digest_from_base
from tensorhub_verl.ros.wire.integrity import chunk_digests
from tensorhub_verl.ros.wire.manifest import TensorSpec, split_into_chunks

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(autouse=True, params=["numpy", "torch"])
def host_path(request, monkeypatch):
    """Every test twice: host chunks through numpy (the default) and through the torch ops a GPU chunk takes
    (the device path, run on the CPU where there is no GPU)."""
    monkeypatch.setattr(dc, "HOST_NUMPY", request.param == "numpy")
    return request.param
SPARSE = [dc.OVERWRITE, dc.XOR, dc.ULP]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8).clone()


def _step(base: torch.Tensor, fraction: float, lr: float, seed: int) -> torch.Tensor:
    """An optimizer-like update: ``fraction`` of the elements move by a small relative step."""
    g = torch.Generator().manual_seed(seed)
    master = base.float()
    moved = torch.rand(base.numel(), generator=g) < fraction
    update = lr * torch.randn(base.numel(), generator=g).sign() * master.abs().clamp_min(1e-3) * 8
    return torch.where(moved, master + update, master).to(base.dtype)


def _special(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(dtype)
    pick = torch.randint(0, 6, (n,), generator=g)
    for k, v in enumerate([float("nan"), float("inf"), float("-inf"), -0.0, 0.0]):
        x[pick == k] = v
    return x


def _roundtrip(base: torch.Tensor, target: torch.Tensor, dtype: torch.dtype, encoding: str) -> dc.EncodedChunk:
    e = dc.encode_each(base, target, dtype=dtype, encodings=[encoding])[encoding]
    into = base.clone()
    dc.apply_chunk(encoding, e.payload, into, dtype=dtype)
    assert torch.equal(into, target), f"{encoding} on {dtype} did not give the target"
    return e


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("encoding", dc.ENCODINGS)
@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.25, 1.0])
def test_every_encoding_round_trips_realistic_steps(dtype, encoding, fraction):
    base = torch.randn(4099, generator=torch.Generator().manual_seed(1)).to(dtype)
    target = _step(base, fraction, 1e-3, seed=2)
    e = _roundtrip(_u8(base), _u8(target), dtype, encoding)
    assert e.elements == 4099
    assert e.changed == int((base.view(dc._INT[dtype.itemsize]) != target.view(dc._INT[dtype.itemsize])).sum())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("encoding", dc.ENCODINGS)
def test_random_bytes_nan_inf_and_signed_zeros_round_trip(dtype, encoding):
    base = _special(dtype, 3001, seed=3)
    target = _special(dtype, 3001, seed=4)
    target[:100] = base[:100]
    _roundtrip(_u8(base), _u8(target), dtype, encoding)
    # -0.0 against 0.0 and NaN payloads differ in bits, not in value: they are changes all the same
    zeros = torch.zeros(64, dtype=dtype)
    _roundtrip(_u8(zeros), _u8(-zeros), dtype, encoding)


@pytest.mark.parametrize("encoding", dc.ENCODINGS)
@pytest.mark.parametrize("length", [0, 1, 7, 8, 4097])
def test_chunks_whose_length_is_not_a_multiple_of_the_word(encoding, length):
    g = torch.Generator().manual_seed(length)
    base = torch.randint(0, 256, (length,), dtype=torch.uint8, generator=g)
    target = base.clone()
    target[::3] ^= 1
    if length:
        target[-1] ^= 0x80  # the partial word at the end changes too
    e = _roundtrip(base, target, torch.float32, encoding)
    assert e.elements == length // 4


@pytest.mark.parametrize("encoding", SPARSE)
def test_a_chunk_that_is_not_word_aligned_in_memory_is_applied_in_place(encoding):
    backing = torch.zeros(2 * 1001 + 1, dtype=torch.uint8)
    base = _u8(torch.randn(1001).to(torch.bfloat16))
    target = _u8(_step(base.view(torch.bfloat16), 0.1, 1e-2, seed=5))
    into = backing[1:]
    into.copy_(base)
    e = dc.encode_each(base, target, dtype=torch.bfloat16, encodings=[encoding])[encoding]
    dc.apply_chunk(encoding, e.payload, into, dtype=torch.bfloat16)
    assert torch.equal(into, target) and backing[0] == 0


def test_other_dtypes_are_words_of_their_element_size():
    for dtype in (torch.int8, torch.int32, torch.int64, torch.float64, torch.uint8, torch.bool, torch.complex128):
        n = 4096
        base = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
        target = base.clone()
        target[5] += 1
        target[40] ^= 0xFF
        for encoding in dc.ENCODINGS:
            _roundtrip(base, target, dtype, encoding)
        assert dc.encode_chunk(base, target, dtype=dtype).encoding != dc.DENSE


def test_ulp_is_compact_on_small_learning_rate_steps():
    """The goal's shape: a bf16 chunk with ~2% of its elements moved by one or two ulps costs well under two
    bytes per changed element (the positions as gaps, the steps zigzag-coded, each plane zstd-compressed)."""
    base = torch.randn(1 << 20, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    keys = dc._keys(base.view(torch.int16), True)
    g = torch.Generator().manual_seed(9)
    moved = torch.rand(base.numel(), generator=g) < 0.02
    steps = torch.randint(1, 3, (base.numel(),), generator=g) * (torch.randint(0, 2, (base.numel(),), generator=g) * 2 - 1)
    target = dc._keys(torch.where(moved, keys + steps.to(torch.int16), keys), True).view(torch.bfloat16)
    each = dc.encode_each(_u8(base), _u8(target), dtype=torch.bfloat16)
    per = {k: e.nbytes / e.changed for k, e in each.items()}
    assert per[dc.ULP] < 1.5, per
    assert per[dc.ULP] < per[dc.OVERWRITE] and per[dc.ULP] < per[dc.XOR]
    assert dc.encode_chunk(_u8(base), _u8(target), dtype=torch.bfloat16).encoding == dc.ULP


def test_the_chooser_goes_dense_above_the_threshold_and_sparse_below():
    base = torch.randn(8192, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    dense = _step(base, 0.6, 1e-2, seed=11)
    sparse = _step(base, 0.01, 1e-2, seed=12)
    assert dc.encode_chunk(_u8(base), _u8(dense), dtype=torch.bfloat16).encoding == dc.DENSE
    chosen = dc.encode_chunk(_u8(base), _u8(sparse), dtype=torch.bfloat16)
    assert chosen.encoding != dc.DENSE and chosen.nbytes < 0.1 * base.numel() * 2
    assert chosen.nbytes == min(e.nbytes for e in dc.encode_each(_u8(base), _u8(sparse), dtype=torch.bfloat16,
                                                                 encodings=dc.DEFAULT_CANDIDATES).values())
    nothing = dc.encode_chunk(_u8(base), _u8(base), dtype=torch.bfloat16)
    assert nothing.changed == 0 and nothing.encoding != dc.DENSE and nothing.nbytes < 200
    # with a lower threshold the same sparse change goes dense
    assert dc.encode_chunk(_u8(base), _u8(sparse), dtype=torch.bfloat16, dense_fraction=0.001).encoding == dc.DENSE


def test_large_steps_go_overwrite_when_it_is_smaller():
    """Words reset to one value (large, random steps; values that compress to nothing): overwrite wins, and the
    chooser, which tries it after ulp only when ulp's steps are large, finds it."""
    base = torch.randn(1 << 16, generator=torch.Generator().manual_seed(23))
    target = base.clone()
    target[::20] = 0.0
    chosen = dc.encode_chunk(_u8(base), _u8(target), dtype=torch.float32)
    each = dc.encode_each(_u8(base), _u8(target), dtype=torch.float32, encodings=(dc.ULP, dc.OVERWRITE))
    assert each[dc.OVERWRITE].nbytes < each[dc.ULP].nbytes
    assert chosen.encoding == dc.OVERWRITE and chosen.nbytes == each[dc.OVERWRITE].nbytes


def test_overwrite_is_idempotent():
    base = _u8(torch.randn(2048).to(torch.bfloat16))
    target = _u8(_step(base.view(torch.bfloat16), 0.05, 1e-2, seed=13))
    e = dc.encode_each(base, target, dtype=torch.bfloat16, encodings=[dc.OVERWRITE])[dc.OVERWRITE]
    into = base.clone()
    dc.apply_chunk(dc.OVERWRITE, e.payload, into, dtype=torch.bfloat16)
    dc.apply_chunk(dc.OVERWRITE, e.payload, into, dtype=torch.bfloat16)
    assert torch.equal(into, target)


def _malformed(payload: bytes) -> list[tuple[str, bytes]]:
    head = dc._HEADER.size
    magic, fmt, ident, w, tail, count, elements, changed = dc._HEADER.unpack_from(payload, 0)
    first = dc._STREAM.unpack_from(payload, head)
    return [
        ("empty", b""),
        ("short header", payload[:head - 1]),
        ("bad magic", b"XXXX" + payload[4:]),
        ("other format", payload[:4] + bytes([fmt + 1]) + payload[5:]),
        ("word size", dc._HEADER.pack(magic, fmt, ident, 4, tail, count, elements, changed) + payload[head:]),
        ("elements", dc._HEADER.pack(magic, fmt, ident, w, tail, count, elements + 1, changed) + payload[head:]),
        ("changed above elements", dc._HEADER.pack(magic, fmt, ident, w, tail, count, elements, elements + 1)
         + payload[head:]),
        ("stream count", dc._HEADER.pack(magic, fmt, ident, w, tail, count - 1, elements, changed) + payload[head:]),
        ("truncated", payload[:-1]),
        ("trailing", payload + b"\0"),
        ("raw length", payload[:head] + dc._STREAM.pack(first[0], first[1] + 1, first[2]) + payload[head + dc._STREAM.size:]),
        ("unknown kind", payload[:head] + dc._STREAM.pack(7, first[1], first[2]) + payload[head + dc._STREAM.size:]),
    ]


@pytest.mark.parametrize("encoding", SPARSE + [dc.BF16[e] for e in SPARSE])
def test_a_malformed_payload_is_refused_before_a_byte_is_written(encoding):
    """Of every sparse encoding: the ``_bf16`` ones on a float32 chunk of bf16 values (their 2-byte values in a
    frame of 4-byte words)."""
    dtype = torch.float32 if encoding in dc.BF16_ENCODINGS else torch.bfloat16
    bf16 = torch.randn(4096, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    base, target = _u8(bf16.to(dtype)), _u8(_step(bf16, 0.05, 1e-2, seed=15).to(dtype))
    payload = dc.encode_each(base, target, dtype=dtype, encodings=[encoding])[encoding].payload
    for what, bad in _malformed(payload):
        into = base.clone()
        with pytest.raises(DeltaCorrupt) as info:
            dc.apply_chunk(encoding, bad, into, dtype=dtype)
        assert torch.equal(into, base), f"{what}: bytes were written before the payload was refused"
        assert info.value.encoding == encoding and "in full" in str(info.value), what
    # a payload of another encoding, and garbage inside a compressed stream
    other = dc.XOR if encoding != dc.XOR else dc.ULP
    into = base.clone()
    with pytest.raises(DeltaCorrupt):
        dc.apply_chunk(other, payload, into, dtype=dtype)
    assert torch.equal(into, base)
    assert isinstance(DeltaCorrupt("x"), TensorHubError)


def test_a_stream_that_does_not_decompress_and_positions_out_of_range_are_refused():
    base = _u8(torch.randn(4096, generator=torch.Generator().manual_seed(16)).to(torch.bfloat16))
    target = _u8(_step(base.view(torch.bfloat16), 0.2, 1e-2, seed=17))
    payload = bytearray(dc.encode_each(base, target, dtype=torch.bfloat16, encodings=[dc.ULP])[dc.ULP].payload)
    kind, raw, stored = dc._STREAM.unpack_from(payload, dc._HEADER.size)
    assert kind == dc._ZSTD
    data = dc._HEADER.size + 6 * dc._STREAM.size
    garbled = bytearray(payload)
    garbled[data:data + stored] = bytes(stored)
    into = base.clone()
    with pytest.raises(DeltaCorrupt, match="decompress"):
        dc.apply_chunk(dc.ULP, bytes(garbled), into, dtype=torch.bfloat16)
    assert torch.equal(into, base)
    # positions past the chunk's end: one changed word whose gap is the chunk's length
    frame = dc._frame(dc.ULP, 2, 4096, 1, b"", dc._planes(torch.tensor([4096], dtype=torch.int32).numpy(), 4)
                      + dc._planes(torch.tensor([2], dtype=torch.int16).numpy(), 2))
    into = base.clone()
    with pytest.raises(DeltaCorrupt, match="beyond"):
        dc.apply_chunk(dc.ULP, frame, into, dtype=torch.bfloat16)
    assert torch.equal(into, base)
    with pytest.raises(DeltaCorrupt, match="bytes for a chunk"):
        dc.apply_chunk(dc.DENSE, bytes(10), into, dtype=torch.bfloat16)
    with pytest.raises(DeltaCorrupt, match="unknown encoding"):
        dc.apply_chunk("lz4", bytes(payload), into, dtype=torch.bfloat16)
    assert torch.equal(into, base)


def test_bad_chunks_are_refused_with_the_fix():
    a = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="same length|one device"):
        dc.encode_chunk(a, torch.zeros(12, dtype=torch.uint8), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous 1-D uint8"):
        dc.encode_chunk(a.view(torch.int16), a.view(torch.int16), dtype=torch.bfloat16)


@pytest.mark.parametrize("chunk_bytes", [1001, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_target_digest_follows_from_the_base_digest_and_the_changed_words(chunk_bytes, dtype):
    """Pinned to the full digest of the target, over chunks that mix tensors of several dtypes and grids (2-D
    rows, a 1-D tensor of odd length, a segment that starts at an odd offset of its tensor)."""
    g = torch.Generator().manual_seed(18)
    base = {
        "w": torch.randn(37, 50, generator=g).to(torch.bfloat16),
        "b": torch.randint(0, 256, (333,), dtype=torch.uint8, generator=g),
        "f": torch.randn(17, 9, generator=g),
        "h": torch.randn(3001, generator=g).to(torch.float16),
    }
    target = {k: v.clone() for k, v in base.items()}
    target["w"] = _step(base["w"].reshape(-1), 0.05, 1e-2, seed=19).reshape(37, 50)
    target["b"][::7] += 3
    target["f"][2, 3] = -0.0
    target["f"][5] += 1.0
    target["h"] = _step(base["h"], 0.3, 1e-2, seed=20)
    changed_chunks = aligned = 0
    first = None
    for grid, b, t, base_digest, target_digest in _chunk_pairs(base, target, chunk_bytes):
        first = first or (grid, b, t, target_digest)
        aligned += _word_aligned(grid)
        changed_chunks += base_digest != target_digest
        _check_target_digests(grid, b, t, base_digest, target_digest, dtype, dc.ENCODINGS)
    assert changed_chunks > 5
    assert (aligned >= 3) == (chunk_bytes == 1024)  # both ways of summing the change ran
    # and a wrong base digest gives a wrong target digest: the check catches a base that was not N-1
    grid, b, t, target_digest = first
    assert target_digest_from_base(lindigest.to_hex([1, 2]), grid,
                                   dc.decode_chunk(dc.DENSE, t.numpy().tobytes(), b, dtype=torch.bfloat16)
                                   ) != target_digest


def _chunk_pairs(base: dict, target: dict, chunk_bytes: int):
    """Per chunk of the two versions' chunk map: its grid, base bytes, target bytes, base and target digests."""
    specs = tuple(TensorSpec.of(k, v) for k, v in base.items())
    chunks = split_into_chunks(specs, chunk_bytes)
    digests = zip(chunk_digests(chunks, base.values()), chunk_digests(chunks, target.values()))
    flat_base = torch.cat([v.reshape(-1).view(torch.uint8) for v in base.values()])
    flat_target = torch.cat([v.reshape(-1).view(torch.uint8) for v in target.values()])
    start = 0
    for chunk, (base_digest, target_digest) in zip(chunks, digests):
        end = start + chunk.nbytes
        yield chunk_grid(chunk, specs), flat_base[start:end], flat_target[start:end], base_digest, target_digest
        start = end


def _check_target_digests(grid, b, t, base_digest: str, target_digest: str, dtype, encodings) -> None:
    """Each encoding's decoded changes give the target digest from the base digest."""
    for encoding in encodings:
        e = dc.encode_each(b, t, dtype=dtype, encodings=[encoding])[encoding]
        changes = dc.decode_chunk(encoding, e.payload, b, dtype=dtype)
        assert target_digest_from_base(base_digest, grid, changes) == target_digest, encoding



@pytest.mark.parametrize("chunk_bytes", [3000, 4096, 6144])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_target_digest_of_word_aligned_chunks_follows_from_the_changed_words(chunk_bytes, dtype):
    """Chunks whose words are whole words of their tensors' grids, summed word by word: a 1-D tensor of many
    weight groups and rows of whole groups (a word's group is its tensor word over a group's words), rows of part
    groups, and a tiny tensor that shares a chunk; chunks that start on a group edge and inside a group."""
    g = torch.Generator().manual_seed(21)
    base = {
        "long": torch.randn(5 * lindigest.GROUP + 300, generator=g).to(dtype),
        "rows": torch.randn(6, 2 * lindigest.GROUP, generator=g).to(dtype),
        "part": torch.randn(7, 1500, generator=g).to(dtype),
        "tiny": torch.randn(3, generator=g).to(dtype),
    }
    target = {k: _step(v.reshape(-1), 0.05, 1e-2, seed=22 + i).reshape(v.shape)
              for i, (k, v) in enumerate(base.items())}
    kinds = set()
    for grid, b, t, base_digest, target_digest in _chunk_pairs(base, target, chunk_bytes):
        assert _word_aligned(grid)
        for piece in grid:
            rows_of_groups = piece.row_bytes % (2 * lindigest.GROUP) == 0
            one_row = piece.offset + piece.length <= piece.row_bytes
            kinds.add((rows_of_groups or one_row, (piece.offset - piece.start) // 2 % lindigest.GROUP == 0))
        _check_target_digests(grid, b, t, base_digest, target_digest, dtype, (dc.DENSE, *SPARSE))
    assert {(True, True), (True, False), (False, False)} <= kinds

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("encoding", dc.KNOWN)
def test_on_a_cuda_device_the_diff_and_the_apply_stay_there(encoding):
    """The ``_bf16`` encodings on a float32 chunk of bf16 values."""
    dtype = torch.float32 if encoding in dc.BF16_ENCODINGS else torch.bfloat16
    base = torch.randn(1 << 16, generator=torch.Generator().manual_seed(21)).to(torch.bfloat16)
    target = _step(base, 0.03, 1e-3, seed=22)
    b, t = _u8(base.to(dtype)).cuda(), _u8(target.to(dtype)).cuda()
    e = dc.encode_each(b, t, dtype=dtype, encodings=[encoding])[encoding]
    host = dc.encode_each(b.cpu(), t.cpu(), dtype=dtype, encodings=[encoding])[encoding]
    assert e.payload == host.payload
    into = b.clone()
    dc.apply_chunk(encoding, e.payload, into, dtype=dtype)
    assert torch.equal(into.cpu(), t.cpu())


def test_a_strided_chunk_is_refused():
    a = torch.zeros(20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="contiguous"):
        dc.encode_chunk(a[::2], a[::2], dtype=torch.bfloat16)
