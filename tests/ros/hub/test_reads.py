"""The read path's glue alone, over real parts: it plans a reader on a serving holder, keeps it off suspects and
off another job's NIXL holder, and issues a lease for each read."""

import itertools

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.leases import Leases
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.reads import ReadDesk
from tensorhub_verl.ros.hub.registry import Registry
from tensorhub_verl.ros.hub.planner import PlannerConfig, holder_hash, reader_salt
from tensorhub_verl.ros.wire.topology import Location

from tests.ros.hub.parts import holding, manifest, record_of, worker

KEY = ("policy", 1, "hf")


def _desk(source_job="default", nixl_within_job=True):
    registry = Registry("hub1", worker_timeout_s=10.0)
    registry.put(worker("s", job=source_job))
    registry.put(worker("r"))
    record = record_of(manifest(chunks=4))
    record.put(holding("s"), Location())
    reader = holding("r", state="filling", chunks=[])
    record.put(reader, Location())
    desk = ReadDesk(registry, Leases(), Quarantine(300.0, 3.0), PlannerConfig(), 30.0, nixl_within_job)
    return desk, record, reader


def _exchange():
    return msg.Exchange(worker="r", holder="r", model="policy", version=1, layout="hf", want=4)


def test_a_reader_is_planned_on_the_serving_holder_and_gets_a_lease_per_read():
    desk, record, reader = _desk()
    assignments, _, _ = desk.plan(KEY, record, reader, Location(), 4, 1, now=0.0)
    assert assignments and {a.source for a in assignments} == {"s"}
    reply = desk.lease(_exchange(), KEY, record, reader, Location(), assignments, set(), lambda: [],
                       ids=itertools.count(1), now=0.0)
    assert len(reply.assignments) == len(assignments) == len(desk.leases)
    assert reply.sources[0].agent_metadata_b64 == "AAAA" and reply.assignments[0].grant == "", "NIXL: no grant"
    assert desk.waits_for_work(KEY, record, reader) is False, "its reads are in flight"


def test_a_suspect_source_and_another_jobs_nixl_holder_serve_no_reads():
    desk, record, reader = _desk()
    desk.quarantine.read_failed("s", now=0.0)
    assert desk.plan(KEY, record, reader, Location(), 4, 1, now=1.0)[0] == []
    desk, record, reader = _desk(source_job="other")
    assert desk.plan(KEY, record, reader, Location(), 4, 1, now=0.0)[0] == []
    desk, record, reader = _desk(source_job="other", nixl_within_job=False)
    assert desk.plan(KEY, record, reader, Location(), 4, 1, now=0.0)[0] != []


def test_a_plan_considers_the_places_first_holders_in_the_readers_order_only():
    """20 partial holders in the reader's rack, none on its node: the plan considers the 8 first of the rack in the
    reader's order (``planner.nearest_partial``: holder hash XOR the reader's salt) and, all idle, reads from the
    first by name among those 8, not from the first of all 20."""
    registry = Registry("hub1", worker_timeout_s=10.0)
    record = record_of(manifest(chunks=4))
    names = [f"p{i:02d}" for i in range(20)]
    for i, name in enumerate(names + ["r"]):
        where = Location(node=f"n{i}")
        source = worker(name)
        source.location = where
        registry.put(source)
        record.put(holding(name, state="filling", chunks=[] if name == "r" else range(4)), where)
    reader = record.holdings["r"]
    desk = ReadDesk(registry, Leases(), Quarantine(300.0, 3.0), PlannerConfig(max_partial_sources=8), 30.0, True)
    salt = reader_salt("r")
    considered = sorted(names, key=lambda n: (holder_hash(n) ^ salt, n))[:8]
    assert min(considered) != min(names), "the test needs a ranking that leaves the first name out"
    assignments, _, _ = desk.plan(KEY, record, reader, registry.get("r").location, 1, 4, now=0.0)
    assert [a.source for a in assignments] == [min(considered)]


def test_a_reader_is_never_planned_on_another_holding_of_its_own_worker():
    # r's CPU archive of the version (``r~cpu``, kept when it unpublished the last reliable copy) is no source for
    # r's own fetch: NIXL refuses to load an agent's own metadata, so every such read would fail and re-plan.
    desk, record, reader = _desk()
    record.put(holding("r~cpu", worker="r"), Location())
    for _ in range(4):
        assignments, _, _ = desk.plan(KEY, record, reader, Location(), 4, 1, now=0.0)
        assert assignments and {a.source for a in assignments} == {"s"}, assignments
    del record.holdings["s"]
    assert desk.plan(KEY, record, reader, Location(), 4, 1, now=0.0)[0] == []
