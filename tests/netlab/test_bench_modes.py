"""`tensorhub bench modes` helpers (pure), and one tiny end-to-end run in the lab (netns + slow)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tensorhub_dev.bench import modes, transport_lab
from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.calibrate import interleave, lab_cluster, lab_spec


def test_interleave_alternates_racks():
    assert interleave(("a0", "a1", "a2"), ("b0",)) == ["a0", "b0", "a1", "a2"]


def test_bench_and_simulator_share_one_lab():
    p = modes.LabBenchParams(rollouts=3, holders=2, joiners=3, nic_mbit=150, wan_mbit=50)
    spec, hosts = lab_spec(p, "standalone")
    assert [[r.hosts for r in dc.racks] for dc in spec.datacenters] == \
        [[("trainer", "hub", "sink"), ("a0", "a1", "a2"), ("b0", "b1")]]
    assert hosts == ["a0", "b0", "a1", "b1", "a2"] and spec.nic_mbit == 150 and spec.wan_mbit is None
    cluster, sim_hosts = lab_cluster(p, "standalone")
    assert sim_hosts == hosts and set(cluster.nodes) == {h for dc in spec.datacenters for r in dc.racks for h in r.hosts}
    xdc, hosts = lab_spec(p, "cross_dc")
    assert [dc.name for dc in xdc.datacenters] == ["dc0", "dc1"] and hosts == ["c0", "c1", "c2"]
    assert xdc.wan_mbit == 50 and lab_cluster(p, "cross_dc")[0].nodes["c1"].dc == "dc1"


def test_summary_adds_sources():
    fetched = [{"seconds": 1.0, "sources": {"trainer": 3, "p": 1}, "partial_source_bytes": 1},
               {"seconds": 3.0, "sources": {"trainer": 4}, "partial_source_bytes": 0}]
    s = modes._summary(fetched)
    assert (s["total_s"], s["max_s"], s["mean_s"], s["bytes_from"], s["partial_source_bytes"]) == \
        (4.0, 3.0, 2.0, {"p": 1, "trainer": 7}, 1)


def test_result_keys_and_ratios():
    runs = {"tensorhub": {"total_s": 2.0, "max_s": 1.0, "seconds": [1.0, 1.0]},
            "pull_from_trainer": {"total_s": 10.0, "max_s": 6.0, "seconds": [4.0, 6.0]},
            "broadcast": {"total_s": 5.0, "max_s": 3.0, "seconds": [2.0, 3.0]}}
    r = modes._result("standalone", runs, modes.LabBenchParams(size_mb=25, nic_mbit=200))
    assert (r["tensorhub_s"], r["baseline_s"], r["ratio"], r["ratio_max"]) == \
        (2.0, {"pull_from_trainer": 10.0, "broadcast": 5.0}, 5.0, 6.0)
    assert r["ratio_vs"] == {"pull_from_trainer": 5.0, "broadcast": 2.5}
    assert r["readers"] == 2 and r["paper_ratio"] == 6.7 and r["runs"] is runs
    assert r["ideal_one_reader_s"] == pytest.approx(25 * 2**20 * 8 / 200e6, abs=1e-3)


def test_bool_flag_parses():
    assert modes._yes_no("false") is False and modes._yes_no("1") is True


def test_bad_params():
    with pytest.raises(ConfigError):
        modes.LabBenchParams(rollouts=0)


def test_unknown_mode_is_reported_as_json(capsys):
    assert modes.main(["--modes", "nope"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "ConfigError"


@pytest.mark.netns
@pytest.mark.slow
def test_cross_dc_tiny_run(no_leftovers, tmp_path, capsys):
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    rc = modes.main(["--modes", "cross_dc", "--size-mb", "4", "--rollouts", "2", "--nic-mbit", "400",
                     "--wan-mbit", "200", "--json", "--plots", str(tmp_path)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, res
    xdc = res["modes"]["cross_dc"]
    assert set(xdc["runs"]["tensorhub"]["bytes_from"]) <= {"trainer", "cross_dc-tensorhub-0", "cross_dc-tensorhub-1"}
    assert xdc["runs"]["pull_from_trainer"]["bytes_from"].keys() == {"trainer"}
    assert {"tensorhub_s", "baseline_s", "ratio", "wan_bytes"} <= xdc.keys()
    assert {r["mode"] for r in res["sim_vs_lab"]} == {"cross_dc"}
    # Every baseline reader pulled its own copy across the WAN; TensorHub crossed with fewer.
    assert xdc["wan_copies_per_version"]["pull_from_trainer"] >= 2
    assert xdc["wan_copies_per_version"]["tensorhub"] < xdc["wan_copies_per_version"]["pull_from_trainer"]
    assert {p.name for p in tmp_path.glob("*.png")} == {"lab_modes.png", "time_vs_readers.png", "time_vs_size.png"}


@pytest.mark.netns
def test_bench_transport_in_the_lab_compares_with_raw_flows_over_the_same_shaped_nics(no_leftovers, capsys):
    """`bench transport-lab --lab-mbit`: every process on its own host; rows for each reader count, TensorHub's
    readers serve each other (peer bytes), the raw flows all leave the holder's NIC."""
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    assert transport_lab.main(["--lab-mbit", "400", "--size-mb", "4", "--chunk-mb", "0.5", "--window", "4",
                           "--readers", "1,3", "--repeats", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    one, three = res["rows"]
    assert (one["readers"], three["readers"]) == (1, 3)
    assert one["peer_fraction"] == 0 and three["peer_fraction"] > 0
    for row in res["rows"]:
        assert row["tensorhub_mbit_s"] > 0 and row["raw_socket_mbit_s"] > 0 and row["ratio"] > 0


@pytest.mark.netns
@pytest.mark.slow
def test_raw_flows_over_the_cross_dc_wan_fill_it(no_leftovers, capsys):
    """`bench.wan_raw`: one plain TCP flow over the lab's shaped WAN reaches its rate (headers counted; tbf's burst
    lets the first 125 kB through at once), and flows to every reader at once carry one copy each."""
    from tensorhub_dev.bench import wan_raw

    assert wan_raw.main(["--size-mb", "8", "--rollouts", "2", "--wan-mbit", "200"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.8 < res["one_flow"]["of_floor"] <= 1.1, res
    assert res["all_flows"]["flows"] == 2 and res["all_flows"]["total_s"] >= 2 * res["floor_one_copy_s"] * 0.9
