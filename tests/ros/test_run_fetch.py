"""Run leases end to end: real hub, real holder processes, both data planes; every chunk's digest checked."""

import pytest

from tensorhub_verl.ros.client import Client, ClientConfig
from tensorhub_verl.ros.fetcher import ChunkFetcher, FetchSettings
from tensorhub_verl.ros.planes.base import ReadState
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
        # One reader's report keeps that reader off the copy; quarantine takes two (test_integrity.py).
        assert not holders["tamperer"]["quarantined"] and not holders["good"]["quarantined"]


class _FailsOneReadInsideARun(TcpPlane):
    """Reports the first chunk read that is not the first of its run as failed, once its bytes have landed
    (a read whose completion was lost): its run fails with the chunks before it landed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.target = None

    def _start_read(self, peer, copies, grant, wake):
        handle = super()._start_read(peer, copies, grant, wake)
        if self.target is None and grant.ranges and copies[0].remote_addr > min(addr for addr, _ in grant.ranges):
            self.target = handle
        return handle

    def poll(self, handle):
        state = super().poll(handle)
        return ReadState.FAILED if handle is self.target and state is ReadState.DONE else state


def test_a_run_that_fails_midway_books_what_landed_and_reads_only_the_rest_again(hub, roles):
    published = roles(holder, hub.url, "trainer", 5, SIZE_MB, CHUNK, 1, None, "tcp").result(120)
    transport = _FailsOneReadInsideARun("failing-reader", "127.0.0.1")
    client = Client(hub.url, "reader", plane=transport, config=ClientConfig(window=8, **RUNS))
    reported = []
    exchange = client._exchange

    def spying(key, **kw):
        reported.extend(kw["failed"])
        return exchange(key, **kw)

    client._exchange = spying
    try:
        stats = client.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == published["digest"]
        assert transport.target is not None and stats.failed_reads == 1
        (failure,) = reported
        assert failure.landed, "the chunks of the run before the failed one had landed"
        assert stats.bytes == sum(c.nbytes for c in client.manifest("policy", 1).chunks())  # each booked once
    finally:
        client.close()
        transport.close()


def test_runs_are_sized_to_the_measured_throughput():
    """A run takes about run_target_s of the link: 1 at 200 Mbit/s with 1 MiB chunks, the cap at 25 GB/s."""
    from tensorhub_verl.ros.manifest import Chunk, Segment

    chunks = tuple(Chunk(i, (Segment(0, i << 20, 1 << 20),)) for i in range(1024))
    sized = {}
    for name, bytes_per_s in (("lab", 25e6), ("rdma", 25e9)):
        settings = FetchSettings(8, 30.0, 1e9, 0.001, run_target_s=0.05, max_run_chunks=1024)
        fetcher = ChunkFetcher(None, chunks, [], None, settings, None)
        for i in range(64):
            fetcher._throughput.add(i * (1 << 20) / bytes_per_s, 1 << 20)
        sized[name] = fetcher._run_chunks()
    assert sized["lab"] == 1 and 1000 <= sized["rdma"] <= 1024
