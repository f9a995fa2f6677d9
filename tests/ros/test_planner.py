"""The planner is a pure function: exact plans on small swarms, no processes."""

from types import SimpleNamespace

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.planner import (HolderView, PlannerConfig, PlanRequest, SwarmView, plan_chunks,
                                            reader_request, unservable)
from tensorhub_verl.ros.wire.topology import Distance, Location

N0 = Location("dc0", "r0", "n0")
N1 = Location("dc0", "r0", "n1")
RACK1 = Location("dc0", "r1", "n5")
DC1_A = Location("dc1", "r0", "a")
DC1_B = Location("dc1", "r0", "b")


def plan(reader, location, needed, holders, pulling=None, wan=None, want=16, seed=False, own_wan=0, **config):
    request = PlanRequest(reader, location, list(needed), want, may_cross_wan=seed, own_wan_reads=own_wan)
    view = SwarmView(holders, pulling or {}, wan or {})
    return {a.chunk: a.source for a in plan_chunks(request, view, PlannerConfig(**config))}


def test_prefers_the_nearest_holder():
    holders = [HolderView("far", RACK1, None), HolderView("near", N1, None)]
    assert set(plan("r", N0, range(4), holders).values()) == {"near"}


def test_spreads_chunks_over_equal_sources_by_load():
    holders = [HolderView("a", N1, None), HolderView("b", N1, None)]
    result = plan("r", N0, range(4), holders)
    assert sorted(result.values()) == ["a", "a", "b", "b"]


def test_caps_reads_in_flight_per_source():
    holders = [HolderView("a", N1, None, inflight=2)]
    assert len(plan("r", N0, range(10), holders, max_inflight_per_source=3)) == 1


def test_prefers_sources_that_served_less():
    holders = [HolderView("trainer", N1, None, served_bytes=10 << 20), HolderView("peer", N1, None)]
    assert plan("r", N0, [0], holders) == {0: "peer"}


def test_prefers_the_holder_with_fewer_reads_in_flight_over_the_one_that_served_less():
    # Bytes served count only finished reads: ranking by them first stacked reads on one busy holder.
    holders = [HolderView("busy", N1, None, inflight=3), HolderView("served", N1, None, inflight=1,
                                                                   served_bytes=10 << 20)]
    assert plan("r", N0, [0], holders) == {0: "served"}


def test_a_standby_holder_serves_only_chunks_no_holder_as_near_has():
    # A publisher's standby copy in a region fed by another region's relay: the relay, busier or not, and when its
    # slots are full the reader waits for them rather than reading from the standby.
    holders = [HolderView("trainer~standby", RACK1, None), HolderView("a0~relay", RACK1, None, inflight=2)]
    assert set(plan("r", N0, range(4), holders, max_inflight_per_source=6).values()) == {"a0~relay"}
    assert list(plan("r", N0, range(6), holders, max_inflight_per_source=3).values()) == ["a0~relay"]
    peer = HolderView("peer", RACK1, frozenset({0}))  # a peer as near with chunk 0: the standby serves 1-3 alone
    assert plan("r", N0, range(4), [holders[0], peer], max_inflight_per_source=6) == {
        0: "peer", 1: "trainer~standby", 2: "trainer~standby", 3: "trainer~standby"}
    near = HolderView("trainer~standby", N1, None)  # nearer than the relay: topology first
    assert set(plan("r", N0, range(4), [near, holders[1]]).values()) == {"trainer~standby"}


def test_a_partial_holder_serves_only_what_it_has():
    holders = [HolderView("trainer", N1, None, inflight=5), HolderView("peer", N1, frozenset({1, 2}))]
    result = plan("r", N0, [0, 1, 2], holders, max_inflight_per_source=8)
    assert result[1] == "peer" and result[2] == "peer" and result[0] == "trainer"


def test_waits_for_a_chunk_already_being_pulled_from_its_only_holder():
    # Rule 3: one holder and one reader pulling chunk 0 -> the next reader takes another chunk.
    holders = [HolderView("trainer", N1, None)]
    result = plan("r2", N0, [0, 1], holders, pulling={0: [N0]})
    assert result == {1: "trainer"}


def test_waits_for_a_nearer_copy_in_flight_instead_of_reaching_far():
    # Rule 2: the only holder is in another rack, but a reader on my node is pulling the chunk.
    holders = [HolderView("trainer", RACK1, None)]
    assert plan("r", N0, [0], holders, pulling={0: [N1]}) == {}


