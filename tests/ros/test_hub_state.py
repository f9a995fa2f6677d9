"""HubState without HTTP or processes: leases, pipelined replication, draining, retention, expiry."""

import base64

import pytest

from tensorhub_verl.errors import InvalidRequest, ManifestMismatch, UnknownFetch, UnknownWorker, VersionNotFound
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.convert import manifest_to_msg
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_verl.ros.wire.topology import Distance

CHUNK = 4096


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def manifest(version=1, chunks=4, fingerprint="f1"):
    return Manifest("policy", version, "hf", (TensorSpec("w", (chunks * CHUNK,), "uint8", chunks * CHUNK),),
                    CHUNK, fingerprint)


def make_state(**config):
    clock = Clock()
    return HubState(HubConfig(**{"require_digests": False, **config}), clock=clock), clock


def register(state, worker, dc="dc0", node="n0", spot=False):
    state.register_worker(msg.RegisterWorker(worker=worker, location=msg.LocationMsg(dc=dc, node=node), spot=spot,
                                             agent_name=f"{worker}-agent", agent_metadata_b64="bWV0YQ=="))


def publish(state, worker, m, holder=None):
    state.publish(msg.Publish(worker=worker, holder=holder or worker, manifest=manifest_to_msg(m),
                              regions=[msg.RegionMsg(addr=1000)]))


def begin(state, worker, m, have=()):
    state.begin_fetch(msg.BeginFetch(worker=worker, holder=worker, model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=2000)],
                                     have=list(have)))


def exchange(state, worker, m, completed=(), failed=(), want=8):
    return state.exchange(msg.Exchange(worker=worker, holder=worker, model=m.model, version=m.version,
                                       layout=m.layout, completed=list(completed), failed=list(failed), want=want))


def reader_fetching(chunks=4, **config):
    """A hub where "trainer" published ``chunks`` chunks and "reader" has begun fetching them."""
    state, clock = make_state(**config)
    m = manifest(chunks=chunks)
    register(state, "trainer")
    register(state, "reader")
    publish(state, "trainer", m)
    begin(state, "reader", m)
    return state, clock, m


def test_a_late_reader_reads_chunks_from_a_reader_still_filling():
    state, _ = make_state()
    m = manifest(chunks=8)
    for w in ("trainer", "early", "late"):
        register(state, w)
    publish(state, "trainer", m)
    begin(state, "early", m)
    first = exchange(state, "early", m, want=3)
    assert {a.source for a in first.assignments} == {"trainer"}
    exchange(state, "early", m, completed=[a.lease for a in first.assignments], want=0)
    landed = {a.chunk for a in first.assignments}
    begin(state, "late", m)
    reply = exchange(state, "late", m, want=8)
    from_early = {a.chunk for a in reply.assignments if a.source == "early"}
    assert from_early == landed  # pipelined replication: served before "early" finished
    assert any(s.holder == "early" and s.partial for s in reply.sources)


def test_unpublish_waits_for_leases_and_a_late_lease_is_revoked():
    state, clock, m = reader_fetching(lease_ttl_s=5.0)
    reply = exchange(state, "reader", m, want=2)
    ack = state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", model="policy", version=1,
                                        layout="hf", wait_s=0.0))
    assert not ack.drained and ack.inflight == 2
    # Draining: no new reads are planned from the trainer.
    assert exchange(state, "reader", m, want=2).assignments == []
    clock.now += 6.0  # past the lease deadline
    ack = state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", model="policy", version=1,
                                        layout="hf", wait_s=0.0))
    assert ack.drained
    late = exchange(state, "reader", m, completed=[a.lease for a in reply.assignments], want=0)
    assert sorted(late.revoked) == sorted(a.lease for a in reply.assignments)


def test_finished_reads_release_the_holder():
    state, _, m = reader_fetching(chunks=2)
    reply = exchange(state, "reader", m)
    exchange(state, "reader", m, completed=[a.lease for a in reply.assignments], want=0)
    ack = state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", model="policy", version=1,
                                        layout="hf", wait_s=0.0))
    assert ack.drained
    assert state.versions("policy") == {}


def test_a_failed_read_re_plans_on_another_holder():
    state, _ = make_state()
    m = manifest(chunks=1)
    for w in ("a", "b", "reader"):
        register(state, w)
    publish(state, "a", m)
    publish(state, "b", m)
    begin(state, "reader", m)
    first = exchange(state, "reader", m).assignments[0]
    second = exchange(state, "reader", m, failed=[msg.FailedRead(lease=first.lease, reason="peer gone")])
    assert [a.source for a in second.assignments] == [{"a": "b", "b": "a"}[first.source]]


