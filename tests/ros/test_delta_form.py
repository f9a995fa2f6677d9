"""The delta form without processes: names, the header's checks, and encode/apply over a chunk map."""

import dataclasses
import functools

import pytest
import torch

from tensorhub_verl.errors import DeltaRefused
from tensorhub_verl.ros.client import delta_chunks
from tensorhub_verl.ros.client.delta_base import BaseDigests, disjoint
from tensorhub_verl.ros.client.delta_chunks import ChunkApply, apply_delta, chunk_dtype, encode_delta
from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.delta_codec import encode_chunk
from tensorhub_verl.ros.wire.delta_form import DeltaHeader, check_header, delta_layout, delta_part, parse_delta_layout
from tensorhub_verl.ros.wire.integrity import ALGORITHM, chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest

from tests.ros.delta_roles import CHUNK, count_digested, versions
from tests.waits import wait_until


def _manifest(version, weights):
    m = build_manifest("policy", version, "hf", weights, CHUNK)
    return dataclasses.replace(m, chunk_digests=chunk_digests(m.chunks(), list(weights.values())),
                               digest_algorithm=ALGORITHM)


def _pair():
    v1, v2 = versions(2)
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    header, blob, stats = encode_delta(m1, list(v1.values()), m2, list(v2.values()))
    return v1, v2, m1, m2, header, blob, stats


def test_delta_layout_names_round_trip_and_do_not_chain():
    assert delta_layout("vllm/qwen2/tp2/rank0", 7) == "delta/vllm/qwen2/tp2/rank0@7"
    assert parse_delta_layout("delta/vllm/qwen2/tp2/rank0@7") == ("vllm/qwen2/tp2/rank0", 7)
    assert parse_delta_layout("hf") is None
    with pytest.raises(DeltaRefused, match="do not chain"):
        delta_layout("delta/hf@1", 2)
    assert delta_layout("hf", 7, (1, 4)) == "delta/hf@7:1of4"
    assert parse_delta_layout("delta/hf@7:1of4") == ("hf", 7) and delta_part("delta/hf@7:1of4") == (1, 4)
    assert delta_part("delta/hf@7") is None
    for bad in ("delta/hf", "delta/@3", "delta/hf@x", "delta/delta/hf@1@2", "delta/hf@1:4of4", "delta/hf@1:1of"):
        with pytest.raises(DeltaRefused):
            parse_delta_layout(bad)


def test_a_header_round_trips_and_passes_its_checks():
    _, _, m1, m2, header, blob, stats = _pair()
    again = DeltaHeader.from_bytes(header.to_bytes())
    assert again == header
    check_header(again, m2, 1, blob.numel(), m1)
    assert 0 < stats.changed_elements < stats.elements and stats.encodings["same"] >= len(m2.chunks()) - 3


@pytest.mark.parametrize("change, match", [
    (lambda h: {"base_version": 0}, "declares base version 0, the reader holds 1"),
    (lambda h: {"target_version": 3}, "claims to be of"),
    (lambda h: {"target_digests": ["0" * 16] + h.target_digests[1:]}, "target digest of chunk 0"),
    (lambda h: {"base_digests": ["0" * 16] + h.base_digests[1:]}, "base digests are not"),
    (lambda h: {"lengths": h.lengths[:-1] + [h.lengths[-1] + 1 << 30]}, "inside the blob"),
    (lambda h: {"encodings": h.encodings[:-1]}, "describes chunks"),
    (lambda h: {"first_chunk": 1}, "describes chunks"),
    (lambda h: {"offsets": h.offsets[:-1]}, "columns differ"),
    (lambda h: {"layout_digest": "0" * 32}, "another chunk map"),
])
def test_a_header_that_does_not_describe_the_base_and_the_version_is_refused(change, match):
    _, _, m1, m2, header, blob, _ = _pair()
    wrong = header.model_copy(update=change(header))
    with pytest.raises(DeltaRefused, match=match):
        check_header(wrong, m2, 1, blob.numel(), m1)


