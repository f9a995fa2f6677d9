"""`tensorhub bench soak`: versions keep flowing to readers that join, leave and die while faults strike."""

import json
import random

import pytest

from tensorhub_dev.bench import soak
from tensorhub_verl.errors import ConfigError


def test_the_fault_plan_has_every_kind_and_keeps_hub_restarts_in_the_first_half():
    for seed in range(50):
        for versions, rate in ((12, 0.5), (30, 0.2), (200, 0.5)):
            plan = soak.plan_faults(versions, rate, random.Random(seed))
            assert set(plan.values()) == set(soak.FAULTS)
            assert min(plan) >= 2  # version 1 is a warm-up
            assert all(v <= (versions + 1) // 2 for v, kind in plan.items() if kind == "hub_restart")
    assert soak.plan_faults(12, 0.0, random.Random(0)) == {}


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError):
        soak.SoakConfig(versions=1)
    with pytest.raises(ConfigError):
        soak.SoakConfig(fault_rate=1.5)


def _run(capsys, *argv: str) -> dict:
    rc = soak.main(["--json", *argv])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, report
    return report


def _check(report: dict, versions: int) -> None:
    assert report["torn_reads"] == 0 and report["hangs"] == 0, report["errors"]
    assert report["versions_published"] == versions
    assert report["versions_delivered"] > 0
    assert set(report["injected"]) == set(soak.FAULTS), report["fault_log"]
    assert report["memory_mb"]["hub"]["growth_mb"] is not None
    lost = report["time_lost_per_fault_s"]  # by fault kind, against the fault-free versions
    assert set(lost) <= {"fault_free_version_p50_s", *report["injected"]}, lost


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_soak_survives_every_kind_of_fault(capsys):
    """About 4 minutes: slow tier. Each fault alone, in the default suite: tests/ros/test_faults.py (killed,
    frozen holders, a hub restart mid-fetch, a killed reader) and tests/ros/test_bad_peers.py (garbage,
    tampering, straggling peers); the fault plan itself: the first test of this file."""
    # --seconds is only a guard against a hang: the test counts its 12 versions, however loaded the host is.
    report = _run(capsys, "--versions", "12", "--readers", "4", "--seed", "1", "--seconds", "800")
    _check(report, 12)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_long_soak(capsys):
    report = _run(capsys, "--versions", "200", "--readers", "8", "--seed", "7", "--seconds", "1200", "--churn", "0.1")
    _check(report, 200)
    assert report["faults_survived"] == report["faults_injected"], (report["errors"], report["fault_log"])