def test_a_fetch_with_no_holder_left_is_unservable():
    state, clock, m = reader_fetching(chunks=2, worker_timeout_s=3.0)
    clock.now += 4.0
    state.heartbeat("reader")
    state.sweep()  # the trainer went silent
    assert exchange(state, "reader", m).unservable == [0, 1]


def test_silent_workers_expire_with_their_holdings():
    state, clock = make_state(worker_timeout_s=3.0)
    m = manifest()
    register(state, "trainer")
    register(state, "reader")
    publish(state, "trainer", m)
    clock.now += 2.0
    state.heartbeat("reader")
    clock.now += 2.0
    state.sweep()
    assert state.versions("policy") == {}
    with pytest.raises(UnknownWorker):
        state.heartbeat("trainer")
    state.heartbeat("reader")


def _loop_turns(state, clock, seconds, heartbeat=()):
    """The hub's event loop turning normally for ``seconds``: the probe ticks, the sweeper sweeps."""
    for _ in range(round(seconds / 0.1)):
        clock.now += 0.1
        state.stall.tick()
        for worker in heartbeat:
            state.heartbeat(worker)
        state.sweep()


def test_a_hub_whose_own_loop_stalled_does_not_drop_the_workers_it_could_not_hear():
    state, clock = make_state(worker_timeout_s=10.0)
    m = manifest()
    register(state, "trainer")
    register(state, "reader")
    publish(state, "trainer", m)
    _loop_turns(state, clock, 1.0, heartbeat=["trainer", "reader"])
    clock.now += 15.0  # the hub starved of CPU: no tick, no heartbeat read, but the sweeper thread runs
    state.sweep()
    assert state.versions("policy") == {1: ["trainer"]}, "live workers were dropped for the hub's own stall"
    state.stall.tick()  # the loop turns again and reads the trainer's queued heartbeat; the reader has died
    state.heartbeat("trainer")
    _loop_turns(state, clock, 9.0, heartbeat=["trainer"])
    assert sorted(state.status().workers) == ["reader", "trainer"]  # 9 s awake: within the timeout
    _loop_turns(state, clock, 1.5, heartbeat=["trainer"])
    assert sorted(state.status().workers) == ["trainer"]  # a dead worker still goes after 10 s awake


def test_without_a_loop_probe_silence_is_wall_clock_silence():
    state, clock = make_state(worker_timeout_s=10.0)
    register(state, "trainer")
    clock.now += 10.5
    state.sweep()
    assert state.status().workers == {}


def test_retention_asks_holders_to_drop_old_versions():
    state, _ = make_state(keep_versions=2)
    register(state, "trainer")
    for v in (1, 2, 3):
        publish(state, "trainer", manifest(version=v))
    release = state.heartbeat("trainer").release
    assert [(k.model, k.version) for k in release] == [("policy", 1)]


def test_last_reliable_copy_of_a_retained_version_must_be_preserved():
    state, _ = make_state(keep_versions=2)
    register(state, "trainer")
    register(state, "spot", spot=True)
    publish(state, "trainer", manifest(version=1))
    publish(state, "spot", manifest(version=1))
    query = msg.PreserveQuery(holder="trainer", model="policy", version=1, layout="hf")
    assert state.must_preserve(query).must_preserve  # a spot copy does not count
    register(state, "reliable")
    publish(state, "reliable", manifest(version=1))
    assert not state.must_preserve(query).must_preserve
    assert not state.must_preserve(msg.PreserveQuery(holder="spot", model="policy", version=1,
                                                     layout="hf")).must_preserve


@pytest.mark.parametrize("seeds", [1, 2])
def test_exactly_seeds_per_dc_readers_cross_the_wan_each_holding_wan_reads_per_seed(seeds):
    state, _ = make_state(planner=PlannerConfig(seeds_per_dc=seeds, wan_reads_per_seed=2))
    m = manifest(chunks=8)
    register(state, "trainer", dc="dc0")
    for r in ("x", "y", "z"):
        register(state, r, dc="dc1", node=r)
    publish(state, "trainer", m)
    crossing = {}
    for r in ("x", "y", "z"):
        begin(state, r, m)
        crossing[r] = [a for a in exchange(state, r, m).assignments if a.source == "trainer"]
    assert [len(crossing[r]) for r in ("x", "y", "z")] == [2, 2 if seeds == 2 else 0, 0]
    chunks = [a.chunk for r in crossing for a in crossing[r]]
    assert len(chunks) == len(set(chunks)), "a chunk crosses the WAN once per datacenter"
    # The seed's next WAN read comes only when one of its two lands.
    assert [a for a in exchange(state, "x", m).assignments if a.source == "trainer"] == []
    refill = exchange(state, "x", m, completed=[crossing["x"][0].lease]).assignments
    assert [a.source for a in refill if a.distance == Distance.WAN] == ["trainer"]