def test_a_malformed_header_is_refused_with_the_reason():
    with pytest.raises(DeltaRefused, match="malformed"):
        DeltaHeader.from_bytes(b'{"format": "tensorhub-delta/1", "model": "p"}')
    with pytest.raises(DeltaRefused, match="malformed"):
        DeltaHeader.from_bytes(b"\x80\x04pickle")


def test_apply_turns_the_base_into_the_target_and_reports_chunks_that_fail_a_check():
    v1, v2, _, m2, header, blob, _ = _pair()
    into = [t.clone() for t in v1.values()]
    result = apply_delta(m2, header, blob, into)
    assert not result.failed and all(torch.equal(a, b) for a, b in zip(into, v2.values()))

    into = [t.clone() for t in v1.values()]
    into[0][0, 0] += 1  # a rotted base chunk: left as it is, reported
    bad = blob.clone()
    changed = [i for i, e in enumerate(header.encodings) if e != "same"]
    bad[header.offsets[changed[0]]] ^= 1  # a payload that builds other bytes
    result = apply_delta(m2, header, bad, into)
    assert result.bad_base == [0] and result.bad_target == [changed[0]]
    assert torch.equal(into[0][0, 1:], v1["embed.weight"][0, 1:])


def test_chunks_of_one_dtype_are_diffed_in_it_and_mixed_chunks_as_bytes():
    _, _, _, m2, *_ = _pair()
    kinds = {str(chunk_dtype(m2, c)) for c in m2.chunks()}
    assert "torch.bfloat16" in kinds and "torch.uint8" in kinds


def test_a_chunk_whose_result_is_not_the_version_is_restored_to_its_base_bytes():
    v1, v2 = versions(2)
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    wrong = {n: t.clone() for n, t in v1.items()}
    wrong["layers.0.mlp.weight"].view(-1)[::4096] += 1  # a publisher whose staged v1 was not v1
    header, blob, _ = encode_delta(m1, list(wrong.values()), m2, list(v2.values()),
                                   functools.partial(encode_chunk, candidates=("xor",)))
    into = [t.clone() for t in v1.values()]
    result = apply_delta(m2, header, blob, into)
    mlp = list(v1).index("layers.0.mlp.weight")
    assert len(result.bad_target) == 8 and not result.bad_base
    assert torch.equal(into[mlp], v1["layers.0.mlp.weight"])  # every failed chunk holds its base bytes again
    others = [i for i in range(len(into)) if i != mlp]
    assert all(torch.equal(into[i], list(v2.values())[i]) for i in others)


def _sparse_pair(percent: float = 1.0):
    """v1 and v2 where ``percent`` of one matrix's bf16 elements move by one unit in the last place (as small
    optimizer steps move them), and a second matrix does not change (its chunks are SAME)."""
    g = torch.Generator().manual_seed(7)
    v1 = {"w": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
          "u": torch.randn(128, 1024, generator=g).to(torch.bfloat16)}
    v2 = {n: t.clone() for n, t in v1.items()}
    words = v2["w"].view(-1).view(torch.int16)
    moved = torch.randperm(words.numel(), generator=g)[: int(words.numel() * percent / 100)]
    words[moved] += 1
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    header, blob, _ = encode_delta(m1, list(v1.values()), m2, list(v2.values()))
    return v1, v2, m2, header, blob, moved


def test_apply_reads_each_chunk_in_full_once_when_few_elements_change(monkeypatch):
    v1, v2, m2, header, blob, _ = _sparse_pair(1.0)
    assert "same" in header.encodings and any(e not in ("same", "dense") for e in header.encodings)
    seen = count_digested(monkeypatch)
    into = [t.clone() for t in v1.values()]
    result = apply_delta(m2, header, blob, into)
    assert not result.failed and all(torch.equal(a, b) for a, b in zip(into, v2.values()))
    assert sum(seen) == m2.nbytes  # one full pass: changed and SAME chunks alike


