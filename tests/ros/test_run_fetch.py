"""Run leases end to end: real hub, real holder processes, both data planes; every chunk's digest checked."""

import pytest

from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.fetcher import ChunkFetcher, FetchSettings
from tensorhub_verl.ros.planes.base import ReadState
from tensorhub_verl.ros.planes import tcp_wire as wire
from tensorhub_verl.ros.planes.nixl import NixlPlane
from tensorhub_verl.ros.planes.tcp import TcpPlane

from tests.ros.roles import digest, holder, tampering_holder

CHUNK = 64 << 10
SIZE_MB = 4.0
RUNS = dict(max_run_chunks=16, run_target_s=1.0)
"""Runs up to 16 chunks: on loopback a second of throughput is thousands of 64 KiB chunks."""
LONG_RUNS = dict(max_run_chunks=16, run_target_s=10.0)
"""Runs of 16 chunks once two reads have landed (a throughput to go by): 1 MiB in 10 s is slower than any host."""


def leases(stats) -> int:
    """Leases the hub granted a fetch: each is one chunk, or one run of chunks."""
    return sum(granted for _, _, _, granted in stats.exchange_log)


@pytest.mark.parametrize("plane", ["auto", "tcp"])  # auto: NIXL here
def test_a_fetch_in_runs_moves_the_same_bytes_in_far_fewer_leases(hub, roles, plane):
    published = roles(holder, hub.url, "trainer", 4, SIZE_MB, CHUNK, 1, None, plane).result(120)
    by_chunk_config = ClientConfig.from_fields(window=8, transport=plane, max_run_chunks=1)
    with Client(hub.url, "by-chunk", config=by_chunk_config) as by_chunk:
        single = by_chunk.fetch("policy", 1, hold=False)
    with Client(hub.url, "by-run", config=ClientConfig.from_fields(window=8, transport=plane, **LONG_RUNS)) as by_run:
        stats = by_run.fetch("policy", 1, hold=False)
    assert digest(stats.buffers) == digest(single.buffers) == published["digest"]
    assert stats.bytes == single.bytes and stats.failed_reads == 0 and stats.chunks > 60
    # Counted, not timed: a lease per chunk, at most a window (8) of them per exchange; by runs, the first
    # window or so of single chunks and then runs of 16.
    assert leases(single) == single.chunks and single.exchanges >= single.chunks / 8
    assert leases(stats) * 3 <= stats.chunks, (leases(stats), stats.chunks)


@pytest.mark.parametrize("plane", ["auto", "tcp"])
def test_a_run_from_a_holder_that_changed_its_bytes_is_read_around(hub, roles, plane):
    good = roles(holder, hub.url, "good", 9, SIZE_MB, CHUNK, 1, None, plane).result(120)
    roles(tampering_holder, hub.url, "tamperer", 9, SIZE_MB, CHUNK, 1, plane).result(120)
    with Client(hub.url, "reader", config=ClientConfig.from_fields(window=8, transport=plane, **RUNS)) as reader:
        stats = reader.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == good["digest"]  # never a mix of both holders' bytes
        assert set(stats.sources) == {"good"}
        assert stats.corrupt_reads >= 1  # the tamperer's bytes were read, caught, and read again elsewhere
        holders = {h["holder"]: h for h in reader.status()["models"]["policy"][0]["holders"]}
        # A report of the copy's own job quarantines it, never the last good copy (test_integrity.py).
        assert holders["tamperer"]["quarantined"] and not holders["good"]["quarantined"]