def test_republishing_other_bytes_under_a_published_version_is_refused():
    state, _ = make_state()
    register(state, "a")
    register(state, "b")
    publish(state, "a", manifest(fingerprint="one"))
    with pytest.raises(ManifestMismatch, match="different bytes"):
        publish(state, "b", manifest(fingerprint="two"))
    assert state.versions("policy") == {1: ["a"]}


def test_unknown_versions_and_fetches_are_typed_errors():
    state, _ = make_state()
    register(state, "r")
    with pytest.raises(VersionNotFound, match="no published version"):
        state.resolve("policy", "latest", "hf")
    with pytest.raises(VersionNotFound):
        begin(state, "r", manifest())
    with pytest.raises(UnknownFetch):
        exchange(state, "r", manifest())


def test_a_restarted_hub_rebuilds_from_re_registration():
    old, _ = make_state()
    m = manifest(chunks=4)
    register(old, "trainer")
    register(old, "reader")
    publish(old, "trainer", m)
    begin(old, "reader", m)
    new, _ = make_state()  # the restart: nothing carried over
    register(new, "trainer")
    publish(new, "trainer", m)
    register(new, "reader")
    begin(new, "reader", m, have=[0, 1])
    reply = exchange(new, "reader", m)
    assert sorted(a.chunk for a in reply.assignments) == [2, 3] and reply.have == 2


def test_malformed_manifests_are_refused_and_change_nothing():
    state, _ = make_state()
    register(state, "a")
    bad = Manifest("policy", 1, "hf", (TensorSpec("w", (10,), "float32", 10),), CHUNK)
    with pytest.raises(InvalidRequest, match="nbytes"):
        publish(state, "a", bad)
    assert state.versions("policy") == {}


def test_an_engines_shards_become_visible_only_together():
    state, _ = make_state()
    register(state, "engine-1")

    def shard(rank):
        m = Manifest("policy", 5, f"vllm/qwen2/tp2/rank{rank}", (TensorSpec("w", (CHUNK,), "uint8", CHUNK),), CHUNK)
        state.publish(msg.Publish(worker="engine-1", holder=f"engine-1~r{rank}", manifest=manifest_to_msg(m),
                                  regions=[msg.RegionMsg(addr=1000)], shard_group="engine-1", shard_count=2))

    shard(0)
    assert state.versions("policy") == {}
    with pytest.raises(VersionNotFound):
        state.resolve("policy", "latest", "vllm/qwen2/tp2/rank0")
    shard(1)
    assert state.versions("policy") == {5: ["engine-1"]}
    assert state.resolve("policy", "latest", "vllm/qwen2/tp2/rank1") == 5
    with pytest.raises(InvalidRequest, match="shard_group"):
        state.publish(msg.Publish(worker="engine-1", holder="engine-1~x", manifest=manifest_to_msg(manifest()),
                                  regions=[msg.RegionMsg(addr=1)], shard_count=2))


def test_readers_filling_at_once_share_a_holders_slots():
    state, _ = make_state(planner=PlannerConfig(max_inflight_per_source=8))
    m = manifest(chunks=16)
    for w in ("trainer", "a", "b", "c", "d"):
        register(state, w)
    publish(state, "trainer", m)
    begin(state, "a", m)
    assert len(exchange(state, "a", m, want=8).assignments) == 8  # alone, it may use every slot
    state2, _ = make_state(planner=PlannerConfig(max_inflight_per_source=8))
    for w in ("trainer", "a", "b", "c", "d"):
        register(state2, w)
    publish(state2, "trainer", m)
    for w in ("a", "b", "c", "d"):
        begin(state2, w, m)
    got = {w: len(exchange(state2, w, m, want=8).assignments) for w in ("a", "b", "c", "d")}
    assert got == {"a": 2, "b": 2, "c": 2, "d": 2}  # 8 slots shared by 4 filling readers


def test_a_reader_gets_a_holders_addresses_only_for_its_leases_and_metadata_once():
    state, _ = make_state()
    m = Manifest("policy", 1, "hf", tuple(TensorSpec(f"w{i}", (CHUNK,), "uint8", CHUNK) for i in range(4)), CHUNK)
    register(state, "trainer")
    register(state, "reader")
    state.publish(msg.Publish(worker="trainer", holder="trainer", manifest=manifest_to_msg(m),
                              regions=[msg.RegionMsg(addr=1000 * (i + 1)) for i in range(4)]))
    begin_regions = [msg.RegionMsg(addr=9000 + i) for i in range(4)]
    state.begin_fetch(msg.BeginFetch(worker="reader", holder="reader", model="policy", version=1, layout="hf",
                                     digest=m.digest, regions=begin_regions))
    first = exchange(state, "reader", m, want=1)
    (info,) = first.sources
    (lease,) = first.assignments
    assert set(info.regions) == {lease.chunk} and info.agent_metadata_b64  # one chunk = one tensor here
    second = state.exchange(msg.Exchange(worker="reader", holder="reader", model="policy", version=1, layout="hf",
                                         completed=[lease.lease], want=1,
                                         known_sources={"trainer": info.generation}))
    (again,) = second.sources
    assert again.agent_metadata_b64 == ""  # known generation: no metadata resent
    assert set(again.regions) == {second.assignments[0].chunk}


