"""A hub run as several processes (shards, ``ros/client/shares.py``): real hub processes, real clients, the TCP
plane."""

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes.tcp import TcpPlane
from tensorhub_verl.ros.client.shares import share_layout, split
from tensorhub_verl.ros.client.sharded_client import ShardedClient

from tests.ros.roles import GatedPlane, digest, holder, make_weights

CHUNK = 64 << 10


@pytest.fixture
def shards(two_hub_processes):
    """Two hub processes: the shards of one hub."""
    return two_hub_processes


def _url(procs) -> str:
    return ",".join(p.url for p in procs)


def _connect(procs, worker: str, **fields) -> ShardedClient:
    client = th.connect(_url(procs), worker, chunk_bytes=CHUNK, transport="tcp", hub_retry_s=60.0, **fields)
    assert isinstance(client, ShardedClient)
    return client


def test_split_is_whole_tensors_in_order_balanced_and_never_empty():
    assert split([("a", 10), ("b", 10), ("c", 10), ("d", 10)], 2) == [["a", "b"], ["c", "d"]]
    assert split([("big", 100), ("x", 1), ("y", 1)], 3) == [["big"], ["x"], ["y"]]
    assert split([("x", 1), ("y", 1), ("big", 100)], 2) == [["x", "y"], ["big"]]
    with pytest.raises(errors.ConfigError, match="cannot be split across 3 hub shards"):
        split([("a", 1), ("b", 1)], 3)
    assert share_layout("hf", 0, 1) == "hf" and share_layout("hf", 1, 4) == "hf@1/4"


def test_a_two_shard_hub_serves_the_published_bytes(shards):
    trainer = _connect(shards, "trainer")
    reader = _connect(shards, "reader")
    try:
        weights = make_weights(3, 2.0)
        published = trainer.publish("policy", 1, weights)  # the whole version's; its shares: one per shard
        assert sorted(t.name for t in published.tensors) == sorted(weights) and published.layout == "hf"
        manifests = published.shares
        # Each shard holds a non-empty share of whole tensors; together, every tensor once.
        names = [[spec.name for spec in m.tensors] for m in manifests]
        assert all(names) and sorted(sum(names, [])) == sorted(weights)
        assert [m.layout for m in manifests] == ["hf@0/2", "hf@1/2"]
        # Buffers missing a tensor of the last share are refused before any share's bytes move.
        partial = {name: torch.empty_like(t) for name, t in weights.items() if name != names[1][-1]}
        with pytest.raises(errors.ManifestMismatch, match=names[1][-1]):
            reader.fetch("policy", 1, into=partial)
        assert reader.holdings() == [] and reader.shards[0].versions("policy", "hf@0/2") == {1: ["trainer"]}
        stats = reader.fetch("policy", "latest")
        assert digest(stats.buffers) == digest(weights)
        assert stats.version == 1 and stats.sources == {"trainer": stats.bytes}
        assert stats.bytes == sum(t.numel() * t.element_size() for t in weights.values())
        # Both shards planned their share: each lists the reader as a holder of its share now.
        for i, client in enumerate(reader.shards):
            assert client.versions("policy", share_layout("hf", i, 2)) == {1: ["reader", "trainer"]}
        assert reader.holdings() == [("policy", 1, "hf")]
    finally:
        reader.close()
        trainer.close()


def test_a_version_on_some_shards_only_is_not_visible(shards):
    trainer = _connect(shards, "trainer")
    reader = _connect(shards, "reader")
    try:
        weights = make_weights(4, 1.0)
        groups = split([(n, t.numel() * t.element_size()) for n, t in weights.items()], 2)
        # A publish caught half-way: share 0 is on shard 0, shard 1 has nothing yet.
        trainer.shards[0].publish("policy", 1, {n: weights[n] for n in groups[0]}, share_layout("hf", 0, 2))
        assert reader.versions("policy") == {} and reader.latest("policy") is None
        with pytest.raises(errors.VersionNotFound, match=r"not on hub shard\(s\) \[1\] of 2"):
            reader.fetch("policy", 1)
        with pytest.raises(errors.VersionNotFound, match="on all 2 hub shards"):
            reader.fetch("policy", "latest")
        with pytest.raises(TimeoutError):
            reader.wait_for_version("policy", timeout=0.5)
        # Nothing of it was read: shard 0 lists no reader, and the reader holds nothing.
        assert reader.shards[0].versions("policy", "hf@0/2") == {1: ["trainer"]} and reader.holdings() == []
        trainer.shards[1].publish("policy", 1, {n: weights[n] for n in groups[1]}, share_layout("hf", 1, 2))
        assert reader.wait_for_version("policy", timeout=30) == 1
        assert digest(reader.fetch("policy", 1).buffers) == digest(weights)
    finally:
        reader.close()
        trainer.close()


