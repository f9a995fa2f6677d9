"""`tensorhub bench modes` helpers (pure), and one tiny end-to-end run in the lab (netns + slow)."""

from __future__ import annotations

import json

import pytest

from tensorhub_verl.bench import modes
from tensorhub_verl.errors import ConfigError


def test_interleave_alternates_racks():
    assert modes._interleave(("a0", "a1", "a2"), ("b0",)) == ["a0", "b0", "a1", "a2"]


def test_summary_adds_sources():
    fetched = [{"seconds": 1.0, "sources": {"trainer": 3, "p": 1}, "partial_source_bytes": 1},
               {"seconds": 3.0, "sources": {"trainer": 4}, "partial_source_bytes": 0}]
    s = modes._summary(fetched)
    assert (s["max_s"], s["mean_s"], s["bytes_from"], s["partial_source_bytes"]) == (3.0, 2.0, {"p": 1, "trainer": 7}, 1)


def test_bad_params():
    with pytest.raises(ConfigError):
        modes.LabBenchParams(rollouts=0)


def test_unknown_mode_is_reported_as_json(capsys):
    assert modes.main(["--modes", "nope"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "ConfigError"


@pytest.mark.netns
@pytest.mark.slow
def test_cross_dc_tiny_run(no_leftovers, tmp_path, capsys):
    pytest.importorskip("nixl_cu12", reason="nixl-cu12 not installed")
    rc = modes.main(["--modes", "cross_dc", "--size-mb", "4", "--rollouts", "2", "--nic-mbit", "400",
                     "--wan-mbit", "200", "--json", "--plots", str(tmp_path)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, res
    xdc = res["modes"]["cross_dc"]
    assert set(xdc["tensorhub"]["bytes_from"]) <= {"trainer", "cross_dc-tensorhub-0", "cross_dc-tensorhub-1"}
    assert xdc["pull_from_trainer"]["bytes_from"].keys() == {"trainer"}
    # Every baseline reader pulled its own copy across the WAN; TensorHub crossed with fewer.
    assert xdc["wan_copies_per_version"]["pull_from_trainer"] >= 2
    assert xdc["wan_copies_per_version"]["tensorhub"] < xdc["wan_copies_per_version"]["pull_from_trainer"]
    assert (tmp_path / "modes_cross_dc.png").exists()