class _Counted:
    """Counts the reads a fetch posts on the plane; with ``misbehave``, spoils the first read of three chunks or
    more once all of its bytes landed: "corrupt" flips one byte in the middle of them (a holder that sent one
    chunk wrong), "fail" reports the read failed with only the first half of its bytes in (a connection that
    broke midway). Until then the spoiled read reports no progress, so nothing of it is checked early."""

    def __init__(self, *args, misbehave: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.reads, self.misbehave, self.target, self.copies = 0, misbehave, None, []

    def _start_read(self, peer, copies, grant, wake):
        handle = super()._start_read(peer, copies, grant, wake)
        self.reads += 1
        if self.misbehave and self.target is None and sum(c.length for c in copies) >= 3 * CHUNK:
            self.target, self.copies = handle, copies
        return handle

    def landed_bytes(self, handle):
        if handle is not self.target:
            return super().landed_bytes(handle)
        half = sum(c.length for c in self.copies) // 2
        return half if self.misbehave == "fail" and super().poll(handle) is ReadState.DONE else 0

    def poll(self, handle):
        state = super().poll(handle)
        if handle is not self.target or state is not ReadState.DONE:
            return state
        if self.misbehave == "fail":
            return ReadState.FAILED
        if self.copies:  # once: the byte at the middle of the read's bytes, in copy order
            at = sum(c.length for c in self.copies) // 2
            for c in self.copies:
                if at < c.length:
                    byte = wire.memory(c.local_addr + at, 1)
                    byte[0] ^= 0xFF
                    break
                at -= c.length
            self.copies = []
        return state


class _CountedTcp(_Counted, TcpPlane):
    pass


class _CountedNixl(_Counted, NixlPlane):
    pass


def _plane(kind: str, misbehave: str = ""):
    if kind == "tcp":
        return _CountedTcp(f"counted-{misbehave}-reader", "127.0.0.1", misbehave=misbehave)
    return _CountedNixl(f"counted-{misbehave}-reader", misbehave=misbehave)


def _spied(client):
    """The client's exchanges, recorded: (assignments by lease, failures reported)."""
    assigned, failures = {}, []
    exchange = client._exchange

    def spying(key, **kw):
        failures.extend(kw["failed"])
        reply = exchange(key, **kw)
        assigned.update((a.lease, a) for a in reply.assignments)
        return reply

    client._exchange = spying
    return assigned, failures


@pytest.mark.parametrize("kind", ["nixl", "tcp"])
def test_a_run_is_posted_as_one_plane_read_of_its_merged_ranges(hub, roles, kind):
    published = roles(holder, hub.url, "trainer", 6, SIZE_MB, CHUNK, 1, None, kind).result(120)
    plane = _plane(kind)
    try:
        with Client(hub.url, "reader", plane=plane, config=ClientConfig.from_fields(window=8, **LONG_RUNS)) as reader:
            stats = reader.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == published["digest"] and stats.failed_reads == 0
        # Counted on the plane: one read per lease, not one per chunk (runs of 16 after the first reads).
        assert plane.reads == leases(stats) and plane.reads * 3 <= stats.chunks, (plane.reads, stats.chunks)
    finally:
        plane.close()


@pytest.mark.parametrize("kind", ["nixl", "tcp"])
def test_a_chunk_that_fails_its_digest_inside_a_run_is_read_again_and_only_it(hub, roles, kind):
    published = roles(holder, hub.url, "a", 7, SIZE_MB, CHUNK, 1, None, kind).result(120)
    roles(holder, hub.url, "b", 7, SIZE_MB, CHUNK, 1, None, kind).result(120)
    plane = _plane(kind, "corrupt")
    client = Client(hub.url, "reader", plane=plane, config=ClientConfig.from_fields(window=8, **LONG_RUNS))
    assigned, failures = _spied(client)
    try:
        stats = client.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == published["digest"]
        assert plane.target is not None and stats.corrupt_reads == 1
        (failure,) = failures
        run = assigned[failure.lease]
        missing = sorted(set(range(run.chunk, run.chunk + run.count)) - set(failure.landed))
        # Exactly the spoiled chunk is read again: the run's chunks on both sides of it landed, checked.
        assert failure.corrupt and len(missing) == 1 and run.chunk < missing[0] < run.chunk + run.count - 1
        assert stats.bytes == sum(c.nbytes for c in client.manifest("policy", 1).chunks())  # each booked once
    finally:
        client.close()
        plane.close()


@pytest.mark.parametrize("kind", ["nixl", "tcp"])
def test_a_run_that_fails_midway_books_exactly_the_chunks_that_landed_intact(hub, roles, kind):
    """Over TCP, the chunks wholly inside the bytes the read reports landed; over NIXL, which cannot say what a
    failed transfer landed, the chunks whose digests check out."""
    published = roles(holder, hub.url, "trainer", 5, SIZE_MB, CHUNK, 1, None, kind).result(120)
    plane = _plane(kind, "fail")
    client = Client(hub.url, "reader", plane=plane, config=ClientConfig.from_fields(window=8, **LONG_RUNS))
    assigned, failures = _spied(client)
    try:
        stats = client.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == published["digest"]
        assert plane.target is not None and stats.failed_reads == 1
        (failure,) = failures
        run = assigned[failure.lease]
        chunks = client.manifest("policy", 1).chunks()[run.chunk:run.chunk + run.count]
        half = sum(c.nbytes for c in chunks) // 2
        if kind == "tcp":
            ends = [sum(c.nbytes for c in chunks[:k + 1]) for k in range(len(chunks))]
            expected = [c.index for c, end in zip(chunks, ends) if end <= half]
        else:
            expected = [c.index for c in chunks]
        assert failure.landed == expected and 0 < len(expected) and not failure.corrupt
        assert stats.bytes == sum(c.nbytes for c in client.manifest("policy", 1).chunks())  # each booked once
    finally:
        client.close()
        plane.close()


def test_runs_are_sized_to_the_measured_throughput():
    """A run takes about run_target_s of the link: 1 at 200 Mbit/s with 1 MiB chunks, the cap at 25 GB/s."""
    from tensorhub_verl.ros.wire.manifest import Chunk, Segment

    chunks = tuple(Chunk(i, (Segment(0, i << 20, 1 << 20),)) for i in range(1024))
    sized = {}
    for name, bytes_per_s in (("lab", 25e6), ("rdma", 25e9)):
        settings = FetchSettings(8, 30.0, 1e9, 0.001, run_target_s=0.05, max_run_chunks=1024)
        fetcher = ChunkFetcher(None, chunks, [], None, settings, None)
        for i in range(64):
            fetcher._throughput.add(i * (1 << 20) / bytes_per_s, 1 << 20)
        sized[name] = fetcher._run_chunks()
    assert sized["lab"] == 1 and 1000 <= sized["rdma"] <= 1024
