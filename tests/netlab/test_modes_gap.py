"""`bench.modes_gap` (pure): the lab's ceiling and where a reader's stall goes, from `bench modes` timelines."""

import pytest

from tensorhub_dev.bench import modes_gap

P = {"size_mb": 64.0, "chunk_mb": 2.0, "nic_mbit": 200.0, "wan_mbit": 100.0}


def test_the_ceiling_doubles_the_holders_of_the_last_chunk_every_chunk_time():
    c = modes_gap.copy_seconds(64.0, 200.0) / 33
    standalone = modes_gap.ceiling("standalone", P, 8, 33)
    # The reader that got the trainer's last chunk, then 2 more (it and the trainer send), 4, and the last one.
    assert standalone["total_s"] == pytest.approx(8 * 33 * c + (2 * 1 + 4 * 2 + 1 * 3) * c, abs=0.01)
    cross = modes_gap.ceiling("cross_dc", P, 8, 33)
    # The seed, then 1, 2 and 4 more readers inside its datacenter.
    assert cross["total_s"] == pytest.approx(8 * modes_gap.copy_seconds(64.0, 100.0) + (1 + 2 * 2 + 4 * 3) * c, abs=0.01)
    assert cross["one_copy_s"] == pytest.approx(2 * standalone["one_copy_s"], abs=0.01)


def test_a_reader_idle_between_its_reads_and_waiting_on_empty_exchanges_is_counted():
    readers = [
        {"worker": "r-0", "t0": 100.0, "seconds": 1.0, "timeline": [(0.0, 0.2, 0, "trainer"), (0.5, 1.0, 1, "r-1")],
         "exchanges": [(0.0, 0.01, 2, 1), (0.2, 0.5, 1, 0), (0.5, 0.51, 1, 1)]},
        {"worker": "r-1", "t0": 100.1, "seconds": 0.5, "timeline": [(0.0, 0.3, 1, "trainer"), (0.0, 0.4, 0, "r-0")],
         "exchanges": [(0.0, 0.01, 2, 2)]},
    ]
    result = {"params": P, "modes": {"standalone": {
        "tensorhub_s": 1.5, "ratio": 2.0, "baseline_s": {"pull_from_trainer": 3.0},
        "runs": {"tensorhub": {"readers": readers}}}}}
    gap = modes_gap.analyse(result)["standalone"]
    first, second = gap["readers"]
    assert (first["idle_s"], first["starved_s"], first["empty_exchanges"]) == (0.3, 0.3, 1)
    assert first["chunks_from"] == {"trainer": 1, "peers": 1} and second["go_s"] == pytest.approx(0.1)
    assert gap["trainer"]["reads"] == 2 and gap["spread"]["max_s"] == pytest.approx(0.6)


def test_a_peer_read_splits_into_the_reports_and_asks_that_preceded_it():
    # r-1 lands chunk 1 at 0.30, reports it with the exchange sent at 0.32 (answered 0.36); r-0 asks at 0.40,
    # gets the lease at 0.45 and posts the read at once.
    readers = [
        {"worker": "r-0", "t0": 0.0, "timeline": [(0.0, 0.2, 0, "trainer"), (0.45, 0.6, 1, "r-1")],
         "exchanges": [(0.0, 0.01, 2, 1), (0.40, 0.45, 1, 1)]},
        {"worker": "r-1", "t0": 0.0, "timeline": [(0.0, 0.3, 1, "trainer")],
         "exchanges": [(0.0, 0.01, 2, 1), (0.32, 0.36, 1, 0)]},
    ]
    h = modes_gap.hops(readers, 0.0)
    assert h["reads"] == 1
    assert (h["post_after_landing"]["p50_ms"], h["source_report_wait"]["p50_ms"], h["source_report_rtt"]["p50_ms"],
            h["reader_ask_after_report"]["p50_ms"], h["reader_ask_rtt"]["p50_ms"]) == (150.0, 20.0, 40.0, 40.0, 50.0)


