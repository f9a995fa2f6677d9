"""Holders that die mid-read, a reader that dies mid-fetch, and a hub that restarts or freezes mid-fetch."""

import os
import signal
import threading
import time

import pytest

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig

from tests.ros.roles import GatedPlane, digest, holder, make_weights, stalling_reader, wait_until

CHUNK = 256 << 10


@pytest.fixture
def quick_hub():
    """The suite's loopback hub (``hub``), but one that drops a silent worker after 4 s (8 heartbeats) instead of
    10: the tests that wait for a dead worker to be dropped wait that long."""
    server = th.start_hub(config=th.HubConfig(worker_timeout_s=4.0, heartbeat_s=0.5, lease_ttl_s=30.0,
                                              suspect_s=2.0))
    yield server
    server.stop()


def test_a_holder_killed_mid_read_costs_only_a_re_plan(hub, roles):
    first = roles(holder, hub.url, "h1", 4, 4.0, CHUNK).result(120)
    roles(holder, hub.url, "h2", 4, 4.0, CHUNK).result(120)

    def kill_h1(n):
        if n == 3:  # reads 1 and 2 already went out, to h1 and h2 in turn
            os.kill(first["pid"], signal.SIGKILL)

    transport = GatedPlane("reader-agent", on_read=kill_h1)
    client = Client(hub.url, "reader", config=ClientConfig.from_fields(read_timeout_s=3.0, window=4), plane=transport)
    manifest = client.manifest("policy", 1)
    stats = client.fetch("policy", 1)
    assert digest(stats.buffers) == digest(make_weights(4, 4.0))
    assert stats.failed_reads >= 1
    assert stats.bytes == manifest.nbytes  # every chunk landed once: only the lost reads were redone
    assert stats.sources.get("h2", 0) > 0
    client.close()


def test_a_fetch_fails_cleanly_when_its_only_holder_dies(quick_hub, roles):
    hub = quick_hub
    only = roles(holder, hub.url, "h1", 4, 4.0, CHUNK).result(120)
    transport = GatedPlane("reader-agent",
                               on_read=lambda n: n == 2 and os.kill(only["pid"], signal.SIGKILL))
    client = Client(hub.url, "reader",
                    config=ClientConfig.from_fields(read_timeout_s=2.0, window=2, fetch_timeout_s=60),
                    plane=transport)
    # It fails once the holder is proven dead ("no holder"), not at the fetch timeout ("fetch timed out").
    with pytest.raises(TransferFailed, match="no holder"):
        client.fetch("policy", 1)
    assert all("reader" not in holders for holders in client.versions("policy").values())
    client.close()


def test_a_hub_restart_mid_fetch_loses_nothing(roles):
    hub_process = HubProcess(args=("--worker-timeout", "10")).start()
    url = hub_process.url
    try:
        published = roles(holder, url, "trainer", 6, 4.0, CHUNK).result(120)
        gated = GatedPlane("reader-agent", hold_after=3)
        client = Client(url, "reader", config=ClientConfig.from_fields(window=1, hub_retry_s=60), plane=gated)
        result = {}
        fetch = threading.Thread(target=lambda: result.update(stats=client.fetch("policy", 1)), daemon=True)
        fetch.start()
        assert gated.holding.wait(60)
        hub_process.kill()
        hub_process.start()  # a new instance at the same URL: it knows nothing
        gated.start_gate.set()
        fetch.join(120)
        assert "stats" in result, "the fetch did not survive the hub restart"
        assert digest(result["stats"].buffers) == published["digest"]
        # The trainer re-registered its copy. The reader's chunks from before the restart reach the new hub only
        # as its own announcement, never through the hub's leases: it holds the version without serving it.
        assert client.versions("policy")[1] == ["trainer"]
        client.close()
    finally:
        roles.stop_all()
        hub_process.kill()


def _holdings(client: Client, worker: str) -> list[dict]:
    return [h for v in client.status()["models"].get("policy", []) for h in v["holders"] if h["worker"] == worker]


def test_a_reader_killed_mid_fetch_never_serves_its_partial_chunks(quick_hub, roles):
    hub = quick_hub
    published = roles(holder, hub.url, "trainer", 8, 4.0, CHUNK).result(120)
    victim = roles(stalling_reader, hub.url, "victim", 3).result(120)
    observer = Client(hub.url, "observer")
    try:
        # The victim announced 3 verified chunks; a 4th has landed in its memory, unverified and unannounced.
        wait_until(lambda: [h["chunks"] for h in _holdings(observer, "victim")] == [3], 60,
                    "the victim's 3 announced chunks did not show at the hub")
        assert _holdings(observer, "victim")[0]["state"] == "filling"
        os.kill(victim["pid"], signal.SIGKILL)

        # Before the hub notices: reads planned on the dead reader fail and are re-planned; bytes are right.
        early = Client(hub.url, "early",
                       config=ClientConfig.from_fields(window=4, read_timeout_s=5.0, fetch_timeout_s=90))
        stats = early.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"]
        early.close()

        # At its heartbeat timeout the hub forgets the dead reader and its holding; nobody reads from it again.
        wait_until(lambda: "victim" not in observer.status()["workers"], 60, "the hub did not drop the dead reader")
        assert _holdings(observer, "victim") == []
        late = Client(hub.url, "late", config=ClientConfig.from_fields(window=4, fetch_timeout_s=90))
        stats = late.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"]
        assert "victim" not in stats.sources and stats.failed_reads == 0
        late.close()
    finally:
        observer.close()


def test_a_hub_frozen_past_the_worker_timeout_drops_nobody(roles, tmp_path):
    # The hub's own stall is not its workers' silence (ros/hub/liveness.py): after SIGCONT the sweeper must not
    # drop workers whose heartbeats sat unread in the hub's socket buffers. (Dropped workers would come back
    # by re-registering, so the hub's log is what tells.)
    log = tmp_path / "hub.log"
    hub_process = HubProcess(args=("--worker-timeout", "3"), stderr_path=str(log)).start()
    try:
        roles(holder, hub_process.url, "trainer", 9, 1.0, CHUNK).result(120)
        reader = Client(hub_process.url, "reader")
        stats = reader.fetch("policy", 1)
        hub_process.signal(signal.SIGSTOP)
        time.sleep(5)  # the freeze itself: longer than the worker timeout (3 s) by two heartbeat intervals
        hub_process.signal(signal.SIGCONT)
        thawed = reader.status()["sweeps"]
        # Sweeps after the thaw, each of which would drop a worker it took for silent; and a heartbeat's round.
        wait_until(lambda: reader.status()["sweeps"] >= thawed + 5, 30, "the hub's sweeper did not run after the thaw")
        assert "dropping it" not in log.read_text()
        assert sorted(reader.status()["workers"]) == ["reader", "trainer"]
        assert reader.versions("policy") == {1: ["reader", "trainer"]}
        assert stats.bytes > 0
        reader.close()
    finally:
        roles.stop_all()
        hub_process.stop()
