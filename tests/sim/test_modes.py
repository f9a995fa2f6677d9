"""The three modes end to end at a small scale, and the CLI contract (JSON as the last line)."""

from __future__ import annotations

import json

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.sim import cli
from tensorhub_verl.sim.modes import ModeParams, run_all

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


def test_cli_bad_params_exit_2(capsys):
    assert cli.main(["--rollouts", "10000"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "ConfigError"