def test_only_seeds_cross_the_wan_and_only_once_per_chunk():
    holders = [HolderView("trainer", N0, None)]
    assert plan("nonseed", DC1_A, [0, 1], holders, seed=False) == {}
    assert plan("seed", DC1_A, [0, 1], holders, seed=True) == {0: "trainer", 1: "trainer"}
    # Chunk 0 is already crossing into dc1 (another seed pulls it): the seed takes only chunk 1.
    assert plan("seed2", DC1_B, [0, 1], holders, wan={"dc1": frozenset({0})}, seed=True) == {1: "trainer"}


def test_a_seed_holds_at_most_wan_reads_per_seed_wan_reads():
    holders = [HolderView("trainer", N0, None)]
    three = plan("seed", DC1_A, range(8), holders, seed=True, wan_reads_per_seed=3)
    assert len(three) == 3 and set(three.values()) == {"trainer"}
    assert len(plan("seed", DC1_A, range(8), holders, seed=True, own_wan=2, wan_reads_per_seed=3)) == 1
    assert plan("seed", DC1_A, range(8), holders, seed=True, own_wan=3, wan_reads_per_seed=3) == {}
    # Local reads are not WAN reads: a seed with its WAN reads taken still reads what its datacenter has.
    holders.append(HolderView("peer", DC1_B, frozenset({5})))
    assert plan("seed", DC1_A, range(8), holders, seed=True, own_wan=3, wan_reads_per_seed=3) == {5: "peer"}


def test_readers_behind_the_wan_read_locally_from_a_filling_seed():
    holders = [HolderView("trainer", N0, None), HolderView("seed", DC1_A, frozenset({0, 1}))]
    assert plan("r", DC1_B, [0, 1, 2], holders) == {0: "seed", 1: "seed"}


def test_naive_mode_reads_every_chunk_from_complete_holders_without_waiting():
    holders = [HolderView("trainer", N1, None), HolderView("peer", N0, frozenset({0}))]
    result = plan("r", N0, [0, 1], holders, pulling={0: [N0], 1: [N0]}, cooperative=False,
                  max_inflight_per_source=64)
    assert result == {0: "trainer", 1: "trainer"}


def test_readers_start_on_different_chunks():
    holders = [HolderView("trainer", N1, None)]
    firsts = {next(iter(plan(f"reader-{i}", N0, range(64), holders, want=1))) for i in range(8)}
    assert len(firsts) > 4


def test_unservable_lists_chunks_nobody_has_or_pulls():
    holders = [HolderView("peer", N1, frozenset({0}))]
    view = SwarmView(holders, {1: [N1]}, {})
    assert unservable([0, 1, 2], view, "r") == [2]


def test_distance_order():
    assert N0.distance(N0) == Distance.SAME_NODE
    assert N0.distance(N1) == Distance.SAME_RACK
    assert N0.distance(RACK1) == Distance.SAME_DC
    assert N0.distance(DC1_A) == Distance.WAN


@pytest.mark.parametrize("field", ["max_inflight_per_source", "seeds_per_dc", "wan_reads_per_seed",
                                   "first_complete_reads"])
def test_config_rejects_nonsense(field):
    with pytest.raises(ConfigError, match=field):
        PlannerConfig(**{field: 0})


def test_a_fair_share_keeps_one_reader_from_taking_every_slot():
    holders = [HolderView("trainer", N1, None)]
    assert len(plan("r", N0, range(8), holders, max_inflight_per_source=8)) == 8
    request = PlanRequest("r", N0, list(range(8)), 8, own_inflight={"trainer": 1}, fair_share=2)
    assert len(plan_chunks(request, SwarmView(holders), PlannerConfig(max_inflight_per_source=8))) == 1


def _first_plan(reader, location, holders, *, held, filling=1, seeds=(),
                config=PlannerConfig(first_complete_reads=1)):
    """A window-4 reader's plan as the hub asks it (``reader_request``), for 8 chunks."""
    request, _ = reader_request(reader, location, list(range(8)), 4, seeds=list(seeds), filling=filling,
                                own_inflight={}, own_wan_reads=0, config=config, held=held)
    return plan_chunks(request, SwarmView(holders), config)


def test_a_reader_with_no_chunk_yet_takes_one_read_from_the_publisher():
    # Readers that begin together: the first to ask sees itself alone (fair share 8) and would take a whole
    # window of the trainer's slots; with one each, the next seven get a chunk of their own to trade.
    trainer = [HolderView("trainer", N1, None)]
    assert [a.source for a in _first_plan("r", N0, trainer, held=0)] == ["trainer"]
    assert len(_first_plan("r", N0, trainer, held=0, config=PlannerConfig(first_complete_reads=2))) == 2
    assert len(_first_plan("r", N0, trainer, held=0, config=PlannerConfig())) == 4  # off by default
    # once it holds a chunk, only the fair share limits it
    assert len(_first_plan("r", N0, trainer, held=1)) == 4
    assert len(_first_plan("r", N0, trainer, held=1, filling=4)) == 2


