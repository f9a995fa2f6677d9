"""Rule 5's first reads through the hub's own state (no processes): a reader that holds no chunk of the version yet
takes at most ``PlannerConfig.first_complete_reads`` reads from the publisher, whatever its fair share."""

from tensorhub_verl.ros.hub.planner import PlannerConfig

from tests.ros.test_hub_state import begin, exchange, make_state, manifest, publish, register


def test_readers_that_begin_together_each_get_a_read_of_the_publisher_and_a_window_once_one_landed():
    state, _ = make_state(planner=PlannerConfig(max_inflight_per_source=8, first_complete_reads=1))
    m = manifest(chunks=16)
    readers = [f"r{i}" for i in range(6)]
    for w in ("trainer", *readers):
        register(state, w)
    publish(state, "trainer", m)
    got = {}
    for w in readers:  # each begins and asks before the next begins: the first sees itself alone (share 8)
        begin(state, w, m)
        got[w] = exchange(state, w, m, want=4).assignments
    assert {w: len(a) for w, a in got.items()} == dict.fromkeys(readers, 1)
    assert len({a[0].chunk for a in got.values()}) == len(readers)  # six different chunks to trade
    # r0 asks again before its read landed: still one read from the publisher
    assert exchange(state, "r0", m, want=3).assignments == []
    # once its chunk landed and was reported, the fair share (8 slots / 6 filling = 1) limits it, not this rule:
    # it reads the chunks its peers are about to hold from them as they land, and one more from the trainer
    again = exchange(state, "r0", m, completed=[got["r0"][0].lease], want=4).assignments
    assert [a.source for a in again] == ["trainer"]


def test_a_lone_reader_takes_a_window_after_its_first_chunk():
    state, _ = make_state(planner=PlannerConfig(max_inflight_per_source=8, first_complete_reads=1))
    m = manifest(chunks=16)
    for w in ("trainer", "reader"):
        register(state, w)
    publish(state, "trainer", m)
    begin(state, "reader", m)
    first = exchange(state, "reader", m, want=4).assignments
    assert len(first) == 1
    more = exchange(state, "reader", m, completed=[first[0].lease], want=4).assignments
    assert len(more) == 4 and {a.source for a in more} == {"trainer"}
