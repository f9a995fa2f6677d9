"""The simulator on the lab's topologies: exact schedules where they are known, and the comparison rows."""

from __future__ import annotations

import json

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim import calibrate as cal
from tensorhub_dev.sim.calibrate import LabWorkload, binomial_parents, compare, lab_cluster, simulate_lab

MIB = 1 << 20


def test_lab_cluster_matches_the_bench_topology():
    w = LabWorkload(rollouts=8, holders=4, joiners=4)
    cluster, hosts = lab_cluster(w, "standalone")
    assert hosts == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]  # bench.modes._interleave
    assert {cluster.nodes[h].rack for h in hosts} == {"r1", "r2"}
    assert cluster.nodes["trainer"].rack == "r0" and cluster.wan_Bps is None
    xdc, hosts = lab_cluster(w, "cross_dc")
    assert hosts == [f"c{i}" for i in range(8)] and xdc.nodes["c0"].dc == "dc1"
    assert xdc.wan_Bps == 100e6 / 8
    with pytest.raises(ConfigError):
        lab_cluster(w, "nope")


def test_binomial_parents():
    # rank r (1-based among ranks 0..n, 0 = root) hangs under r with its highest bit cleared
    assert binomial_parents("t", ["r1", "r2", "r3", "r4", "r5"]) == {"r1": "t", "r2": "t", "r3": "r1", "r4": "t",
                                                                     "r5": "r1"}


def test_pull_and_broadcast_exact_times():
    # 8 MiB over 100 Mbit/s NICs: one copy takes 8 * 2**20 * 8 / 1e8 = 0.671 s.
    w = LabWorkload(size_mb=8, chunk_mb=1, rollouts=3, nic_mbit=100, window=2)
    one = 8 * MIB * 8 / 1e8
    sa = simulate_lab(w, ("standalone",))["standalone"]
    # pull: 3 copies leave the trainer's NIC, fairly shared: everyone ends at 3 copies' time.
    assert sa["pull_from_trainer"]["seconds"] == pytest.approx([3 * one] * 3)
    # binomial tree over ranks 0..3, whole buffer per hop: rank 1 and 2 at t=2 (both from rank 0, shared),
    # rank 3 (from rank 1) one copy later.
    assert sorted(sa["broadcast"]["seconds"]) == pytest.approx([2 * one, 2 * one, 3 * one])
    assert sa["tensorhub"]["max_s"] >= one - 1e-9  # nothing beats one copy over a NIC
    assert sa["tensorhub"]["total_s"] < sa["pull_from_trainer"]["total_s"]


def test_cross_dc_one_wan_copy_for_tensorhub():
    w = LabWorkload(size_mb=8, chunk_mb=1, rollouts=4)
    x = simulate_lab(w, ("cross_dc",))["cross_dc"]
    assert x["tensorhub"]["wan_bytes"] == pytest.approx(8 * MIB)
    assert x["pull_from_trainer"]["wan_bytes"] == pytest.approx(4 * 8 * MIB)


def test_elastic_joiners_read_from_peers_faster():
    w = LabWorkload(size_mb=8, chunk_mb=1, holders=2, joiners=2, busy_flows=4, join_interval_s=0.5)
    el = simulate_lab(w, ("elastic",))["elastic"]
    assert el["tensorhub"]["total_s"] < el["pull_from_trainer"]["total_s"]


def test_report_lag_slows_tensorhub_down():
    base = LabWorkload(size_mb=8, chunk_mb=1, rollouts=4)
    fast = simulate_lab(base, ("standalone",))["standalone"]["tensorhub"]["total_s"]
    slow = simulate_lab(base, ("standalone",), report_lag_s=0.2)["standalone"]["tensorhub"]["total_s"]
    assert slow > fast


def test_compare_rows_and_cli(tmp_path, capsys):
    w = LabWorkload(size_mb=4, chunk_mb=1, rollouts=2)
    sim = simulate_lab(w, ("standalone",))
    lab = {"params": {"size_mb": 4, "chunk_mb": 1, "rollouts": 2, "unrelated": 1},
           "modes": {"standalone": {"runs": {"tensorhub": {"total_s": 2 * sim["standalone"]["tensorhub"]["total_s"],
                                                           "max_s": sim["standalone"]["tensorhub"]["max_s"]}}}}}
    rows = compare(lab, sim)
    assert [(r["variant"], r["metric"]) for r in rows] == [("tensorhub", "total_s"), ("tensorhub", "max_s")]
    assert rows[0]["error"] == pytest.approx(-0.5, abs=1e-3) and rows[1]["error"] == 0
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(lab) + "\n")
    assert cal.main(["--lab-json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rows"] == rows
    assert cal.main(["--lab-json", str(tmp_path / "missing.json")]) == 2


def test_a_lab_runs_params_give_back_the_workload_it_ran():
    """The bench's JSON params carry process knobs too (progress, timeouts); the simulator keeps the workload."""
    from dataclasses import asdict

    from tensorhub_dev.bench.modes import LabBenchParams

    bench = LabBenchParams(rollouts=3, size_mb=16, progress="pump", broadcast=False)
    assert LabWorkload.from_params(asdict(bench)) == LabWorkload(rollouts=3, size_mb=16)
