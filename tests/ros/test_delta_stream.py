"""A delta applied while it lands (``DeltaStream``), without processes: the delta form's chunks are copied into
its buffers one at a time, as a fetch lands them, and the stream is told of each. Each chunk of the version is
applied once its payload is whole; a bad payload in the middle leaves that chunk at its base bytes; a delta
abandoned part way is undone; a refused header writes nothing."""

import dataclasses
import functools

import pytest
import torch

from tensorhub_verl.errors import DeltaRefused
from tensorhub_verl.ros.client import delta_chunks
from tensorhub_verl.ros.client.delta_base import WORKER_NICENESS, BaseDigests
from tensorhub_verl.ros.client.delta_chunks import ChunkApply, encode_delta
from tensorhub_verl.ros.client.delta_stream import DeltaStream
from tensorhub_verl.ros.wire.delta_codec import encode_chunk
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER
from tensorhub_verl.ros.wire.integrity import ALGORITHM, chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest

from tests.ros.delta_roles import count_digested
from tests.waits import wait_until

CHUNK = 64 << 10
FORM_CHUNK = 4096


def _manifest(version, weights):
    m = build_manifest("policy", version, "hf", weights, CHUNK)
    return dataclasses.replace(m, chunk_digests=chunk_digests(m.chunks(), list(weights.values())),
                               digest_algorithm=ALGORITHM)


