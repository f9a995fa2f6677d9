import pytest
import torch

from tensorhub_verl.errors import ConfigError, ManifestMismatch
from tensorhub_verl.ros.wire.manifest import (
    TensorSpec, build_manifest, check_buffers, check_same_tensors, content_fingerprint, split_into_chunks,
)
from tensorhub_verl.ros.wire.topology import Location


def specs(*sizes):
    return tuple(TensorSpec(f"t{i}", (n,), "uint8", n) for i, n in enumerate(sizes))


def test_tiny_tensors_share_a_chunk_and_big_ones_span_chunks():
    chunks = split_into_chunks(specs(10, 20, 100, 5), chunk_bytes=64)
    assert [c.nbytes for c in chunks] == [64, 64, 7]
    assert [(s.tensor, s.offset, s.length) for s in chunks[0].segments] == [(0, 0, 10), (1, 0, 20), (2, 0, 34)]
    assert [(s.tensor, s.offset, s.length) for s in chunks[1].segments] == [(2, 34, 64)]
    assert [(s.tensor, s.offset, s.length) for s in chunks[2].segments] == [(2, 98, 2), (3, 0, 5)]


def test_chunks_cover_every_byte_once():
    sizes = (1, 4095, 4096, 4097, 70000, 3)
    covered = {i: 0 for i in range(len(sizes))}
    for chunk in split_into_chunks(specs(*sizes), 4096):
        assert chunk.nbytes <= 4096
        for seg in chunk.segments:
            assert seg.offset == covered[seg.tensor]
            covered[seg.tensor] += seg.length
    assert tuple(covered.values()) == sizes


def test_check_buffers_names_the_first_differing_tensor():
    m = build_manifest("m", 1, "hf", {"a": torch.zeros(2, 3), "b": torch.zeros(4)})
    check_buffers(m, {"a": torch.empty(2, 3), "b": torch.empty(4)})
    with pytest.raises(ManifestMismatch, match="'b'.*\\[5\\]") as e:
        check_buffers(m, {"a": torch.empty(2, 3), "b": torch.empty(5)})
    assert e.value.tensor == "b"
    with pytest.raises(ManifestMismatch, match="'a'.*float64"):
        check_buffers(m, {"a": torch.empty(2, 3, dtype=torch.float64), "b": torch.empty(4)})
    with pytest.raises(ManifestMismatch, match="'b' is missing"):
        check_buffers(m, {"a": torch.empty(2, 3)})
    with pytest.raises(ManifestMismatch, match="'c' is not in version"):
        check_buffers(m, {"a": torch.empty(2, 3), "b": torch.empty(4), "c": torch.empty(1)})


def test_a_second_publish_with_other_bytes_is_refused():
    a = build_manifest("m", 1, "hf", {"w": torch.arange(100000.0)})
    b = build_manifest("m", 1, "hf", {"w": torch.arange(100000.0) + 1})
    check_same_tensors(a, build_manifest("m", 1, "hf", {"w": torch.arange(100000.0)}))
    with pytest.raises(ManifestMismatch, match="different bytes"):
        check_same_tensors(a, b)


def test_fingerprint_modes():
    t = {"w": torch.randn(1 << 16)}
    assert content_fingerprint(t) == content_fingerprint({"w": t["w"].clone()})
    assert content_fingerprint(t, "full") != content_fingerprint({"w": t["w"] + 1}, "full")
    assert content_fingerprint(t, "none") == ""


def test_allocate_matches_the_manifest():
    m = build_manifest("m", 1, "hf", {"a": torch.zeros(2, 3, dtype=torch.bfloat16), "n": torch.zeros(0)})
    check_buffers(m, m.allocate())


def test_location_parsing():
    assert Location.parse("dc=dc1,rack=r2,node=n3") == Location("dc1", "r2", "n3")
    assert Location.parse({"dc": "x"}) == Location("x", "r0", "n0")
    assert Location.from_env({"TENSORHUB_DC": "dc9", "TENSORHUB_NODE": "h"}) == Location("dc9", "r0", "h")
    with pytest.raises(ConfigError, match="unknown location label"):
        Location.parse({"zone": "a"})
    with pytest.raises(ConfigError, match="key=value"):
        Location.parse("dc0")