def test_idle_with_work_counts_only_time_with_nothing_in_flight_after_a_peer_held_a_missing_chunk():
    readers = [
        # r-0 reads nothing from 0.2 to 1.0; r-1 holds chunk 1 from 0.3, so from 0.3 + IDLE_LAG_S r-0 idles with work.
        {"worker": "r-0", "t0": 0.0, "timeline": [(0.0, 0.2, 0, "trainer"), (1.0, 1.1, 1, "r-1")]},
        {"worker": "r-1", "t0": 0.0, "timeline": [(0.0, 0.3, 1, "trainer"), (0.3, 0.5, 0, "r-0")]},
    ]
    idle = modes_gap.idle_with_work(readers, 0.0)["readers"]
    assert idle["r-0"] == pytest.approx(1.0 - 0.3 - modes_gap.IDLE_LAG_S, abs=0.011)
    assert idle["r-1"] == 0.0, "r-1 always had a read in flight"


def test_the_goal_is_judged_against_the_ceiling_and_the_byte_floor_at_the_runs_pull():
    ceil = modes_gap.ceiling("cross_dc", P, 8, 33)
    floor = 8 * modes_gap.copy_seconds(64.0, 100.0)
    beyond = modes_gap.goal("cross_dc", 312.0, ceil, 8)
    assert not beyond["reachable"] and beyond["floor_s"] == pytest.approx(floor, abs=0.01)
    assert beyond["pull_for_goal_at_ceiling_s"] == pytest.approx(7.5 * ceil["total_s"], abs=0.1)
    assert beyond["pull_for_goal_at_floor_s"] == pytest.approx(7.5 * floor, abs=0.1)
    assert modes_gap.goal("cross_dc", 7.5 * ceil["total_s"] + 1, ceil, 8)["reachable"]


def test_the_wans_lost_time_splits_into_waiting_for_a_post_and_slow_landings():
    w = modes_gap.copy_seconds(2.0, 100.0)
    # Chunk 0 posted at 0.1 lands after its wire time; chunk 1 is posted 0.05 after that landing and lands 0.02
    # late; chunk 32 (past the version's 64 MiB: no bytes) was queued and lands at once after it.
    seed = {"worker": "seed", "t0": 0.0, "timeline": [(0.1, 0.1 + w, 0, "trainer"),
                                                      (0.15 + w, 0.17 + 2 * w, 1, "trainer"),
                                                      (0.1, 0.171 + 2 * w, 32, "trainer")]}
    wan = modes_gap.wan_pacing([seed], 0.0, P)
    assert (wan["reads"], wan["first_post_s"]) == (3, 0.1)
    assert wan["wire_s"] == pytest.approx(2 * w, abs=0.001)
    assert wan["waited_for_post_s"] == pytest.approx(0.05, abs=0.001)
    assert wan["slow_s"] == pytest.approx(0.021, abs=0.001)
    assert wan["lost_s"] == pytest.approx(wan["waited_for_post_s"] + wan["slow_s"], abs=0.002)
    assert wan["worst"][0][1] == 1


def test_the_cross_dc_gap_is_the_wans_lateness_per_reader_plus_the_tail_beyond_the_ceilings():
    ceil = modes_gap.ceiling("cross_dc", P, 2, 33)
    wan = {"reads": 33, "last_landed_s": ceil["one_copy_s"] + 0.1, "late_s": 0.1}
    rows = [{"done_s": wan["last_landed_s"]}, {"done_s": wan["last_landed_s"] + 0.3}]
    gap = modes_gap.cross_dc_gap(rows, wan, ceil, total=ceil["total_s"] + 0.6)
    assert gap["from_wan_s"] == pytest.approx(0.2) and gap["tail_s"] == pytest.approx(0.3)
    assert gap["from_tail_s"] == pytest.approx(0.3 - (ceil["total_s"] - 2 * ceil["one_copy_s"]), abs=0.01)
    assert gap["from_wan_s"] + gap["from_tail_s"] + gap["rest_s"] == pytest.approx(0.6, abs=0.02)
