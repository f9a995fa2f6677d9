"""Readers' reports against a delta form (ros/hub/delta_rules.py): only the model's owning job withholds it."""

import pytest

from tensorhub_verl.errors import DeltaRefused, DeltaWithheld
from tensorhub_verl.ros.hub.delta_rules import check_delta_listed, report_bad_delta
from tensorhub_verl.ros.hub.quarantine import Quarantine

KEY = ("policy", 2, "delta/hf@1")


def test_another_jobs_reports_withhold_nothing_and_the_owning_jobs_report_withholds_the_delta():
    q = Quarantine(quarantine_s=300, suspect_s=5)
    for i in range(10):
        assert not report_bad_delta(q, KEY, f"stranger-{i}", "job-b", "", now=1.0)
    check_delta_listed(q, KEY, now=2.0)  # still listed for everyone
    assert report_bad_delta(q, KEY, "rollout-1", "job-a", "job-a", now=3.0)
    with pytest.raises(DeltaWithheld, match="read v2 in full"):
        check_delta_listed(q, KEY, now=4.0)
    check_delta_listed(q, KEY, now=400.0)  # the quarantine's time is over


def test_a_report_against_a_layout_that_is_not_a_delta_is_refused():
    with pytest.raises(DeltaRefused, match="not a delta"):
        report_bad_delta(Quarantine(300, 5), ("policy", 2, "hf"), "r", "job-a", "job-a", now=1.0)
