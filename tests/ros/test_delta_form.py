"""The delta form without processes: names, the header's checks, and encode/apply over a chunk map."""

import dataclasses
import functools

import pytest
import torch

from tensorhub_verl.errors import DeltaRefused
from tensorhub_verl.ros.client.delta_chunks import apply_delta, chunk_dtype, encode_delta
from tensorhub_verl.ros.wire.delta_codec import encode_chunk
from tensorhub_verl.ros.wire.delta_form import DeltaHeader, check_header, delta_layout, delta_part, parse_delta_layout
from tensorhub_verl.ros.wire.integrity import ALGORITHM, chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest

from tests.ros.delta_roles import CHUNK, versions


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