def test_a_dense_change_also_reads_each_chunk_once(monkeypatch):
    v1, v2, m2, header, blob, _ = _sparse_pair(20.0)
    seen = count_digested(monkeypatch)
    into = [t.clone() for t in v1.values()]
    result = apply_delta(m2, header, blob, into)
    assert not result.failed and all(torch.equal(a, b) for a, b in zip(into, v2.values()))
    assert sum(seen) == m2.nbytes


@pytest.mark.parametrize("where", ["unchanged word", "changed word"])
def test_a_rotted_base_in_a_changed_chunk_is_restored_and_reported_as_bad_base(where):
    v1, v2, m2, header, blob, moved = _sparse_pair(1.0)
    into = [t.clone() for t in v1.values()]
    flat = into[0].view(-1).view(torch.int16)
    at = int(moved[0]) if where == "changed word" else \
        next(i for i in range(flat.numel()) if not bool((moved == i).any()))
    flat[at] += 3  # the reader's copy of v1 rots in a chunk that the step changes
    rotted = [t.clone() for t in into]
    result = apply_delta(m2, header, blob, into)
    chunk = at * 2 // CHUNK
    assert result.bad_base == [chunk] and not result.bad_target
    assert "did not hold base version 1" in result.reasons[-1]
    start, end = chunk * CHUNK // 2, (chunk + 1) * CHUNK // 2
    assert torch.equal(flat[start:end], rotted[0].view(-1).view(torch.int16)[start:end])  # as it was
    others = torch.ones(flat.numel(), dtype=torch.bool)
    others[start:end] = False
    assert torch.equal(flat[others], v2["w"].view(-1).view(torch.int16)[others])  # the rest is v2


def test_a_write_that_lands_in_the_wrong_place_is_caught_and_its_words_restored(monkeypatch):
    """A chunk whose base was not digested ahead is digested in full after its write: a stray word is caught."""
    v1, v2, m2, header, blob, _ = _sparse_pair(1.0)
    write = delta_chunks.write_changes
    strays = []

    def stray(changes, data):  # writes the changes, and one word beside the last of them
        write(changes, data)
        if not strays:
            at = int(changes.positions[-1]) * 2 + 2
            at = at if at < data.numel() else 0
            data[at] ^= 0x40
            strays.append(at)

    monkeypatch.setattr(delta_chunks, "write_changes", stray)
    into = [t.clone() for t in v1.values()]
    result = apply_delta(m2, header, blob, into)
    first = next(i for i, e in enumerate(header.encodings) if e != "same")
    assert result.bad_base == [first] and not result.bad_target and len(result.failed) == 1
    start, end = first * CHUNK, (first + 1) * CHUNK
    got = into[0].view(-1).view(torch.uint8)[start:end].clone()
    base = v1["w"].view(-1).view(torch.uint8)[start:end]
    got[strays[0]] ^= 0x40  # every word the delta wrote holds its base value again; the stray one is re-read
    assert torch.equal(got, base)



def _applied_ahead(m2, header, blob, into):
    """Applies every chunk with its base digested ahead (a worker started as the read starts, waited for)."""
    chunks = len(m2.chunks())
    base = BaseDigests(m2, into, range(chunks), 30.0).start()
    wait_until(lambda: base.ahead == chunks, 30.0, "every base chunk digested ahead")
    applier = ChunkApply(m2, header, into, base)
    applier.apply(blob, range(chunks))
    return applier.finish()


