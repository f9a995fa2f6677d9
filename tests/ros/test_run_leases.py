"""Run leases: one lease covers consecutive chunks from one source. The planner's runs (pure), and the hub
booking, settling, draining and granting them (no processes)."""

import base64

from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.planner import HolderView, PlannerConfig, PlanRequest, SwarmView, plan_chunks
from tensorhub_verl.ros.wire.topology import Distance

from tests.ros.test_hub_state import CHUNK, make_state, manifest, publish, register
from tests.ros.test_planner import DC1_A, DC1_B, N0, N1, RACK1


def runs(needed, holders, *, needs=None, run=8, want=16, pulling=None, wan=None, seed=False, reader="r",
         location=N0, **config):
    """{first chunk: (source, count)} of the plan."""
    request = PlanRequest(reader, location, list(needed), want, may_cross_wan=seed, run_chunks=run, needs=needs)
    plan = plan_chunks(request, SwarmView(holders, pulling or {}, wan or {}), PlannerConfig(**config))
    return {a.chunk: (a.source, a.count) for a in plan}


def below(n):
    return lambda c: c < n


def test_a_run_extends_up_to_the_asked_length():
    trainer = [HolderView("trainer", N1, None)]
    assert runs([0], trainer, needs=below(100), run=5) == {0: ("trainer", 5)}
    assert runs([0], trainer, needs=below(100), run=1) == {0: ("trainer", 1)}
    assert runs([0], trainer, needs=below(3), run=5) == {0: ("trainer", 3)}  # the reader needs no more


def test_a_run_stops_at_a_chunk_the_reader_has_or_pulls():
    trainer = [HolderView("trainer", N1, None)]
    assert runs([0], trainer, needs=lambda c: c < 10 and c != 3) == {0: ("trainer", 3)}


def test_a_run_stops_where_its_source_lacks_the_next_chunk():
    peer = [HolderView("peer", N1, frozenset({0, 1, 2, 5}))]
    assert runs([0], peer, needs=below(8)) == {0: ("peer", 3)}


def test_a_run_stops_at_a_chunk_a_nearer_holder_has_or_a_nearer_reader_pulls():
    holders = [HolderView("trainer", RACK1, None), HolderView("peer", N1, frozenset({2}))]
    assert runs([0], holders, needs=below(8)) == {0: ("trainer", 2)}  # rule 1: chunk 2 is nearer on "peer"
    assert runs([0], holders[:1], needs=below(8), pulling={3: [N1]}) == {0: ("trainer", 3)}  # rule 2
    # Not nearer: a reader at the source's distance pulling chunk 3 does not stop the run.
    assert runs([0], holders[:1], needs=below(8), pulling={3: [RACK1]}) == {0: ("trainer", 8)}


def test_a_wan_run_stops_at_a_chunk_already_crossing_and_later_seeds_skip_its_chunks():
    trainer = [HolderView("trainer", N0, None)]
    assert runs([0], trainer, needs=below(8), seed=True, location=DC1_A, wan={"dc1": frozenset({5})}) == \
        {0: ("trainer", 5)}
    assert runs([0], trainer, needs=below(8), location=DC1_A) == {}  # not a seed: no WAN at all
    # Two plans of one seed in one swarm: its runs never cross twice (each counts one of the seed's WAN reads).
    plan = runs([0, 1, 2, 3, 4, 5], trainer, needs=below(6), run=2, seed=True, location=DC1_B,
                wan_reads_per_seed=2)
    assert len(plan) == 2 and all(count == 2 for _, count in plan.values())


def test_a_run_counts_as_one_read_in_flight_on_its_source():
    trainer = [HolderView("trainer", N1, None)]
    plan = runs([0, 10, 20, 30], trainer, needs=below(40), run=4, max_inflight_per_source=2)
    assert sorted(count for _, count in plan.values()) == [4, 4]
    # The fair share counts leases too.
    request = PlanRequest("r", N0, [0, 10, 20], 8, fair_share=1, run_chunks=4, needs=below(40))
    assert [(a.chunk, a.count) for a in plan_chunks(request, SwarmView(trainer), PlannerConfig())] in \
        ([(0, 4)], [(10, 4)], [(20, 4)])


def test_a_plan_assigns_every_chunk_once():
    trainer = [HolderView("a", N1, None), HolderView("b", N1, None)]
    plan = runs(range(10), trainer, run=3)
    chunks = [c for first, (_, count) in plan.items() for c in range(first, first + count)]
    assert sorted(chunks) == list(range(10)) and max(count for _, count in plan.values()) == 3


