"""A hub of regions (``ros/wire/regions.py``): a hub process per region, each serving its own readers; real hub
processes, real clients, the TCP plane."""

import subprocess
import sys
import threading
import time

import psutil
import pytest

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes.tcp import TcpPlane
from tensorhub_verl.ros.client.regional_client import RegionalClient
from tensorhub_verl.ros.wire.regions import (commit_layout, parse_regions, region_names, region_of, relay_children,
                                             relay_parents)
from tensorhub_verl.ros.wire.topology import Location

from tests.ros.roles import GatedPlane, digest, make_weights

CHUNK = 64 << 10
TRAINER = "dc0/r9/t0"
RACK0, RACK1 = "dc0/r0/n0", "dc0/r1/n0"


def _where(path: str) -> dict:
    dc, rack, node = path.split("/")
    return {"dc": dc, "rack": rack, "node": node}


@pytest.fixture
def regions(two_hub_processes):
    """Two hub processes, one per rack: regions dc0/r0 and dc0/r1."""
    return two_hub_processes


def _spec(procs) -> str:
    return f"dc0/r0={procs[0].url},dc0/r1={procs[1].url}"


def _connect(procs, worker: str, where: str, **fields) -> RegionalClient:
    client = th.connect(_spec(procs), worker, location=_where(where), chunk_bytes=CHUNK, transport="tcp",
                        hub_retry_s=60.0, **fields)
    assert isinstance(client, RegionalClient)
    return client


def test_a_worker_belongs_to_the_most_specific_region_of_its_location():
    regions = parse_regions("dc0=http://a:1,dc0/r1=http://b:1,dc0/r1/n7=http://c:1")
    assert region_of(Location("dc0", "r1", "n7"), regions) == "dc0/r1/n7"
    assert region_of(Location("dc0", "r1", "n2"), regions) == "dc0/r1"
    assert region_of(Location("dc0", "r5", "n2"), regions) == "dc0"
    assert region_of(Location("dc1", "r1", "n7"), regions) is None
    assert region_names(3) == ["dc0/r0", "dc0/r1", "dc0/r2"] and region_names("dc0,dc1/r2") == ["dc0", "dc1/r2"]
    for bad, problem in (("dc0=http://a:1,dc0=http://b:1", "given twice"), ("dc0", "not REGION=URL"),
                         ("a/b/c/d=http://a:1", "not REGION=URL"), ("a=http://x:1,b=http://x:1", "share one hub")):
        with pytest.raises(errors.ConfigError, match=problem):
            parse_regions(bad)


def test_each_region_serves_its_readers_and_reads_stay_in_the_region(regions):
    trainer = _connect(regions, "trainer", TRAINER)
    readers = [_connect(regions, name, where) for name, where in
               (("a0", RACK0), ("a1", "dc0/r0/n1"), ("b0", RACK1))]
    try:
        weights = make_weights(4, 2.0)
        manifest = trainer.publish("policy", 1, weights)
        assert trainer.region is None  # the trainer's rack has no region: it publishes to all, reads from none
        with pytest.raises(errors.ConfigError, match="in none of the regions"):
            trainer.fetch("policy", 1)
        first = readers[0].fetch("policy", "latest")
        second = readers[1].fetch("policy", 1)
        third = readers[2].fetch("policy", 1)
        for stats in (first, second, third):
            assert stats.version == 1 and digest(stats.buffers) == digest(weights)
        assert manifest.layout == "hf" and third.sources == {"trainer": third.bytes}
        # Each region's hub knows its own readers only: a reader in r0 is never a source for r1's readers.
        assert readers[0].home.versions("policy", "hf") == {1: ["a0", "a1", "trainer"]}
        assert readers[2].home.versions("policy", "hf") == {1: ["b0", "trainer"]}
        assert set(second.sources) <= {"a0", "trainer"}
        assert readers[0].home.hub_url == regions[0].url and readers[2].home.hub_url == regions[1].url
        assert sorted(c.hub_url for c in readers[0]._clients.values()) == [regions[0].url]
        assert readers[0].holdings() == [("policy", 1, "hf")] and trainer.holdings() == [("policy", 1, "hf")]
    finally:
        for client in (*readers, trainer):
            client.close()