def test_the_first_read_cap_leaves_peers_and_the_wan_alone():
    # A reader holding nothing still reads a window from filling peers (partial holders) ...
    peers = [HolderView("p1", N1, frozenset(range(8))), HolderView("p2", N1, frozenset(range(8)))]
    plan = _first_plan("r", N0, peers, held=0)
    assert len(plan) == 4 and {a.source for a in plan} == {"p1", "p2"}
    # ... and a datacenter's seed crosses the WAN with all its WAN reads (rule 4 paces it, not rule 5).
    far = [HolderView("trainer", DC1_A, None)]
    wan = _first_plan("seed", N0, far, held=0, seeds=["seed"])
    assert [a.distance for a in wan] == [Distance.WAN] * PlannerConfig().wan_reads_per_seed


def test_planning_from_the_chunk_index_gives_the_plan_the_full_walk_gives():
    # The hub looks partial holders up per chunk (SwarmView.partial_holders) instead of walking every holder's
    # chunks: on a random swarm both ways must plan exactly the same reads.
    import random

    rng = random.Random(7)
    locations = [N0, N1, RACK1, DC1_A]
    for trial in range(50):
        holders = [HolderView("trainer", locations[trial % 4], None, inflight=rng.randrange(3))]
        for i in range(6):
            chunks = frozenset(c for c in range(40) if rng.random() < 0.3)
            holders.append(HolderView(f"p{i}", rng.choice(locations), chunks, inflight=rng.randrange(3),
                                      published=rng.random() < 0.3))
        by_chunk: dict[int, list[HolderView]] = {}
        for h in holders[1:]:
            for c in h.chunks:
                by_chunk.setdefault(c, []).append(h)
        pulling = {c: [rng.choice(locations)] for c in range(40) if rng.random() < 0.2}
        def stretch(chunk):  # the holders of ``chunk`` and where the same holders end
            names, end = {h.holder for h in by_chunk.get(chunk, [])}, chunk + 1
            while end < 40 and {h.holder for h in by_chunk.get(end, [])} == names:
                end += 1
            return by_chunk.get(chunk, []), rng.randrange(chunk + 1, end + 1)  # any end up to there is right

        request = PlanRequest("p0", N0, [c for c in range(40) if c not in holders[1].chunks], 8)
        for cooperative, limit in ((True, None), (False, None), (True, 2), (False, 2)):
            config = PlannerConfig(cooperative=cooperative, max_partial_sources=limit)
            walked = plan_chunks(request, SwarmView(holders, pulling), config)
            indexed = plan_chunks(request, SwarmView(holders, pulling, partial_holders=lambda c: by_chunk.get(c, [])),
                                  config)
            stretched = plan_chunks(request, SwarmView(holders, pulling, partial_holders=lambda c: by_chunk.get(c, []),
                                                       partial_stretch=stretch), config)
            assert walked == indexed == stretched