def test_unpublish_drains_every_shard(shards):
    trainer = _connect(shards, "trainer", preserve_on_unpublish=False)
    gated = GatedPlane("reader-agent", hold_after=2, inner=TcpPlane("reader-agent", "127.0.0.1"))
    reader = ShardedClient(_url(shards).split(","), "reader", plane=gated,
                           config=ClientConfig.from_fields(window=1, max_run_chunks=1, hub_retry_s=60.0))
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
        # Two reads posted, and the third held at the gate: its lease, on the trainer, is live on its shard.
        assert gated.holding.wait(60)
        unpublished = threading.Event()
        threading.Thread(target=lambda: (trainer.unpublish("policy", 1), unpublished.set()), daemon=True).start()
        # The unpublish waits for the reads in flight on every shard: it cannot return while the gate holds them.
        assert not unpublished.wait(1.0)
        gated.start_gate.set()
        assert unpublished.wait(60), "unpublish did not return once the reads drained"
        fetch.join(60)
        # The reader's fetch either finished first or lost its only source: either way no shard lists the trainer.
        for i, client in enumerate(reader.shards):
            assert "trainer" not in sum(client.versions("policy", share_layout("hf", i, 2)).values(), [])
        assert "stats" in result or "no holder can serve" in str(result["error"])
        if "stats" in result:
            assert digest(result["stats"].buffers) == digest(weights)
    finally:
        reader.close()
        trainer.close()
        gated.close()


def test_a_shard_restarted_mid_fetch_loses_nothing(shards, roles):
    url = _url(shards)
    published = roles(holder, url, "trainer", 6, 2.0, CHUNK, 1, None, "tcp").result(120)
    gated = GatedPlane("reader-agent", hold_after=3, inner=TcpPlane("reader-agent", "127.0.0.1"))
    reader = ShardedClient(url.split(","), "reader", plane=gated,
                           config=ClientConfig.from_fields(window=1, hub_retry_s=60.0))
    try:
        result = {}
        fetch = threading.Thread(target=lambda: result.update(stats=reader.fetch("policy", 1)), daemon=True)
        fetch.start()
        assert gated.holding.wait(60)
        shards[1].kill()
        shards[1].start()  # a new instance of shard 1 at the same URL: it knows nothing
        gated.start_gate.set()
        fetch.join(120)
        assert "stats" in result, "the fetch did not survive the shard's restart"
        assert digest(result["stats"].buffers) == published["digest"]
        # Shard 1 learnt the trainer's share and the reader's copy again from their re-registrations. The reader's
        # copy there began with chunks it only announced to the new instance: it holds it, but serves none of it.
        assert reader.shards[1].versions("policy", "hf@1/2") == {1: ["trainer"]}
        states = {h["holder"]: h["state"] for v in reader.shards[1].status()["models"]["policy"] for h in v["holders"]}
        assert states == {"trainer": "active", "reader": "held"}
    finally:
        reader.close()
        gated.close()


def test_tensorhub_hub_shards_starts_and_stops_its_shard_processes(tmp_path):
    url_file = tmp_path / "hub.url"
    launcher = subprocess.Popen([sys.executable, "-m", "tensorhub_verl.cli", "hub", "--shards", "2", "--port", "0",
                                 "--plane", "tcp", "--url-file", str(url_file)], stdout=subprocess.DEVNULL)
    children = []
    try:
        deadline = time.monotonic() + 60
        while not (url_file.exists() and url_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        urls = url_file.read_text().split(",")
        assert len(urls) == 2
        children = psutil.Process(launcher.pid).children()
        assert len(children) == 2
        with th.connect(",".join(urls), "trainer", chunk_bytes=CHUNK, transport="tcp") as trainer, \
                th.connect(",".join(urls), "reader", chunk_bytes=CHUNK, transport="tcp") as reader:
            weights = make_weights(7, 0.5)
            trainer.publish("policy", 1, weights)
            assert digest(reader.fetch("policy", 1).buffers) == digest(weights)
        launcher.terminate()
        assert launcher.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive
    finally:
        for process in [launcher, *children]:
            if process.is_running() if isinstance(process, psutil.Process) else process.poll() is None:
                process.kill()
        launcher.wait(10)