def _delta(candidates=None):
    """v1 and v2 of one bf16 matrix in 16 chunks (5% of its elements one unit in the last place apart), the
    delta form's tensors, its manifest in 4 KiB chunks, and v2's manifest."""
    g = torch.Generator().manual_seed(3)
    v1 = {"w": torch.randn(512, 1024, generator=g).to(torch.bfloat16)}
    v2 = {"w": v1["w"].clone()}
    words = v2["w"].view(-1).view(torch.int16)
    words[torch.randperm(words.numel(), generator=g)[: words.numel() // 20]] += 1
    m1, m2 = _manifest(1, v1), _manifest(2, v2)
    encode = encode_chunk if candidates is None else functools.partial(encode_chunk, candidates=candidates)
    header, blob, _ = encode_delta(m1, [v1["w"]], m2, [v2["w"]], encode)
    form = {HEADER: torch.frombuffer(bytearray(header.to_bytes()), dtype=torch.uint8), BLOB: blob}
    dm = build_manifest("policy", 2, "delta/hf@1", form, FORM_CHUNK)
    return v1, v2, m2, header, form, dm


def _land(dm, form, buffers, stream, chunk):
    """Copies one chunk of the delta form into its buffers and tells the stream, as a fetch does."""
    names = [s.name for s in dm.tensors]
    for s in dm.chunks()[chunk].segments:
        name = names[s.tensor]
        buffers[name][s.offset:s.offset + s.length] = form[name][s.offset:s.offset + s.length]
    stream.landed([chunk])


def _chunk_words(t, k):
    words = t.view(-1).view(torch.int16)
    return words[k * CHUNK // 2:(k + 1) * CHUNK // 2]


def _stream(m2, header, form, dm, into):
    buffers = {name: torch.zeros_like(t) for name, t in form.items()}
    return DeltaStream(dm, buffers, lambda raw: ChunkApply(m2, header, [into["w"]]), 30.0), buffers


def test_chunks_are_applied_while_later_ones_are_still_to_land():
    v1, v2, m2, header, form, dm = _delta()
    into = {"w": v1["w"].clone()}
    stream, buffers = _stream(m2, header, form, dm, into)
    count = len(dm.chunks())
    assert count >= 8
    half = count // 2
    for d in range(half):
        _land(dm, form, buffers, stream, d)
    first = header.first_chunk
    # The chunks whose payload lies in the landed half are applied before the rest of the delta lands.
    wait_until(lambda: torch.equal(_chunk_words(into["w"], first), _chunk_words(v2["w"], first)), 10.0,
               "the first chunk applied while half of the delta is still to land")
    last = len(m2.chunks()) - 1
    assert torch.equal(_chunk_words(into["w"], last), _chunk_words(v1["w"], last))  # its payload has not landed
    for d in range(half, count):
        _land(dm, form, buffers, stream, d)
    result = stream.close()
    assert not result.failed and len(result.applied) == len(m2.chunks())
    assert torch.equal(into["w"].view(torch.int16), v2["w"].view(torch.int16))


@pytest.mark.parametrize("candidates", [("xor",), None])
def test_a_bad_payload_in_the_middle_leaves_that_chunk_at_its_base_bytes_and_the_rest_at_the_version(candidates):
    v1, v2, m2, header, form, dm = _delta(candidates)
    middle = len(m2.chunks()) // 2
    at = header.offsets[middle] + header.lengths[middle] // 2
    form[BLOB][at] ^= 0x5A  # garbled after its digests were taken: decodes to other words, or not at all
    into = {"w": v1["w"].clone()}
    stream, buffers = _stream(m2, header, form, dm, into)
    for d in reversed(range(len(dm.chunks()))):  # landing order is the fetch's, not the blob's
        _land(dm, form, buffers, stream, d)
    result = stream.close()
    assert result.failed == [middle] and result.bad_target == [middle]
    for k in range(len(m2.chunks())):
        want = v1 if k == middle else v2
        assert torch.equal(_chunk_words(into["w"], k), _chunk_words(want["w"], k)), k


def test_a_delta_abandoned_part_way_puts_back_every_chunk_it_applied():
    v1, v2, m2, header, form, dm = _delta()
    into = {"w": v1["w"].clone()}
    stream, buffers = _stream(m2, header, form, dm, into)
    for d in range(len(dm.chunks()) // 2):
        _land(dm, form, buffers, stream, d)
    first = header.first_chunk
    wait_until(lambda: torch.equal(_chunk_words(into["w"], first), _chunk_words(v2["w"], first)), 10.0,
               "a chunk applied")
    stream.abandon()  # the delta's read failed: the reader goes on to read v2 in full from v1
    assert torch.equal(into["w"].view(torch.int16), v1["w"].view(torch.int16))


def test_a_refused_header_writes_nothing():
    v1, _, m2, header, form, dm = _delta()
    into = {"w": v1["w"].clone()}
    buffers = {name: torch.zeros_like(t) for name, t in form.items()}

    def refuse(raw):
        raise DeltaRefused("the delta's base is v0, not v1")

    stream = DeltaStream(dm, buffers, refuse, 30.0)
    for d in range(len(dm.chunks())):
        _land(dm, form, buffers, stream, d)
    assert stream.close() is None and "not v1" in str(stream.refused)
    assert torch.equal(into["w"].view(torch.int16), v1["w"].view(torch.int16))


def _ahead(m2, into):
    """Base digests started as a read starts, waited for until the worker has digested every chunk."""
    chunks = len(m2.chunks())
    base = BaseDigests(m2, [into["w"]], range(chunks), 30.0).start()
    wait_until(lambda: base.ahead == chunks, 30.0, "every base chunk digested while the delta is in flight")
    return base


def test_base_chunks_digested_while_the_delta_is_in_flight_leave_no_full_pass_on_landing(monkeypatch):
    v1, v2, m2, header, form, dm = _delta()
    seen = count_digested(monkeypatch)
    for ahead in (False, True):
        seen.clear()
        into = {"w": v1["w"].clone()}
        base = _ahead(m2, into) if ahead else None
        buffers = {name: torch.zeros_like(t) for name, t in form.items()}
        stream = DeltaStream(dm, buffers, lambda raw: ChunkApply(m2, header, [into["w"]], base), 30.0)
        for d in range(len(dm.chunks())):
            _land(dm, form, buffers, stream, d)
        result = stream.close()
        if base is not None:
            base.stop()
        assert not result.failed and torch.equal(into["w"].view(torch.int16), v2["w"].view(torch.int16))
        assert sum(seen) == m2.nbytes  # each chunk read in full once: ahead, or on landing
        # on landing: a full pass per chunk (its base) without the worker, none with it (the target checked
        # from the base digest and the changed words)
        assert result.landed_digests == (0 if ahead else len(m2.chunks()))


def test_a_base_that_differs_is_caught_before_a_byte_of_its_chunk_is_written(monkeypatch):
    v1, v2, m2, header, form, dm = _delta()
    into = {"w": v1["w"].clone()}
    rotted = 3
    _chunk_words(into["w"], rotted)[5] += 7  # the reader's copy of v1 rots in a chunk the step changes
    before = _chunk_words(into["w"], rotted).clone()
    writes = []
    write = delta_chunks.write_changes

    def recording(changes, data):
        writes.append(data.data_ptr())
        write(changes, data)

    monkeypatch.setattr(delta_chunks, "write_changes", recording)
    base = _ahead(m2, into)
    buffers = {name: torch.zeros_like(t) for name, t in form.items()}
    stream = DeltaStream(dm, buffers, lambda raw: ChunkApply(m2, header, [into["w"]], base), 30.0)
    for d in range(len(dm.chunks())):
        _land(dm, form, buffers, stream, d)
    result = stream.close()
    base.stop()
    assert result.bad_base == [rotted] and not result.bad_target
    assert _chunk_words(into["w"], rotted).data_ptr() not in writes  # never written, not written and restored
    assert torch.equal(_chunk_words(into["w"], rotted), before)
    assert len(writes) == len(m2.chunks()) - 1


def test_the_base_worker_runs_below_the_reader_s_priority():
    """The base pass is off the critical path: the fetch and the apply of landed chunks get the CPU first."""
    import os

    v1, _, m2, _, _, _ = _delta()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    base = _ahead(m2, {"w": v1["w"].clone()})
    base.stop()
    assert base.worker_niceness == min(19, own + WORKER_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the reader's own threads keep theirs


def test_an_applier_that_catches_up_with_the_worker_takes_that_chunk_and_the_worker_turns_round(monkeypatch):
    """Once the payloads overtake the base pass, the applier does not wait for the worker's chunk (the worker runs
    at a lower priority): it takes that chunk, and the worker goes on from the last chunk backwards."""
    import threading

    from tensorhub_verl.ros.client import delta_base

    v1, _, m2, _, _, _ = _delta()
    chunks = len(m2.chunks())
    order, inside, release = [], threading.Event(), threading.Event()
    digest = delta_base.chunk_digest

    def slow_at_two(flats, rows, chunk):
        order.append(chunk.index)
        if chunk.index == 2:
            inside.set()
            assert release.wait(30.0)
        return digest(flats, rows, chunk)

    monkeypatch.setattr(delta_base, "chunk_digest", slow_at_two)
    base = BaseDigests(m2, [v1["w"].clone()], range(chunks), 30.0).start()
    assert inside.wait(30.0)
    assert base.claim(0) is not None and base.claim(1) is not None  # digested ahead
    assert base.claim(2) is None  # the worker is on it: the applier takes it over without waiting
    release.set()
    wait_until(lambda: base.ahead == chunks - 1, 30.0, "the worker digests the rest")
    base.stop()
    assert order == [0, 1, 2, *range(chunks - 1, 2, -1)]  # turned round after chunk 2
    assert all(base.claim(i) is not None for i in range(3, chunks))
