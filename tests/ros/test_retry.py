"""The client's one back-off: doubling up to a cap, and a deadline no sleep crosses."""

import time

import pytest

from tensorhub_verl.ros.client.retry import Backoff


def test_the_delay_doubles_up_to_its_cap(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    backoff = Backoff(first_s=0.05, max_s=0.2)
    for _ in range(4):
        backoff.sleep()
    assert slept == [0.05, 0.1, 0.2, 0.2]


def test_jitter_only_lengthens_a_sleep(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    Backoff(first_s=0.1, max_s=1.0).sleep(jitter=0.25)
    assert 0.1 <= slept[0] <= 0.125


def test_no_sleep_may_cross_the_deadline():
    assert Backoff(first_s=0.5, deadline=time.monotonic() + 0.1).fits() is False
    assert Backoff(first_s=0.05, deadline=time.monotonic() + 60).fits() is True
    assert Backoff().fits() is True


def test_a_nonsense_backoff_is_refused():
    with pytest.raises(ValueError, match="first_s <= max_s"):
        Backoff(first_s=2.0, max_s=1.0)
