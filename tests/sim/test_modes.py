"""The three modes end to end at a small scale, and the CLI contract (JSON as the last line)."""

from __future__ import annotations

import json

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim import cli
from tensorhub_dev.sim.modes import ModeParams, run_all, standalone

SMALL = dict(racks=4, nodes_per_rack=4, rollouts=6, holders=4, joiners=2, chunks=8, weights_gb=10.0)


def test_all_modes_small():
    res = run_all(ModeParams(**SMALL))
    sa, el, xdc = (res["modes"][m] for m in ("standalone", "elastic", "cross_dc"))
    assert set(sa["runs"]) == {"tensorhub", "pull_from_trainer", "ring", "tree"}
    assert sa["stall_ratio_vs"]["pull_from_trainer"] > 1
    assert el["update_ratio_vs"]["pull_from_trainer"] > 1
    assert xdc["wan_copies_per_version"] == {"tensorhub": 1.0, "pull_from_trainer": 6.0, "ring": 1.0}
    for mode in (sa, xdc):
        assert mode["runs"]["tensorhub"]["max_s"] >= mode["ideal_s"]  # nothing beats the bottleneck link


def test_params_that_do_not_fit_the_cluster():
    with pytest.raises(ConfigError, match="fit"):
        ModeParams(racks=2, nodes_per_rack=2, rollouts=3)
    with pytest.raises(ConfigError, match="trainer_nodes"):
        ModeParams(**{**SMALL, "trainer_nodes": 9})  # the trainer's half has 8 nodes
    with pytest.raises(ConfigError, match="trainer_nodes"):
        ModeParams(**{**SMALL, "chunks": 4, "trainer_nodes": 5})  # a rank would hold no chunk


def test_a_sharded_trainer_spreads_its_load_and_cuts_the_worst_stall():
    params = {**SMALL, "rollouts": 8, "chunks": 16}
    one = standalone(ModeParams(**params), strategies=("tensorhub", "pull_from_trainer"))
    four = standalone(ModeParams(**params, trainer_nodes=4), strategies=("tensorhub", "pull_from_trainer"))
    shard = params["weights_gb"] * 1e9 / 4
    by_rank = four["runs"]["tensorhub"]["trainer_bytes_by_rank"]
    assert len(by_rank) == 4 and min(by_rank) >= shard and max(by_rank) <= 1.5 * min(by_rank)
    assert four["runs"]["pull_from_trainer"]["trainer_bytes_by_rank"] == [8 * shard] * 4
    assert one["ideal_s"] == four["ideal_s"] <= four["runs"]["tensorhub"]["max_s"]
    assert four["stall_vs_ideal"] < one["stall_vs_ideal"] - 0.2


def test_unknown_mode():
    with pytest.raises(ConfigError, match="unknown mode"):
        run_all(ModeParams(**SMALL), modes=("nope",))