def test_a_write_that_does_not_put_the_decoded_words_in_place_is_caught_from_the_words_read_back(monkeypatch):
    """With the base digested ahead, the target check reads the changed words back after the write: a write
    that puts other words there fails it without a full pass over the written chunk."""
    v1, v2, m2, header, blob, _ = _sparse_pair(1.0)
    write = delta_chunks.write_changes
    wrong = []

    def flipped(changes, data):  # writes the changes, then flips a bit of the last changed word
        write(changes, data)
        if not wrong:
            at = int(changes.positions[-1]) * 2
            data[at] ^= 0x40
            wrong.append(at)

    monkeypatch.setattr(delta_chunks, "write_changes", flipped)
    seen = count_digested(monkeypatch)
    into = [t.clone() for t in v1.values()]
    result = _applied_ahead(m2, header, blob, into)
    first = next(i for i, e in enumerate(header.encodings) if e != "same")
    assert result.bad_target == [first] and not result.bad_base and len(result.failed) == 1
    assert sum(seen) == m2.nbytes and result.landed_digests == 0  # the base pass alone
    start, end = first * CHUNK, (first + 1) * CHUNK
    assert torch.equal(into[0].view(-1).view(torch.uint8)[start:end], v1["w"].view(-1).view(torch.uint8)[start:end])


def test_buffers_that_alias_are_checked_in_full_after_each_write():
    """Two tensors mapped onto the same bytes (a mapping bug): writing a's chunks changes b's bytes after b's
    base was digested ahead. The base digest plus b's own change would then vouch for bytes that hold a's change
    too; with buffers that alias, each written chunk is digested in full instead, and b's chunks fail."""
    g = torch.Generator().manual_seed(5)
    v1 = {"a": torch.randn(512, 1024, generator=g).to(torch.bfloat16)}
    v1["b"] = v1["a"].clone()
    v2 = {n: t.clone() for n, t in v1.items()}
    v2["a"].view(-1).view(torch.int16)[::97] += 1
    v2["b"].view(-1).view(torch.int16)[1::89] += 1
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    header, blob, _ = encode_delta(m1, list(v1.values()), m2, list(v2.values()))
    assert disjoint([t.view(-1) for t in v1.values()])
    shared = v1["a"].clone()
    into = [shared, shared.view(512, 1024)]  # b maps onto a's bytes
    assert not disjoint([t.view(-1) for t in into])
    b_chunks = [c.index for c in m2.chunks() if c.segments[0].tensor == 1]
    assert len(b_chunks) >= 2 and all(len(c.segments) == 1 for c in m2.chunks())
    result = _applied_ahead(m2, header, blob, into)
    assert result.landed_digests >= len(m2.chunks())  # every written chunk digested in full after its write
    assert result.bad_base == b_chunks  # b's bytes changed under it: restored, re-read in full


@pytest.mark.parametrize("device", [
    "cpu-torch",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
])
def test_device_buffers_are_checked_from_the_base_digest_with_torch_ops(monkeypatch, device):
    """The device path (torch ops where the bytes lie): on a GPU, or on the CPU with numpy switched off. A good
    delta applies with no full pass after landing; a rotted base is left unwritten; a wrong payload is caught."""
    from tensorhub_verl.ros.wire import delta_codec

    if device == "cpu-torch":
        for module in (delta_codec, lindigest):
            monkeypatch.setattr(module, "HOST_NUMPY", False)
    dev = "cuda" if device == "cuda" else "cpu"
    v1, v2, m2, header, blob, moved = _sparse_pair(1.0)
    into = [t.to(dev) for t in v1.values()]
    flat = into[0].view(-1).view(torch.int16)
    flat[int(moved[0])] += 3  # rots a changed chunk's base
    rotted = int(moved[0]) * 2 // CHUNK
    bad = blob.clone()
    wrong = next(k for k, e in enumerate(header.encodings) if e not in ("same", "dense") and k != rotted)
    bad[header.offsets[wrong] + header.lengths[wrong] - 1] ^= 0x01  # a payload that builds other words
    result = _applied_ahead(m2, header, bad.to(dev), into)
    assert result.bad_base == [rotted] and result.landed_digests == 0
    assert result.bad_target == [wrong]
    good = [c for c in range(len(m2.chunks())) if c not in result.failed]
    for c in good:
        start, end = c * CHUNK, (c + 1) * CHUNK
        got = torch.cat([t.reshape(-1).view(torch.uint8) for t in into]).cpu()[start:end]
        want = torch.cat([t.reshape(-1).view(torch.uint8) for t in v2.values()])[start:end]
        assert torch.equal(got, want), c
