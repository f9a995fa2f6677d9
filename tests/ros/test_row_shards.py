"""A version held by N row shards (FSDP2 ranks: each a dim-0 row range of every tensor), read whole.

Real hub, real processes, real NIXL/UCX reads; bytes compared exactly.
"""

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import VersionNotFound

from tests.ros.roles import digest, reader, shard_holder, shard_weights

CHUNK = 64 << 10


def _publish_shards(hub, roles, ranks, seed, workers=None):
    """Starts ``ranks`` shard processes one by one; the version stays invisible until the last one is in."""
    shards = []
    with th.connect(hub.url, "watcher") as watcher:
        for rank in range(ranks):
            if rank:
                assert watcher.versions("policy") == {}, f"visible with only {rank} of {ranks} shards"
                with pytest.raises(VersionNotFound):
                    watcher.manifest("policy", "latest")
            name = (workers or [f"rank-{r}" for r in range(ranks)])[rank]
            shards.append(roles(shard_holder, hub.url, name, rank, ranks, seed, 2.0, CHUNK).result(120))
        assert watcher.versions("policy") == {1: sorted(f"rank-{r}" for r in range(ranks))}
        manifest = watcher.manifest("policy", 1)
        assert manifest.row_shards == ranks
        assert all(manifest.chunk_digests), "the hub merges every rank's chunk digests"
    return shards


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_reader_reads_each_chunk_from_the_rank_that_has_it(hub, roles, ranks):
    shards = _publish_shards(hub, roles, ranks, seed=ranks)
    first = roles(reader, hub.url, "reader-1")
    first.result(120)
    first.send("go")
    got = first.result(300)
    assert got["digest"] == digest(shard_weights(ranks, 2.0))
    # Every chunk lies on exactly one rank, and nobody else held it: each rank served exactly its chunks.
    assert got["sources"] == {f"rank-{r}": shards[r]["bytes"] for r in range(ranks)}
    assert all(s["bytes"] > got["bytes"] / ranks / 2 for s in shards)
    second = roles(reader, hub.url, "reader-2")
    second.result(120)
    second.send("go")
    again = second.result(300)
    assert again["digest"] == got["digest"]
    assert again["sources"].get("reader-1", 0) > 0, again["sources"]
    assert sum(again["sources"].values()) == got["bytes"]
