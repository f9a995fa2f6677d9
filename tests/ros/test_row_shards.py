"""A version held by N row shards (FSDP2 ranks: each a dim-0 row range of every tensor), read whole.

Real hub, real processes, real NIXL/UCX reads; bytes compared exactly.
"""

import json
from dataclasses import replace
import os
import signal
import time

import httpx
import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import InvalidRequest, ManifestMismatch, TransferFailed, VersionNotFound
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.fetcher import remote_address
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.convert import manifest_to_msg
from tensorhub_verl.ros.wire.manifest import Manifest, Segment, TensorSpec, shard_bytes, shard_chunks, split_into_chunks
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER
from tensorhub_verl.ros.planes.base import ReadError

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
    # Both readers start at once (a process start each); each reads only when told to go.
    first, second = roles(reader, hub.url, "reader-1"), roles(reader, hub.url, "reader-2")
    first.result(120)
    second.result(120)
    first.send("go")
    got = first.result(300)
    assert got["digest"] == digest(shard_weights(ranks, 2.0))
    # Every chunk lies on exactly one rank, and nobody else held it: each rank served exactly its chunks.
    assert got["sources"] == {f"rank-{r}": shards[r]["bytes"] for r in range(ranks)}
    assert all(s["bytes"] > got["bytes"] / ranks / 2 for s in shards)
    second.send("go")
    again = second.result(300)
    assert again["digest"] == got["digest"]
    assert again["sources"].get("reader-1", 0) > 0, again["sources"]
    assert sum(again["sources"].values()) == got["bytes"]



def test_a_rank_killed_before_any_reader_has_its_chunks_hides_the_version(roles):
    hub = th.start_hub(config=th.HubConfig(worker_timeout_s=3.0, heartbeat_s=0.5, suspect_s=1.0))
    try:
        shards = _publish_shards(hub, roles, 2, seed=7)
        os.kill(shards[1]["pid"], signal.SIGKILL)
        with th.connect(hub.url, "reader", read_timeout_s=5.0, fetch_timeout_s=60.0) as client:
            with pytest.raises((TransferFailed, VersionNotFound)) as failed:  # typed, and not the fetch timeout
                client.fetch("policy", 1)
            assert "fetch timed out" not in str(failed.value)
            deadline = time.monotonic() + 30
            while client.versions("policy") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert client.versions("policy") == {}  # rank 0 alone does not make a version
            with pytest.raises(VersionNotFound):
                client.fetch("policy", "latest")
    finally:
        roles.stop_all()
        hub.stop()


def test_ranks_and_readers_re_register_after_a_hub_restart(roles):
    hub = th.start_hub()
    port = int(hub.url.rsplit(":", 1)[1])
    try:
        _publish_shards(hub, roles, 2, seed=8)
        with th.connect(hub.url, "reader-1", hub_retry_s=60.0) as first:
            first.fetch("policy", 1)
            hub.stop()
            hub = th.start_hub(port=port)  # a new instance: it knows nothing until the workers re-register
            with th.connect(hub.url, "reader-2", hub_retry_s=60.0) as second:
                deadline = time.monotonic() + 60
                while second.versions("policy") != {1: ["rank-0", "rank-1", "reader-1"]}:
                    assert time.monotonic() < deadline, second.versions("policy")
                    time.sleep(0.2)
                stats = second.fetch("policy", 1)
                assert digest(stats.buffers) == digest(shard_weights(8, 2.0))
                assert all(second.manifest("policy", 1).chunk_digests)
                assert {"rank-0", "rank-1"} & set(stats.sources), stats.sources
    finally:
        roles.stop_all()
        hub.stop()