# ------------------------------------------------------------------------------------------------ the hub
def fetching(chunks=8, holders=("trainer",), grant_key=None, **config):
    state, clock = make_state(**config)
    m = manifest(chunks=chunks)
    for name in holders:
        state.register_worker(msg.RegisterWorker(
            worker=name, location=msg.LocationMsg(), agent_name=f"{name}-agent", agent_metadata_b64="bWV0YQ==",
            grant_key_b64=base64.b64encode(grant_key).decode() if grant_key else None))
        publish(state, name, m)
    register(state, "reader")
    state.begin_fetch(msg.BeginFetch(worker="reader", holder="reader", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=2000)]))
    return state, clock, m


def exchange(state, m, run=8, want=8, completed=(), failed=()):
    return state.exchange(msg.Exchange(worker="reader", holder="reader", model=m.model, version=m.version,
                                       layout=m.layout, want=want, run_chunks=run, completed=list(completed),
                                       failed=list(failed)))


def covered(assignments):
    return sorted(c for a in assignments for c in range(a.chunk, a.chunk + a.count))


def test_a_run_lease_lands_all_its_chunks_and_its_reader_serves_them():
    state, _, m = fetching(chunks=8)
    first = exchange(state, m).assignments
    assert covered(first) == list(range(8)) and len(first) <= 2  # a run from the reader's offset, and the rest
    assert state.status().leases_in_flight == len(first)
    exchange(state, m, completed=[a.lease for a in first], want=0)
    status = state.status()
    (trainer,) = [h for h in status.models["policy"][0].holders if h.holder == "trainer"]
    (reader,) = [h for h in status.models["policy"][0].holders if h.holder == "reader"]
    assert reader.chunks == 8 and trainer.served_bytes == 8 * CHUNK and status.leases_in_flight == 0
    register(state, "late")  # a late reader reads the landed run from the reader too
    state.begin_fetch(msg.BeginFetch(worker="late", holder="late", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=3000)]))
    reply = state.exchange(msg.Exchange(worker="late", holder="late", model=m.model, version=m.version,
                                        layout=m.layout, want=8, run_chunks=8))
    assert "reader" in {a.source for a in reply.assignments}


def test_a_failed_run_books_what_landed_and_plans_only_the_rest_again():
    state, _, m = fetching(chunks=8, holders=("a", "b"))
    (run,) = exchange(state, m, want=1, run=4).assignments
    assert run.count == 4
    landed = [run.chunk, run.chunk + 1]
    outside = (run.chunk + 4) % 8  # not the run's: a report of it books nothing
    again = exchange(state, m, failed=[msg.FailedRead(lease=run.lease, reason="peer gone",
                                                      landed=landed + [outside])])
    assert not set(covered(again.assignments)) & set(landed)
    assert set(range(run.chunk + 2, run.chunk + run.count)) <= set(covered(again.assignments))
    assert {a.source for a in again.assignments} == {"a", "b"} - {run.source}  # the failed source is suspect
    assert again.have == 2


def test_a_failed_runs_landed_chunks_are_not_booked_once_its_lease_was_revoked():
    state, clock, m = fetching(chunks=8, lease_ttl_s=5.0)
    (run,) = exchange(state, m, want=1).assignments
    clock.now += 6.0
    state.sweep()
    reply = exchange(state, m, want=0, failed=[msg.FailedRead(lease=run.lease, landed=[run.chunk])])
    assert run.lease in reply.revoked and reply.have == 0


def test_unpublish_drains_a_run_in_flight_as_one_read():
    state, _, m = fetching(chunks=8, lease_ttl_s=5.0)
    (run,) = exchange(state, m, want=1).assignments
    ack = state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", model="policy", version=1,
                                        layout="hf", wait_s=0.0))
    assert not ack.drained and ack.inflight == 1
    exchange(state, m, want=0, completed=[run.lease])
    ack = state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", model="policy", version=1,
                                        layout="hf", wait_s=0.0))
    assert ack.drained


def test_a_revoked_run_makes_all_its_chunks_needed_again():
    state, clock, m = fetching(chunks=8, lease_ttl_s=5.0)
    (run,) = exchange(state, m, want=1).assignments
    clock.now += 6.0
    state.sweep()
    reply = exchange(state, m, completed=[run.lease])
    assert run.lease in reply.revoked and reply.have == 0
    assert set(range(run.chunk, run.chunk + run.count)) <= set(covered(reply.assignments))