def test_an_exchange_repeated_after_its_reply_was_lost_books_its_reads_once():
    # The client repeats a request whose reply timed out. The first try already booked the landed reads: the
    # repeat must not call them revoked, or the reader re-reads chunks the hub will never plan again (it counts
    # them held) and the fetch starves until its deadline.
    state, _, m = reader_fetching(chunks=4)
    leases = [a.lease for a in exchange(state, "reader", m, want=4).assignments]
    exchange(state, "reader", m, completed=leases, want=0)  # its reply is lost
    repeated = exchange(state, "reader", m, completed=leases, want=0)
    assert repeated.revoked == [] and repeated.have == 4 == repeated.total
    # A lease that was never issued is still revoked: the reader must read that chunk again.
    assert exchange(state, "reader", m, completed=[10_000], want=0).revoked == [10_000]


def test_a_restarted_hub_never_reissues_the_lease_ids_of_the_instance_before_it():
    # A reader still reports reads leased by the old instance; the same id from the new one would book the read
    # for another chunk.
    issued = []
    for _instance in range(2):
        state, _, m = reader_fetching(chunks=4)
        issued.append({a.lease for a in exchange(state, "reader", m, want=4).assignments})
    assert len(issued[0]) == len(issued[1]) == 4 and not issued[0] & issued[1]


def test_a_joiner_is_named_the_nearest_holders_of_the_newest_versions_whose_planes_check_grants():
    """Registration's reply names likely sources so the joiner connects early, but only workers whose data
    plane checks a grant on every read (for them the metadata is an address, not a capability), that served
    reads at the address they registered from, only holders of a model's newest version, nearest first, at
    most as many as asked, never the joiner itself."""
    from tensorhub_verl.ros.planes import tcp_wire

    state, _ = make_state()
    key = base64.b64encode(bytes(32)).decode()

    def metadata(worker, host="127.0.0.1", port=4000):
        return base64.b64encode(tcp_wire.encode_metadata(f"{worker}-agent", host, port)).decode()

    def join(worker, dc, node, preconnect=0, grant=True, credential="", host="127.0.0.1", port=4000):
        return state.register_worker(msg.RegisterWorker(
            worker=worker, location=msg.LocationMsg(dc=dc, node=node), agent_name=f"{worker}-agent",
            agent_metadata_b64=metadata(worker, host, port), grant_key_b64=key if grant else None,
            preconnect=preconnect), credential, registered_from="127.0.0.1")

    def served(worker):  # readers read good bytes from it (as ReadDesk._land books a landed lease)
        state.registry.get(worker).served_at_metadata += 4096

    credentials = {}
    for worker, dc, node, grant, version in [("stale", "dc0", "n1", True, 1), ("far", "dc1", "n0", True, 2),
                                             ("near", "dc0", "n1", True, 2), ("nixl", "dc0", "n1", False, 2),
                                             ("silent", "dc0", "n1", True, 2)]:
        credentials[worker] = join(worker, dc, node, grant=grant).credential
        publish(state, worker, manifest(version=version))
    for worker in ("stale", "far", "near", "nixl"):
        served(worker)
    join("elsewhere", "dc0", "n1", host="10.9.9.9")
    publish(state, "elsewhere", manifest(version=2))
    served("elsewhere")  # served, but its metadata names an address it did not register from
    assert [p.worker for p in join("joiner", "dc0", "n2", preconnect=4).peers] == ["near", "far"]
    assert [(p.agent_name, p.agent_metadata_b64) for p in join("one", "dc0", "n2", preconnect=1).peers] == \
        [("near-agent", metadata("near"))]
    assert join("unasked", "dc0", "n2").peers == []
    assert join("unchecked", "dc0", "n2", preconnect=4, grant=False).peers == []
    again = join("near", "dc0", "n1", preconnect=4, credential=credentials["near"])  # e.g. after a hub restart
    assert [p.worker for p in again.peers] == ["far"]
    # New metadata (another port): what it served before says nothing about the new address.
    join("far", "dc1", "n0", credential=credentials["far"], port=22)
    assert [p.worker for p in join("later", "dc0", "n2", preconnect=4).peers] == ["near"]
    join("newer", "dc1", "n5")
    publish(state, "newer", manifest(version=3))
    served("newer")  # named at once: no registration may see the set before it
    assert [p.worker for p in join("after", "dc0", "n2", preconnect=4).peers] == ["newer"]