# ------------------------------------------------------------------------------------------- pure
def test_row_range_has_torch_chunk_semantics():
    for rows in range(0, 23):
        for ranks in range(1, 9):
            pieces = torch.arange(rows).chunk(ranks) if rows else ()
            for rank in range(ranks):
                start, stop = th.row_range(rows, rank, ranks)
                expected = pieces[rank].tolist() if rank < len(pieces) else []
                assert list(range(start, stop)) == expected, (rows, rank, ranks)
    assert [th.row_range(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]  # rows < ranks
    with pytest.raises(ValueError):
        th.row_range(4, 2, 2)


def _specs():
    return (TensorSpec("a", (7, 3), "float32", 84), TensorSpec("s", (), "int64", 8),
            TensorSpec("b", (1,), "uint8", 1), TensorSpec("c", (5000,), "uint8", 5000),
            TensorSpec("e", (0, 4), "float32", 0))


def test_one_row_shard_is_todays_chunk_map_and_digest():
    specs = _specs()
    assert split_into_chunks(specs, 64, 1) == split_into_chunks(specs, 64)
    plain = Manifest("m", 1, "hf", specs, 64)
    assert plain.digest == "c68cf65d3eb5faab27298985fce77f69"  # pinned (before row shards): digests of existing layouts never move
    assert Manifest("m", 1, "hf", specs, 64, row_shards=2).digest != plain.digest


@pytest.mark.parametrize("ranks", [2, 3, 4, 9])
def test_every_chunk_holds_bytes_of_exactly_one_rank(ranks):
    specs = _specs()
    manifest = Manifest("m", 1, "hf", specs, 64, row_shards=ranks)
    owned = [shard_chunks(manifest, rank) for rank in range(ranks)]
    assert set().union(*owned) == set(range(len(manifest.chunks())))
    assert sum(len(o) for o in owned) == len(manifest.chunks())  # disjoint
    covered = {i: [] for i in range(len(specs))}
    for rank, chunks in enumerate(owned):
        for index in chunks:
            chunk = manifest.chunks()[index]
            assert chunk.nbytes <= 64
            for seg in chunk.segments:
                start, stop = shard_bytes(specs[seg.tensor], rank, ranks)
                assert start <= seg.offset and seg.offset + seg.length <= stop, (rank, seg)
                covered[seg.tensor].append((seg.offset, seg.offset + seg.length))
    for i, spans in covered.items():  # every byte once
        assert sum(b - a for a, b in spans) == specs[i].nbytes and len(set(spans)) == len(spans)
    assert shard_bytes(specs[1], 0, ranks) == (0, 8) and shard_bytes(specs[1], 1, ranks) == (8, 8)  # 0-dim: rank 0


def test_a_reader_refuses_a_region_that_does_not_cover_its_segment():
    region = msg.RegionMsg(addr=10_000, offset=4096, nbytes=4096)
    assert remote_address(region, Segment(0, 5000, 100), 8192) == 10_000 + 904
    for seg in (Segment(0, 4000, 200), Segment(0, 8000, 200)):
        with pytest.raises(ReadError, match="covers bytes"):
            remote_address(region, seg, 8192)
    assert remote_address(msg.RegionMsg(addr=7), Segment(0, 8000, 192), 8192) == 8007


# -------------------------------------------------------------------------------------- hub state
def _shard_publish(rank, ranks=2, holder=None, **extra):
    manifest = Manifest("policy", 1, "hf", (TensorSpec("w", (2048,), "float32", 8192),
                                            TensorSpec("s", (), "int64", 8)), 4096, row_shards=ranks)
    own = shard_chunks(manifest, rank)
    manifest = replace(manifest, chunk_digests=tuple(f"{i:016x}" if i in own else ""
                                                     for i in range(len(manifest.chunks()))))
    regions = []
    for spec in manifest.tensors:
        start, stop = shard_bytes(spec, rank, ranks)
        regions.append(msg.RegionMsg(addr=1 << 20, offset=start, nbytes=stop - start))
    return msg.Publish(worker=holder or f"rank-{rank}", holder=holder or f"rank-{rank}",
                       manifest=manifest_to_msg(manifest), regions=regions, shard_group="g", shard_count=ranks,
                       shard_rank=rank, **extra)


def _register(state, worker):
    state.register_worker(msg.RegisterWorker(worker=worker, location=msg.LocationMsg(), agent_name=f"{worker}-a",
                                             agent_metadata_b64="AAAA"))


def test_a_dead_rank_hides_the_version_unless_a_full_copy_covers_it():
    now = [100.0]
    state = HubState(HubConfig(worker_timeout_s=5.0), clock=lambda: now[0])
    for worker in ("rank-0", "rank-1", "rank-2"):
        _register(state, worker)
    state.publish(_shard_publish(0, 3))
    state.publish(_shard_publish(1, 3))
    assert state.versions("policy") == {}
    state.publish(_shard_publish(2, 3))
    assert state.versions("policy") == {1: ["rank-0", "rank-1", "rank-2"]}
    holders = state.status().models["policy"][0].holders
    assert [h.chunks for h in holders] == [1, 1, 1]
    assert not state.must_preserve(msg.PreserveQuery(holder="rank-0", model="policy", version=1,
                                                     layout="hf")).must_preserve
    now[0] += 3
    for worker in ("rank-0", "rank-1"):
        state.heartbeat(worker)
    now[0] += 3
    state.sweep()  # rank-2 missed its heartbeats: its chunks are gone
    assert state.versions("policy") == {}
    with pytest.raises(VersionNotFound):
        state.resolve("policy", "latest", "hf")
    _register(state, "rank-2b")  # its replacement publishes the same rank under a new name
    state.publish(_shard_publish(2, 3, holder="rank-2b"))
    assert state.versions("policy") == {1: ["rank-0", "rank-1", "rank-2b"]}


# ------------------------------------------------------------------------------------- bad input
@pytest.fixture
def api():
    server = th.start_hub()
    http = httpx.Client(base_url=server.url, timeout=10)
    credentials = {}
    for worker in ("rank-0", "rank-1", "x"):
        joined = http.post("/v1/workers/register", json={"worker": worker, "location": {},
                                                         "agent_name": f"{worker}-a", "agent_metadata_b64": "AAAA"})
        credentials[worker] = joined.json()["credential"]

    def post(path, body):
        return http.post(path, json=body, headers={CREDENTIAL_HEADER: credentials[body["worker"]]})

    assert post("/v1/publish", _shard_publish(0).model_dump()).status_code == 200
    yield http, post
    http.close()
    server.stop()


def _snapshot(http):
    status = http.get("/v1/status").json()
    return status["models"], sorted(status["workers"]), status["leases_in_flight"]


def _with(body, **changes):
    """``body`` with nested fields replaced: ``manifest__row_shards=3``, ``regions=[...]``."""
    body = json.loads(json.dumps(body))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = body
        for p in parents:
            target = target[int(p) if p.isdigit() else p]
        target[leaf] = value
    return body


def test_bad_row_shard_publishes_are_refused_and_change_nothing(api):
    http, post = api
    good = _shard_publish(1).model_dump()
    digests = [f"{i:016x}" for i in range(3)]  # rank 0 holds chunks 0-1 (w's first half, s), rank 1 chunk 2
    whole = Manifest("policy", 2, "hf", (TensorSpec("w", (2048,), "float32", 8192),), 4096)
    before = _snapshot(http)
    refused = {
        "rank out of range": (_with(good, shard_rank=2), 400),
        "a rank that is already published": (_with(good, shard_rank=0, worker="x", holder="x",
                                                   regions=_shard_publish(0).model_dump()["regions"]), 400),
        "a rank without row shards": (_with(good, manifest__row_shards=1, shard_count=1, shard_group=None), 400),
        "shard_count other than row_shards": (_with(good, shard_count=3), 400),
        "no shard group": (_with(good, shard_group=None), 400),
        "a region that starts elsewhere": (_with(good, regions__0__offset=0), 400),
        "a region of the wrong length": (_with(good, regions__0__nbytes=8192), 400),
        "a region with no length": (_with(good, regions__0__nbytes=None), 400),
        "digests of another rank's chunks": (_with(good, manifest__chunk_digests=digests), 400),
        "no digest of its own chunk": (_with(good, manifest__chunk_digests=["", "", ""]), 400),
        "another chunk map": (_with(good, manifest__chunk_bytes=8192,
                                    manifest__chunk_digests=["", digests[0]]), 409),
        "too many row shards": (_with(good, manifest__row_shards=70_000), 422),
        "a negative rank": (_with(good, shard_rank=-1), 422),
        "a whole tensor starting mid-tensor": (
            {"worker": "x", "holder": "x", "manifest": manifest_to_msg(whole).model_dump(),
             "regions": [{"addr": 4096, "offset": 4096}]}, 400),
        "a whole tensor with an empty digest": (
            {"worker": "x", "holder": "x", "manifest": manifest_to_msg(whole).model_dump() | {
                "chunk_digests": ["", "0123456789abcdef"]}, "regions": [{"addr": 4096}]}, 400),
    }
    for what, (body, status) in refused.items():
        response = post("/v1/publish", body)
        assert response.status_code == status, (what, response.text)
        assert _snapshot(http) == before, what
    begin = {"worker": "x", "holder": "x", "model": "policy", "version": 1, "layout": "hf",
             "digest": Manifest("policy", 1, "hf", (TensorSpec("w", (2048,), "float32", 8192),
                                                    TensorSpec("s", (), "int64", 8)), 4096, row_shards=2).digest,
             "regions": [{"addr": 4096, "offset": 4096}, {"addr": 4096}]}
    assert post("/v1/fetch/begin", begin).status_code == 400  # a reader's buffers are whole tensors
    assert _snapshot(http) == before
    assert post("/v1/publish", good).status_code == 200
    assert http.get("/v1/versions", params={"model": "policy"}).json()["versions"] == {"1": ["rank-0", "rank-1"]}


def test_publish_shard_checks_each_piece_against_its_rows(hub):
    full = {"w": torch.zeros(5, 3), "s": torch.tensor(2.0)}
    specs = {name: (t.shape, t.dtype) for name, t in full.items()}
    with th.connect(hub.url, "rank-1") as client:
        for pieces, match in [({"w": full["w"][:3], "s": full["s"]}, r"'w'.*rows \[3, 5\) of 5.*\[2, 3\]"),
                              ({"w": full["w"][3:5].double(), "s": full["s"]}, "'w'.*float64"),
                              ({"w": full["w"][3:5]}, "no piece of tensor 's'"),
                              ({"w": full["w"][3:5], "s": full["s"], "x": full["s"]}, "'x' is not in specs")]:
            with pytest.raises(ManifestMismatch, match=match):
                client.publish_shard("policy", 1, pieces, specs=specs, rank=1, ranks=2)
        with pytest.raises(InvalidRequest, match="rank"):
            client.publish_shard("policy", 1, {"w": full["w"][3:5], "s": full["s"]}, specs=specs, rank=2, ranks=2)
        assert client.status()["models"] == {}
