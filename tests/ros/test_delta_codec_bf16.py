"""The codec on float32 chunks whose words hold bf16 values (a bf16 trainer publishing for float32 rollouts):
the ``_bf16`` encodings carry the words' high halves, round-trip exactly, are picked by themselves and cost what
the bf16 chunk's delta costs; a chunk with a word that is not a bf16 value takes the plain encodings; a payload
that does not fit the chunk is refused before a byte is written; the digests of the float32 bytes check the
result as for every encoding. Pure functions and the delta's chunk apply: no processes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tensorhub_verl.errors import DeltaCorrupt
from tensorhub_verl.ros.client.delta_chunks import apply_delta, encode_delta
from tensorhub_verl.ros.wire import delta_codec as dc
from tensorhub_verl.ros.wire.delta_digest import chunk_grid, target_digest_from_base
from tensorhub_verl.ros.wire.integrity import ALGORITHM, chunk_digests
from tensorhub_verl.ros.wire.manifest import TensorSpec, build_manifest, split_into_chunks

SPARSE = [dc.OVERWRITE_BF16, dc.XOR_BF16, dc.ULP_BF16]


@pytest.fixture(autouse=True, params=["numpy", "torch"])
def host_path(request, monkeypatch):
    """Every test twice: host chunks through numpy (the default) and through the torch ops a GPU chunk takes
    (run on the CPU where there is no GPU)."""
    monkeypatch.setattr(dc, "HOST_NUMPY", request.param == "numpy")
    return request.param


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8).clone()


def _bf16_step(n: int, fraction: float, seed: int, special: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Two bf16 vectors, ``fraction`` of the elements one or two units in the last place apart (an AdamW step at
    a small learning rate); with ``special``, NaNs, infinities and signed zeros among them."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g).to(torch.bfloat16)
    if special:
        pick = torch.randint(0, 12, (n,), generator=g)
        for k, v in enumerate([float("nan"), float("inf"), float("-inf"), -0.0, 0.0]):
            base[pick == k] = v
    keys = dc._keys(base.view(torch.int16), True)
    moved = torch.rand(n, generator=g) < fraction
    steps = torch.randint(1, 3, (n,), generator=g) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    target = dc._keys(torch.where(moved, keys + steps.to(torch.int16), keys), True).view(torch.bfloat16)
    return base, target


def _fp32(base: torch.Tensor, target: torch.Tensor, tail: bytes = b"") -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 chunks of two bf16 vectors (exact up-casts), with ``tail`` bytes after the words (the target's
    tail is ``tail`` with its bytes flipped)."""
    b, t = _u8(base.float()), _u8(target.float())
    if tail:
        b = torch.cat([b, torch.tensor(list(tail), dtype=torch.uint8)])
        t = torch.cat([t, torch.tensor([x ^ 0xFF for x in tail], dtype=torch.uint8)])
    return b, t


def _roundtrip(b: torch.Tensor, t: torch.Tensor, encoding: str) -> dc.EncodedChunk:
    e = dc.encode_each(b, t, dtype=torch.float32, encodings=[encoding])[encoding]
    into = b.clone()
    dc.apply_chunk(encoding, e.payload, into, dtype=torch.float32)
    assert torch.equal(into, t), f"{encoding} did not give the target"
    return e


@pytest.mark.parametrize("encoding", dc.BF16_ENCODINGS)
@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.25, 1.0])
@pytest.mark.parametrize("tail", [b"", b"\x01\x02\x03"])
def test_every_bf16_encoding_round_trips_float32_words_that_hold_bf16_values(encoding, fraction, tail):
    base, target = _bf16_step(4099, fraction, seed=1, special=True)
    b, t = _fp32(base, target, tail)
    e = _roundtrip(b, t, encoding)
    assert e.elements == 4099
    assert e.changed == int((base.view(torch.int16) != target.view(torch.int16)).sum())
    # a changed word's high half carries the change: the payload holds 2-byte values, not 4-byte words
    if encoding == dc.DENSE_BF16:
        assert e.nbytes == 2 * 4099 + len(tail)