def test_a_version_is_visible_in_no_region_until_every_region_holds_it(regions):
    trainer = RegionalClient(_spec(regions), "trainer", _where(TRAINER),  # gives up on a dead hub within 3 s
                             config=ClientConfig.from_fields(chunk_bytes=CHUNK, transport="tcp", hub_retry_s=3.0))
    reader0, reader1 = _connect(regions, "a0", RACK0), _connect(regions, "b0", RACK1)
    try:
        weights = make_weights(3, 1.0)
        # A publish caught after phase 1 in region r0 only: pending there, nothing in r1.
        trainer._client("dc0/r0").publish("policy", 1, weights, "hf", None, "regions", 2)
        assert reader0.versions("policy") == {} and reader0.latest("policy") is None
        with pytest.raises(errors.VersionNotFound):
            reader0.fetch("policy", 1)
        with pytest.raises(TimeoutError):
            reader0.wait_for_version("policy", timeout=0.5)
        trainer._client("dc0/r0").unpublish("policy", 1, "hf")
        # A region that cannot take the version: the publish fails and withdraws it from the other region.
        regions[1].kill()
        with pytest.raises(errors.HubUnavailable, match="visible in none"):
            trainer.publish("policy", 1, weights)
        assert reader0.versions("policy") == {} and trainer.holdings() == []
        regions[1].start()
        trainer.publish("policy", 2, weights)
        assert reader0.wait_for_version("policy", timeout=30) == 2
        assert reader1.wait_for_version("policy", timeout=30) == 2
        assert digest(reader1.fetch("policy", 2).buffers) == digest(weights)
        # The commit markers are the trainer's, one per region; a reader's holdings list only the version.
        assert reader0.home.versions("policy", commit_layout("hf")) == {2: ["trainer"]}
    finally:
        for client in (reader0, reader1, trainer):
            client.close()


def test_unpublish_drains_every_region(regions):
    trainer = _connect(regions, "trainer", TRAINER, preserve_on_unpublish=False)
    gated = GatedPlane("reader-agent", hold_after=2, inner=TcpPlane("reader-agent", "127.0.0.1"))
    reader = RegionalClient(_spec(regions), "b0", _where(RACK1), plane=gated,
                            config=ClientConfig.from_fields(window=1, max_run_chunks=1, hub_retry_s=60.0,
                                                            chunk_bytes=CHUNK))
    try:
        weights = make_weights(5, 2.0)
        trainer.publish("policy", 1, weights)
        result = {}

        def fetch_it():
            try:
                result["stats"] = reader.fetch("policy", 1)
            except errors.TransferFailed as e:  # the trainer left before every chunk was read
                result["error"] = e

        fetch = threading.Thread(target=fetch_it, daemon=True)
        fetch.start()
        assert gated.holding.wait(60)  # a read of region r1 held at the gate: its lease on the trainer is live
        unpublished = threading.Event()
        threading.Thread(target=lambda: (trainer.unpublish("policy", 1), unpublished.set()), daemon=True).start()
        assert not unpublished.wait(1.0)  # region r1's read in flight holds the unpublish
        gated.start_gate.set()
        assert unpublished.wait(60), "unpublish did not return once region r1's reads drained"
        fetch.join(60)
        for client in trainer._clients.values():  # no region lists the trainer, nor its commit marker
            assert "trainer" not in sum(client.versions("policy", "hf").values(), [])
            assert client.versions("policy", commit_layout("hf")) == {}
        assert "stats" in result or "no holder can serve" in str(result["error"])
    finally:
        reader.close()
        trainer.close()
        gated.close()