def test_cli_prints_json_last(capsys, tmp_path):
    out = tmp_path / "sim.json"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    assert cli.main([*args, "--modes", "standalone,cross_dc", "--out", str(out), "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(last)
    assert set(res["modes"]) == {"standalone", "cross_dc"}
    assert {r["mode"] for r in res["summary"]} == {"standalone", "cross_dc"}
    assert json.loads(out.read_text()) == res
    assert cli.main([*args, "--modes", "standalone", "--trainer-nodes", "4"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(res["modes"]["standalone"]["runs"]["tensorhub"]["trainer_bytes_by_rank"]) == 4


def test_cli_bad_params_exit_2(capsys):
    assert cli.main(["--rollouts", "10000"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "ConfigError"


def test_cli_sweep_reports_each_value_against_the_floor(capsys):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in {**SMALL, "rollouts": 8, "chunks": 16}.items()]
    assert cli.main([*args, "--modes", "standalone", "--sweep", "trainer_nodes=1,4"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sweep"]["rows"]
    assert [r["trainer_nodes"] for r in rows] == [1, 4]
    assert 1.0 <= rows[1]["vs_ideal"] < rows[0]["vs_ideal"]
    assert cli.main(["--sweep", "nope=1"]) == 2
    assert cli.main(["--sweep", "trainer_nodes=x"]) == 2


def test_deltas_run_beside_full_versions_and_move_only_the_encoded_bytes():
    p = ModeParams(**SMALL, delta_changed_fraction=0.02, delta_bytes_per_changed=1.2)
    assert p.delta_gb == pytest.approx(10.0 * 0.02 * 1.2 / 2)
    res = run_all(p, modes=("standalone", "elastic", "cross_dc"))
    assert "delta" not in res["modes"]["elastic"]  # joiners hold no base version: they read in full
    sa, xdc = res["modes"]["standalone"]["delta"], res["modes"]["cross_dc"]["delta"]
    for d, full in ((sa, res["modes"]["standalone"]), (xdc, res["modes"]["cross_dc"])):
        assert d["runs"]["tensorhub"]["max_s"] < full["runs"]["tensorhub"]["max_s"] / 10
        assert d["stall_ratio_vs_full"]["pull_from_trainer"] > full["stall_ratio_vs"]["pull_from_trainer"]
        assert d["stall_ratio_vs_delta"]["pull_from_trainer"] > 1
    # one WAN copy of the delta per datacenter; every rollout pulling it moves one copy each
    assert xdc["wan_over_delta"]["tensorhub"] == pytest.approx(1.0)
    assert xdc["wan_over_delta"]["pull_from_trainer"] == pytest.approx(SMALL["rollouts"])


def test_the_apply_rate_bounds_a_delta_stall():
    p = ModeParams(**SMALL, delta_changed_fraction=0.02, delta_apply_gbps=1.0)
    d = standalone(p.delta(), strategies=("tensorhub",))
    res = run_all(p, modes=("standalone",))["modes"]["standalone"]["delta"]
    assert res["apply_s"] == pytest.approx(10.0)
    assert res["runs"]["tensorhub"]["max_s"] == pytest.approx(10.0 + 10.0 / SMALL["chunks"])
    assert res["runs"]["tensorhub"]["transfer_max_s"] == pytest.approx(d["runs"]["tensorhub"]["max_s"])
    with pytest.raises(ConfigError, match="delta_changed_fraction"):
        ModeParams(**SMALL, delta_changed_fraction=1.5)


def test_cli_prints_the_figures_with_and_without_deltas(capsys):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    assert cli.main([*args, "--modes", "standalone,cross_dc", "--delta-changed-fraction", "0.02"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out.strip().splitlines()[-1])
    rows = {(r["mode"], r["baseline"]): r for r in res["delta_summary"]}
    assert rows[("cross_dc", "pull_from_trainer")]["ratio_vs_full"] > rows[("cross_dc", "pull_from_trainer")]["ratio_vs_delta"]
    assert "with deltas: 2% changed" in captured.err


def test_a_packed_delta_costs_the_hub_its_bytes_not_the_versions_chunks():
    hub = dict(hub_exchange_ms=0.5, run_chunks=1, real_chunk_mib=8.0)
    per_chunk = run_all(ModeParams(**SMALL, **hub, delta_changed_fraction=0.02, delta_packed=0),
                        modes=("standalone",))
    packed = run_all(ModeParams(**SMALL, **hub, delta_changed_fraction=0.02, delta_packed=1), modes=("standalone",))
    full_hub = per_chunk["modes"]["standalone"]["runs"]["tensorhub"]["hub"]
    a = per_chunk["modes"]["standalone"]["delta"]["runs"]["tensorhub"]
    b = packed["modes"]["standalone"]["delta"]["runs"]["tensorhub"]
    assert sum(a["hub"]["requests"].values()) > 10 * sum(b["hub"]["requests"].values())
    assert sum(a["hub"]["requests"].values()) >= 0.5 * sum(full_hub["requests"].values())
    assert b["max_s"] < a["max_s"]


def test_with_the_hub_modeled_a_small_packed_delta_has_as_many_simulated_chunks_as_lease_runs():
    p = ModeParams(**{**SMALL, "chunks": 64}, hub_exchange_ms=0.5, run_chunks=64, delta_changed_fraction=0.02)
    # 10 GB x 2% x 1.2 / 2 = 120 MB = 15 real 8 MiB chunks: one lease run
    assert p.delta().chunks == 1 and p.delta(hub_chunks=False).chunks == 64
    assert ModeParams(**{**SMALL, "chunks": 64}, delta_changed_fraction=0.02).delta().chunks == 64  # free hub