def test_the_chooser_takes_the_bf16_halves_and_costs_what_the_bf16_delta_costs():
    base, target = _bf16_step(1 << 18, 0.02, seed=2)
    as_bf16 = dc.encode_chunk(_u8(base), _u8(target), dtype=torch.bfloat16)
    b, t = _fp32(base, target)
    chosen = dc.encode_chunk(b, t, dtype=torch.float32)
    plain = dc.encode_chunk(b, t, dtype=torch.float32, bf16_halves=False)
    assert as_bf16.encoding == dc.ULP and chosen.encoding == dc.ULP_BF16 and plain.encoding == dc.ULP
    assert chosen.changed == plain.changed == as_bf16.changed
    # the same positions and steps, framed alike: the float32 delta is the bf16 delta's size
    assert chosen.nbytes == as_bf16.nbytes
    assert plain.nbytes > 1.2 * chosen.nbytes, (plain.nbytes, chosen.nbytes)
    into = b.clone()
    dc.apply_chunk(chosen.encoding, chosen.payload, into, dtype=torch.float32)
    assert torch.equal(into, t)
    # above the dense threshold: the bf16 halves of the chunk, half the float32 chunk
    base, target = _bf16_step(8192, 0.6, seed=3)
    b, t = _fp32(base, target)
    dense = dc.encode_chunk(b, t, dtype=torch.float32)
    assert dense.encoding == dc.DENSE_BF16 and dense.nbytes == b.numel() // 2
    assert dc.encode_chunk(b, t, dtype=torch.float32, bf16_halves=False).encoding == dc.DENSE


def test_a_word_that_is_not_a_bf16_value_takes_the_plain_encodings():
    base, target = _bf16_step(1 << 14, 0.02, seed=4)
    b, t = _fp32(base, target)
    changed = (b.view(torch.int32) != t.view(torch.int32)).nonzero().reshape(-1)
    # one changed word of the target with a low half: no bf16 encoding of the changed words fits
    t.view(torch.int32)[changed[3]] |= 1
    chosen = dc.encode_chunk(b, t, dtype=torch.float32)
    assert chosen.encoding == dc.ULP
    into = b.clone()
    dc.apply_chunk(chosen.encoding, chosen.payload, into, dtype=torch.float32)
    assert torch.equal(into, t)
    for encoding in dc.BF16_ENCODINGS:
        with pytest.raises(ValueError, match="low halves"):
            dc.encode_each(b, t, dtype=torch.float32, encodings=[encoding])
    # an unchanged word with a low half in base and target: the sparse forms still fit (they never write it),
    # the dense one does not
    b2, t2 = _fp32(base, target)
    unchanged = (b2.view(torch.int32) == t2.view(torch.int32)).nonzero().reshape(-1)[5]
    b2.view(torch.int32)[unchanged] |= 7
    t2.view(torch.int32)[unchanged] |= 7
    assert dc.encode_chunk(b2, t2, dtype=torch.float32).encoding == dc.ULP_BF16
    for encoding in SPARSE:
        _roundtrip(b2, t2, encoding)
    with pytest.raises(ValueError, match="low halves"):
        dc.encode_each(b2, t2, dtype=torch.float32, encodings=[dc.DENSE_BF16])
    # the same bits read as another dtype never take the bf16 forms
    assert dc.encode_chunk(_u8(base.float()), _u8(target.float()), dtype=torch.int32).encoding in dc.ENCODINGS


@pytest.mark.parametrize("encoding", SPARSE)
def test_a_bf16_payload_that_does_not_fit_the_chunk_is_refused_before_a_byte_is_written(encoding):
    """Malformed frames of every encoding: tests/ros/test_delta_codec.py. Here: a payload read as its whole-word
    encoding, a chunk of another dtype than float32, one value more than the frame declares."""
    base, target = _bf16_step(4096, 0.05, seed=5)
    b, t = _fp32(base, target)
    payload = dc.encode_each(b, t, dtype=torch.float32, encodings=[encoding])[encoding].payload
    into = b.clone()
    with pytest.raises(DeltaCorrupt, match="another encoding"):
        dc.apply_chunk(dc._WHOLE[encoding], payload, into, dtype=torch.float32)
    for dtype in (torch.bfloat16, torch.int32, torch.float64):
        with pytest.raises(DeltaCorrupt, match="rebuilds float32 words"):
            dc.apply_chunk(encoding, payload, into, dtype=dtype)
    head = dc._HEADER.size
    kind, raw, stored = dc._STREAM.unpack_from(payload, head)
    oversized = payload[:head] + dc._STREAM.pack(kind, raw * 2, stored) + payload[head + dc._STREAM.size:]
    with pytest.raises(DeltaCorrupt, match="expected"):
        dc.apply_chunk(encoding, oversized, into, dtype=torch.float32)
    assert torch.equal(into, b)


def test_a_dense_bf16_payload_of_the_wrong_size_is_refused():
    base, target = _bf16_step(4096, 0.5, seed=6)
    b, t = _fp32(base, target)
    payload = dc.encode_each(b, t, dtype=torch.float32, encodings=[dc.DENSE_BF16])[dc.DENSE_BF16].payload
    into = b.clone()
    for bad in (payload[:-2], payload + b"\0\0", t.numpy().tobytes()):
        with pytest.raises(DeltaCorrupt, match="bytes for a chunk"):
            dc.apply_chunk(dc.DENSE_BF16, bad, into, dtype=torch.float32)
    assert torch.equal(into, b)