def test_a_run_grant_signs_exactly_the_runs_bytes():
    key = grants.new_key()
    state, _, m = fetching(chunks=8, grant_key=key)
    for a in exchange(state, m).assignments:
        # The trainer's one tensor lives at address 1000: the run's chunks are one contiguous range.
        assert grants.check(key, a.grant, [(1000 + a.chunk * CHUNK, a.count * CHUNK)]) is None
        assert grants.check(key, a.grant, [(1000 + a.chunk * CHUNK, (a.count + 1) * CHUNK)]) is not None
        if a.count > 1:
            assert grants.check(key, a.grant, [(1000 + a.chunk * CHUNK, CHUNK)]) is not None


def test_run_ranges_merge_contiguous_ranges_and_keep_one_chunks_ranges_as_they_are():
    assert grants.run_ranges([[(0, 4), (4, 4)]]) == [(0, 4), (4, 4)]
    assert grants.run_ranges([[(0, 4)], [(4, 4), (100, 2)], [(102, 1)]]) == [(0, 8), (100, 3)]


def test_the_wan_is_crossed_once_per_chunk_by_runs():
    state, _ = make_state(planner=PlannerConfig(seeds_per_dc=2, wan_reads_per_seed=2))
    m = manifest(chunks=16)
    register(state, "trainer", dc="dc0")
    publish(state, "trainer", m)
    crossing = []
    for r in ("x", "y"):
        register(state, r, dc="dc1", node=r)
        state.begin_fetch(msg.BeginFetch(worker=r, holder=r, model=m.model, version=m.version, layout=m.layout,
                                         digest=m.digest, regions=[msg.RegionMsg(addr=2000)]))
        reply = state.exchange(msg.Exchange(worker=r, holder=r, model=m.model, version=m.version, layout=m.layout,
                                            want=8, run_chunks=4))
        crossing += [c for a in reply.assignments if a.distance == Distance.WAN
                     for c in range(a.chunk, a.chunk + a.count)]
    assert len(crossing) > 4 and len(crossing) == len(set(crossing))


def test_the_hubs_runs_stop_at_a_chunk_a_nearer_reader_already_holds():
    state, _ = make_state()
    m = manifest(chunks=8)
    register(state, "trainer", node="far")  # the same rack, another node
    publish(state, "trainer", m)
    for name in ("mate", "reader"):
        register(state, name, node="n0")
    state.begin_fetch(msg.BeginFetch(worker="mate", holder="mate", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=3000)]))
    mate_exchange = dict(worker="mate", holder="mate", model=m.model, version=m.version, layout=m.layout)
    (lease,) = state.exchange(msg.Exchange(**mate_exchange, want=1, run_chunks=1)).assignments
    state.exchange(msg.Exchange(**mate_exchange, want=0, completed=[lease.lease]))  # the mate now holds it
    state.begin_fetch(msg.BeginFetch(worker="reader", holder="reader", model=m.model, version=m.version,
                                     layout=m.layout, digest=m.digest, regions=[msg.RegionMsg(addr=2000)]))
    reply = exchange(state, m)
    by_chunk = {c: a.source for a in reply.assignments for c in range(a.chunk, a.chunk + a.count)}
    assert by_chunk[lease.chunk] == "mate" and len(by_chunk) == 8  # the mate on this node serves its chunk
    assert any(a.count > 1 for a in reply.assignments)


def test_one_plan_hands_out_a_window_of_runs_not_one_run_over_its_candidates():
    # A plan ranks 64 candidate chunks; for runs they sit apart (chunk_index.candidate_stride), so the window of
    # 4 runs of 64 is handed out in one exchange. Consecutive candidates gave one run over them all, and the
    # reader needed an exchange per run.
    state, _, m = fetching(chunks=1024)
    first = exchange(state, m, run=64, want=4).assignments
    assert len(first) == 4 and [a.count for a in first] == [64] * 4
    assert len(set(covered(first))) == 256
    second = exchange(state, m, run=64, want=4, completed=[a.lease for a in first]).assignments
    assert len(second) == 4 and not set(covered(first)) & set(covered(second))


def test_a_cursor_passes_over_the_chunks_between_spaced_candidates_and_over_its_own_runs():
    from tensorhub_verl.ros.hub.chunk_index import NeedCursor
    from tensorhub_verl.ros.hub.lease_book import ReaderRuns
    from tensorhub_verl.ros.hub.intervals import IntervalSet

    cursor = NeedCursor("r", range(1000))
    start = cursor.candidates(IntervalSet(), frozenset(), 1)[0]
    spaced = cursor.candidates(IntervalSet(), frozenset(), 5, skip_to=lambda c: c + 10)
    assert spaced == [(start + 10 * k) % 1000 for k in range(5)]
    busy = ReaderRuns({1: (start, start + 300)})  # the reader reads a run of 300 from its first chunk
    assert cursor.candidates(IntervalSet(), busy, 2) == [(start + 300) % 1000, (start + 301) % 1000]
