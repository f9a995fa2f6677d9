"""Deltas through a hub run as several processes: a hub of shards (``ros/client/shares.py``: each share of the
version has its own delta, and a reader applies both) and a hub of regions (no deltas: read in full). Real hub
processes, real clients, the TCP plane."""

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.client.sharded_client import ShardedClient

from tests.ros.delta_roles import versions


@pytest.fixture
def shards(two_hub_processes):
    return two_hub_processes


def test_a_reader_of_a_sharded_hub_applies_each_shares_delta(shards):
    url = ",".join(p.url for p in shards)
    v1, v2 = versions(2, rows=64)
    trainer = th.connect(url, "trainer", chunk_bytes=64 << 10, transport="tcp", hub_retry_s=60.0)
    reader = th.connect(url, "reader", transport="tcp", hub_retry_s=60.0)
    assert isinstance(trainer, ShardedClient)
    try:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        published = trainer.publish_delta("policy", 2, 1)  # one result of the whole version; its shares inside
        assert published.layout == "delta/hf@1" and published.published
        assert [p.layout for p in published.shares] == ["delta/hf@0/2@1", "delta/hf@1/2@1"]
        into = {n: t.clone() for n, t in v1.items()}
        stats = reader.fetch("policy", 2, into=into, have=1)
        assert all(torch.equal(into[n], v2[n]) for n in v2)
        assert stats.delta.used and stats.delta.fallback_chunks == 0
        assert stats.bytes == stats.delta.delta_bytes == published.bytes
        assert stats.bytes < sum(t.nbytes for t in v2.values()) / 4
        # A TP rank's slices of v1 (rows of one matrix, columns of another) take each share's delta too.
        slices = {"layers.0.mlp.weight": (0, 512, 512), "embed.weight": (1, 512, 512)}

        def part(w):
            return {n: (w[n].narrow(*slices[n]) if n in slices else w[n]).contiguous().clone() for n in w}

        mine = part(v1)
        with th.connect(url, "rank1", transport="tcp", hub_retry_s=60.0) as rank:
            sliced = rank.fetch_slices("policy", 2, into=mine, slices=slices, have=1)
        assert all(torch.equal(mine[n], t) for n, t in part(v2).items())
        assert sliced.delta.used and sliced.delta.fallback_chunks == 0 and sliced.delta.delta_bytes > 0
    finally:
        reader.close()
        trainer.close()


def test_a_hub_of_regions_publishes_no_delta_and_its_readers_read_in_full_saying_so(two_hub_processes):
    spec = f"dc0/r0={two_hub_processes[0].url},dc0/r1={two_hub_processes[1].url}"
    v1, v2 = versions(2)
    trainer = th.connect(spec, "trainer", location={"dc": "dc0", "rack": "r9", "node": "t"}, transport="tcp",
                         hub_retry_s=60.0)
    reader = th.connect(spec, "reader", location={"dc": "dc0", "rack": "r0", "node": "a"}, transport="tcp",
                        hub_retry_s=60.0)
    try:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        with pytest.raises(errors.ConfigError, match="deltas are not published to a hub of regions"):
            trainer.publish_delta("policy", 2, 1)
        into = {n: t.clone() for n, t in v1.items()}
        stats = reader.fetch("policy", 2, into=into, have=1)
        assert all(torch.equal(into[n], v2[n]) for n in v2)
        assert not stats.delta.used and "hub of regions" in stats.delta.reasons[0]
        assert stats.bytes == sum(t.nbytes for t in v2.values())
    finally:
        reader.close()
        trainer.close()
