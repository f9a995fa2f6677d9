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