def test_tensorhub_hub_regions_starts_a_hub_per_region_and_prints_the_list(tmp_path):
    url_file = tmp_path / "hub.url"
    launcher = subprocess.Popen([sys.executable, "-m", "tensorhub_verl.cli", "hub", "--regions", "dc0/r0,dc0/r1",
                                 "--port", "0", "--plane", "tcp", "--url-file", str(url_file)],
                                stdout=subprocess.DEVNULL)
    children = []
    try:
        deadline = time.monotonic() + 60
        while not (url_file.exists() and url_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        spec = url_file.read_text()
        assert list(parse_regions(spec)) == ["dc0/r0", "dc0/r1"]
        children = psutil.Process(launcher.pid).children()
        assert len(children) == 2
        with th.connect(spec, "trainer", location=_where(TRAINER), chunk_bytes=CHUNK, transport="tcp") as trainer, \
                th.connect(spec, "b0", location=_where(RACK1), chunk_bytes=CHUNK, transport="tcp") as reader:
            weights = make_weights(7, 0.5)
            trainer.publish("policy", 1, weights)
            assert digest(reader.fetch("policy", 1).buffers) == digest(weights)
            assert reader.home.hub_url == parse_regions(spec)["dc0/r1"]
        launcher.terminate()
        assert launcher.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive
    finally:
        for process in [launcher, *children]:
            if process.is_running() if isinstance(process, psutil.Process) else process.poll() is None:
                process.kill()
        launcher.wait(10)


def test_relay_tree_each_datacenter_its_own_with_the_first_region_as_root():
    names = [f"dc0/r{i}" for i in range(5)] + ["dc1/r0", "dc1/r1"]
    assert relay_parents(names, 2) == {"dc0/r0": None, "dc0/r1": "dc0/r0", "dc0/r2": "dc0/r0", "dc0/r3": "dc0/r1",
                                       "dc0/r4": "dc0/r1", "dc1/r0": None, "dc1/r1": "dc1/r0"}
    assert relay_children(names, 2)["dc0/r1"] == ["dc0/r3", "dc0/r4"]
    assert set(relay_parents(names, 0).values()) == {None}
    with pytest.raises(errors.ConfigError, match="relay_fanout"):
        ClientConfig.from_fields(relay_fanout=-1)


def _status_holders(client, version=1) -> dict[str, int]:
    """holder -> bytes it served, for ``version`` in a region's hub."""
    return {h["holder"]: h["served_bytes"] for v in client.status()["models"].get("policy", ())
            if (v["version"], v["layout"]) == (version, "hf") for h in v["holders"]}


def _relayed(procs, b0=True, **fields):
    """A trainer and readers a0 (region r0, the root) and b0 (region r1, fed by r0), with relays on."""
    fields = {"relay_fanout": 1, **fields}
    return (_connect(procs, "trainer", TRAINER, **fields), _connect(procs, "a0", RACK0, **fields),
            _connect(procs, "b0", RACK1, **fields) if b0 else None)


def test_a_region_reads_its_first_copy_from_its_parent_regions_reader_not_the_trainer(regions):
    trainer, a0, b0 = _relayed(regions)
    try:
        weights = make_weights(11, 2.0)
        trainer.publish("policy", 1, weights)
        # r1 is fed by r0: the trainer's copy there is a standby, and r1's reader waits for r0's relay.
        assert _status_holders(b0.home) == {"trainer~standby": 0}
        fetched = {}
        waiting = threading.Thread(target=lambda: fetched.update(b0=b0.fetch("policy", "latest")), daemon=True)
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive() and "b0" not in fetched  # no copy from r0 yet: b0 waits, reads nothing
        first = a0.fetch("policy", 1)  # r0 is the root: from the trainer; then a0 relays its copy to r1
        waiting.join(60)
        second = fetched["b0"]
        assert digest(first.buffers) == digest(second.buffers) == digest(weights)
        assert first.sources == {"trainer": first.bytes}
        assert second.sources == {"a0": second.bytes}  # the relay, not the trainer's standby copy
        served = _status_holders(b0.home)
        assert served["trainer~standby"] == 0 and served["a0~relay"] == second.bytes and "b0" in served
        assert "a0~relay" not in _status_holders(a0.home)  # r0's hub does not list a relay of r0's own reader
        assert a0.holdings() == [("policy", 1, "hf")]
        # A copy of a version a reader fetched (an engine holding it in its own layout) stays in its region.
        b0.publish("policy", 1, second.buffers, layout="engine")
        assert sorted(b0._clients) == ["dc0/r1"] and b0.home.versions("policy", "engine") == {1: ["b0"]}
    finally:
        for client in (b0, a0, trainer):
            client.close()


def test_unpublish_drains_the_relay_copy_in_the_child_region(regions):
    trainer, a0, _ = _relayed(regions, b0=False)
    gated = GatedPlane("reader-agent", hold_after=2, inner=TcpPlane("reader-agent", "127.0.0.1"))
    b0 = RegionalClient(_spec(regions), "b0", _where(RACK1), plane=gated,
                        config=ClientConfig.from_fields(window=1, max_run_chunks=1, hub_retry_s=60.0,
                                                        chunk_bytes=CHUNK, relay_fanout=1))
    try:
        trainer.publish("policy", 1, make_weights(5, 2.0))
        a0.fetch("policy", 1)
        assert "a0~relay" in _status_holders(b0.home)
        result = {}
        fetch = threading.Thread(target=lambda: result.update(stats=b0.fetch("policy", 1)), daemon=True)
        fetch.start()
        assert gated.holding.wait(60)  # b0's third read held at the gate: its lease on a0's relay copy is live
        unpublished = threading.Event()
        threading.Thread(target=lambda: (a0.unpublish("policy", 1), unpublished.set()), daemon=True).start()
        assert not unpublished.wait(1.0)  # r1's read of the relay copy holds a0's unpublish
        gated.start_gate.set()
        assert unpublished.wait(60), "a0's unpublish did not return once r1's reads of its relay copy drained"
        fetch.join(60)
        assert "a0~relay" not in _status_holders(b0.home) and "a0" not in _status_holders(a0.home)
        assert a0.holdings() == [] and result["stats"].sources.get("a0", 0) > 0
    finally:
        for client in (b0, a0, trainer):
            client.close()
        gated.close()


def test_a_dead_relay_is_planned_around(regions):
    trainer, a0, b0 = _relayed(regions, read_timeout_s=5.0)
    try:
        weights = make_weights(6, 2.0)
        trainer.publish("policy", 1, weights)
        a0.fetch("policy", 1)
        assert "a0~relay" in _status_holders(b0.home)
        a0._plane.close()  # a0 stops serving; its hubs still list it until its heartbeats stop
        stats = b0.fetch("policy", 1)
        assert digest(stats.buffers) == digest(weights)
        assert stats.sources.get("a0", 0) == 0 and stats.sources["trainer"] == stats.bytes
    finally:
        for client in (b0, a0, trainer):
            try:
                client.close(10.0)
            except errors.TensorHubError:
                pass  # a0's plane is gone