@pytest.mark.parametrize("encoding", SPARSE)
def test_words_are_rebuilt_one_by_one_whatever_lies_at_the_other_places(encoding):
    """A tensor-parallel rank applies the whole chunk's payload to a scratch chunk that holds its places of the
    base and zeros elsewhere: its places come out right."""
    base, target = _bf16_step(4096, 0.1, seed=7)
    b, t = _fp32(base, target)
    payload = dc.encode_each(b, t, dtype=torch.float32, encodings=[encoding])[encoding].payload
    mine = torch.zeros(4096, dtype=torch.bool)
    mine[1024:2048] = True
    scratch = torch.where(mine, b.view(torch.int32), 0).view(torch.uint8).clone()
    dc.apply_chunk(encoding, payload, scratch, dtype=torch.float32)
    assert torch.equal(scratch.view(torch.int32)[mine], t.view(torch.int32)[mine])


def test_the_float32_digests_follow_from_the_bf16_changes():
    """Over chunks of a 2-D tensor and a 1-D tensor of odd length, a chunk holding the end of one and the start
    of the other."""
    base, target = {}, {}
    for seed, (name, shape) in enumerate([("w", (64, 96)), ("b", (333,))]):
        bf, tf = _bf16_step(torch.Size(shape).numel(), 0.05, seed=8 + seed)
        base[name], target[name] = bf.float().view(shape), tf.float().view(shape)
    specs = tuple(TensorSpec.of(k, v) for k, v in base.items())
    chunks = split_into_chunks(specs, 4096)
    base_digests = chunk_digests(chunks, base.values())
    target_digests = chunk_digests(chunks, target.values())
    flat_b = torch.cat([v.reshape(-1).view(torch.uint8) for v in base.values()])
    flat_t = torch.cat([v.reshape(-1).view(torch.uint8) for v in target.values()])
    start = 0
    for chunk in chunks:
        b, t = flat_b[start:start + chunk.nbytes], flat_t[start:start + chunk.nbytes]
        start += chunk.nbytes
        e = dc.encode_chunk(b, t, dtype=torch.float32)
        assert e.encoding in dc.BF16_ENCODINGS, e.encoding
        changes = dc.decode_chunk(e.encoding, e.payload, b, dtype=torch.float32)
        got = target_digest_from_base(base_digests[chunk.index], chunk_grid(chunk, specs), changes)
        assert got == target_digests[chunk.index], chunk.index


def _manifest(version: int, weights: dict) -> object:
    m = build_manifest("policy", version, "hf", weights, 64 << 10)
    return dataclasses.replace(m, chunk_digests=chunk_digests(m.chunks(), list(weights.values())),
                               digest_algorithm=ALGORITHM)


def test_a_float32_version_of_bf16_values_applies_through_the_delta_with_its_checks():
    """``encode_delta`` over a float32 version's chunk map picks the bf16 forms; ``apply_delta`` applies them in
    place against the float32 digests, and a payload that gives other bytes is caught and restored."""
    base, target = _bf16_step(512 * 256, 0.03, seed=10)
    v1 = {"w": base.float().view(512, 256).clone()}
    v2 = {"w": target.float().view(512, 256).clone()}
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    header, blob, stats = encode_delta(m1, [v1["w"]], m2, [v2["w"]])
    assert set(stats.encodings) == {dc.ULP_BF16}, stats.encodings
    plain_header, plain_blob, plain = encode_delta(
        m1, [v1["w"]], m2, [v2["w"]], lambda b, t, dtype: dc.encode_chunk(b, t, dtype=dtype, bf16_halves=False))
    assert set(plain.encodings) == {dc.ULP} and stats.payload_bytes < plain.payload_bytes / 1.2
    into = v1["w"].clone()
    result = apply_delta(m2, header, blob, [into])
    assert result.applied == list(range(len(m2.chunks()))) and not result.failed
    assert torch.equal(into, v2["w"])
    # a step flipped in chunk 0's payload: the chunk fails its target digest and holds the base again
    into = v1["w"].clone()
    bad = blob.clone()
    bad[header.offsets[0] + header.lengths[0] - 1] ^= 0x01
    result = apply_delta(m2, header, bad, [into])
    assert 0 in result.failed and 0 not in result.applied
    first = (64 << 10) // 4
    assert torch.equal(into.view(-1)[:first], v1["w"].view(-1)[:first])
