"""Quarantine alone: suspects and their end, corruption evidence, the failure counts."""

from tensorhub_verl.ros.hub.quarantine import Quarantine

KEY = ("m", 1, "hf")


def test_a_failed_read_makes_its_source_suspect_until_it_proves_alive_or_the_time_passes():
    q = Quarantine(quarantine_s=300.0, suspect_s=3.0)
    q.read_failed("s", now=10.0)
    assert q.suspect("s", 12.0) and q.next_end(12.0) == 13.0 and q.read_failures == {"s": 1}
    assert q.cleared("s") is True and not q.suspect("s", 12.0) and q.cleared("s") is False
    q.read_failed("s", now=20.0)
    assert q.expire(22.0) is False and q.expire(23.5) is True
    assert not q.suspect("s", 23.5) and q.next_end(23.5) is None


def test_the_copys_own_job_quarantines_it_another_job_keeps_only_itself_off():
    q = Quarantine(quarantine_s=300.0, suspect_s=3.0)
    assert q.report_corrupt(KEY, "h", "hw", "job-a", "r1", "job-b", protected=False, now=0.0) is False
    assert q.excluded(KEY, "h", "r2", "job-b", 1.0) and not q.excluded(KEY, "h", "r3", "job-a", 1.0)
    assert q.report_corrupt(KEY, "h", "hw", "job-a", "r3", "job-a", protected=False, now=1.0) is True
    assert q.quarantined(KEY, "h", 2.0) and q.corrupt_reads == {"hw": 2}
    assert q.expire(302.0) is True and not q.quarantined(KEY, "h", 302.0)


def test_the_last_vouched_copy_is_never_quarantined_by_reports():
    q = Quarantine(quarantine_s=300.0, suspect_s=3.0)
    assert q.report_corrupt(KEY, "h", "hw", "job-a", "r1", "job-a", protected=True, now=0.0) is False
    assert not q.quarantined(KEY, "h", 1.0) and q.excluded(KEY, "h", "r1", "job-a", 1.0)