def test_runs_from_interval_lookups_are_the_runs_a_chunk_by_chunk_walk_gives():
    # The hub extends a run by interval lookups (holders' IntervalSets, the lease book's PullIndex and WAN
    # coverage, SwarmView.nearer_holders, PlanRequest.needs_until); the simulator and the tests walk chunk by
    # chunk. On random swarms of runs both must plan exactly the same reads.
    import random

    from tensorhub_verl.ros.hub.chunk_index import ChunkIndex
    from tensorhub_verl.ros.hub.lease_book import PullIndex
    from tensorhub_verl.ros.hub.intervals import Coverage, IntervalSet, first_held

    rng = random.Random(11)
    locations = [N0, N1, RACK1, DC1_A, DC1_B]
    total = 120
    lengths, stretches = [], []

    def runs_of(p):  # chunks in random runs, as a swarm of run leases leaves them
        chunks = set()
        for _ in range(rng.randrange(6)):
            start = rng.randrange(total)
            chunks.update(range(start, min(total, start + rng.randrange(1, 30))))
        return chunks if rng.random() < p else set()

    for trial in range(300):
        here = rng.choice(locations)
        walked_holders = [HolderView("trainer", rng.choice(locations), None, inflight=rng.randrange(3))]
        indexed_holders = list(walked_holders)
        for i in range(6):
            chunks, where, inflight = runs_of(0.9), rng.choice(locations), rng.randrange(3)
            walked_holders.append(HolderView(f"p{i}", where, frozenset(chunks), inflight=inflight))
            indexed_holders.append(HolderView(f"p{i}", where, IntervalSet(chunks), inflight=inflight))
        pulling_walk: dict[int, list[Location]] = {}
        pulling_index = PullIndex()
        for _ in range(rng.randrange(8)):
            start, where = rng.randrange(total), rng.choice(locations)
            end = min(total, start + rng.randrange(1, 40))
            pulling_index.add(start, end, where)
            for c in range(start, end):
                pulling_walk.setdefault(c, []).append(where)
        crossing = runs_of(0.5)
        wan_index = Coverage()
        for c in crossing:
            wan_index.add(c, c + 1)
        have, pulling_mine = runs_of(1.0), runs_of(0.5)
        needed = [c for c in range(total) if c not in have and c not in pulling_mine][:rng.randrange(1, 40)]
        needs = lambda c: c < total and c not in have and c not in pulling_mine  # noqa: E731
        have_set, mine_set = IntervalSet(have), IntervalSet(pulling_mine)

        def needs_until(start, end):
            return first_held(mine_set, start, first_held(have_set, start, min(end, total)))

        def nearer(location, distance):
            return [h for h in indexed_holders[1:] if location.distance(h.location) < distance]

        index = ChunkIndex(total)  # the hub's index of partial holders, looked up once per stretch
        for h in indexed_holders[1:]:
            index.enter(SimpleNamespace(holder=h.holder, state="active", chunks=h.chunks, need=None,
                                        unserved=frozenset()), h.location)
        by_name = {h.holder: h for h in indexed_holders}
        limit = rng.choice((None, 1, 2))  # the planner's cap on partial holders per chunk, or none

        def stretch(chunk):
            names, end = index.stretch(chunk)
            stretches.append(end - chunk)
            if limit is not None:  # as the hub does: whole places, nearest first, until the cap is reached
                kept = []
                for _, tier in index.near_first(names, here):
                    kept += sorted(n for n in tier if n != "p0")  # the reader is no source of its own
                    if len(kept) >= limit:
                        break
                names = kept
            return [by_name[n] for n in sorted(names)], end

        request = dict(reader="p0", location=here, needed=needed, max_assignments=rng.randrange(1, 9),
                       may_cross_wan=rng.random() < 0.5, run_chunks=rng.choice((2, 8, 64)))
        config = PlannerConfig(max_partial_sources=limit)
        walked = plan_chunks(PlanRequest(**request, needs=needs),
                             SwarmView(walked_holders, pulling_walk, {here.dc: frozenset(crossing)}), config)
        indexed = plan_chunks(PlanRequest(**request, needs=needs, needs_until=needs_until),
                              SwarmView(indexed_holders, pulling_index, {here.dc: wan_index},
                                        nearer_holders=nearer), config)
        stretched = plan_chunks(PlanRequest(**request, needs=needs, needs_until=needs_until),
                                SwarmView(indexed_holders[:1], pulling_index, {here.dc: wan_index},
                                          partial_stretch=stretch, nearer_holders=nearer), config)
        assert walked == indexed == stretched, (trial, limit, walked, indexed, stretched)
        lengths += [(a.count, request["run_chunks"]) for a in walked]
    assert sum(n > 1 for n, _ in lengths) > 100  # runs were made, and cut short by the swarm
    # holders looked up once per stretch, not per chunk (these swarms' runs are short: filed chunk by chunk)
    assert sum(stretches) > 1.5 * len(stretches)
    assert sum(1 < n < cap for n, cap in lengths) > 50


def test_a_plan_considers_only_the_nearest_partial_holders_spread_by_reader():
    # With a cap of 2 partial holders per chunk, a reader never reaches past the 2 nearest holders of a chunk
    # (so the plan's work is bounded whatever the number of holders), and readers of one rack spread over its
    # equally near holders instead of all taking the same two.
    from tensorhub_verl.ros.hub.planner import nearest_partial

    rack = [HolderView(f"h{i}", Location("dc0", "r0", f"n{i + 2}"), frozenset({0})) for i in range(8)]
    node_peer = HolderView("peer", N0, frozenset({0}))  # on the reader's node
    config = PlannerConfig(max_partial_sources=2)
    request = PlanRequest("r", N0, [0], 1)
    sources = {a.source for a in plan_chunks(request, SwarmView([node_peer, *rack]), config)}
    assert sources == {"peer"}  # the nearest is always among those considered
    chosen = {h.holder for reader in (f"r{i}" for i in range(16))
              for h in nearest_partial(rack, N0, reader, 2)}
    assert len(chosen) >= 6  # 16 readers pick 2 each: not the same 2
    assert nearest_partial(rack, N0, "r", 2) == nearest_partial(list(reversed(rack)), N0, "r", 2)
    with pytest.raises(ConfigError, match="max_partial_sources"):
        PlannerConfig(max_partial_sources=0)
