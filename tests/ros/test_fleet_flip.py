"""The fleet flip through a real hub and real clients: each replica reports what it serves and what it holds staged
and checked; the hub commits a version once a quorum holds it, never one that failed a check anywhere, and never so
that the fleet would serve three versions; ``tensorhub status`` shows each replica's serving and staged version."""

from __future__ import annotations

import pytest

import tensorhub_verl as th
from tensorhub_verl.cli import format_status
from tensorhub_verl.errors import NotOwner


@pytest.fixture
def fleet(hub):
    clients = {name: th.connect(hub.url, name) for name in ("r0", "r1", "r2")}
    yield clients
    for c in clients.values():
        c.close()


def _round(fleet, reports, fraction=0.5):
    """Every replica reports ``(serving, pull, outcome)`` once (the hub decides as the reports come in), then asks
    again: the answers of the second pass are the round's decision. A bare version as pull means it is staged."""
    def fields(report):
        serving, pull, *outcome = report
        return {"serving": serving, "pull": pull,
                "outcome": (outcome[0] if outcome else "staged") if pull is not None else None}

    for name, report in reports.items():
        fleet[name].flip_report("policy", **fields(report), min_replica_fraction=fraction)
    return {name: fleet[name].flip_report("policy", **fields(report), min_replica_fraction=fraction)
            for name, report in reports.items()}


def test_a_quorum_commits_a_failed_check_blocks_and_a_straggler_catches_up_first(fleet):
    first = _round(fleet, {"r0": (None, 1), "r1": (None, 1), "r2": (None, 1)})
    assert {n: a.flip_to for n, a in first.items()} == {"r0": 1, "r1": 1, "r2": 1}

    # v2: r2's check fails. Quorum holds it elsewhere, yet nobody flips to it.
    second = _round(fleet, {"r0": (1, 2), "r1": (1, 2), "r2": (1, 2, "check_failed")})
    assert all(a.flip_to is None and a.committed == 1 and a.failed == [2] for a in second.values())
    assert "failed its check" in second["r0"].blocked

    # v3: r2 cannot pull it in time (unavailable: it says nothing of v3); r0 and r1 are a quorum of 0.5 and flip.
    third = _round(fleet, {"r0": (1, 3), "r1": (1, 3), "r2": (1, 3, "unavailable")})
    assert {n: a.flip_to for n, a in third.items()} == {"r0": 3, "r1": 3, "r2": None}
    # v4 staged by r0 and r1 while r2 still serves v1: a third version would be served; it waits.
    fourth = _round(fleet, {"r0": (3, 4), "r1": (3, 4), "r2": (1, None)})
    assert all(a.flip_to is None and a.committed == 3 for a in fourth.values())
    assert "more than 2 versions" in fourth["r0"].blocked
    # r2 stages the fleet's commit: it catches up first (wave 1), then v4 flips (wave 2).
    fifth = _round(fleet, {"r0": (3, 4), "r1": (3, 4), "r2": (1, 3)})
    assert [(fifth[n].flip_to, fifth[n].wave) for n in ("r0", "r1", "r2")] == [(4, 2), (4, 2), (3, 1)]
    assert (fifth["r0"].committed, fifth["r0"].previous) == (4, 3)

    status = fleet["r0"].status()["flips"]["policy"]
    assert status["committed"] == 4 and status["failed"] == [2]
    assert status["replicas"]["r2"] == {"serving": 1, "pull": 3, "outcome": "staged"}
    table = format_status(fleet["r0"].status())
    assert "fleet flip of policy: committed v4" in table and "r2" in table


def test_a_pull_that_found_no_holder_blocks_nothing_and_a_failed_check_blocks_everywhere(fleet):
    _round(fleet, {"r0": (None, 1), "r1": (None, 1), "r2": (None, 1)})
    # r2 found no holder of v2 (or its holder died, or the read timed out): r0 and r1 still commit it.
    second = _round(fleet, {"r0": (1, 2), "r1": (1, 2), "r2": (1, 2, "unavailable")})
    assert {n: a.flip_to for n, a in second.items()} == {"r0": 2, "r1": 2, "r2": None}
    assert all(a.committed == 2 and a.failed == [] for a in second.values())
    # r2 reads v2 on its next pull and catches up.
    assert _round(fleet, {"r0": (2, None), "r1": (2, None), "r2": (1, 2)})["r2"].flip_to == 2
    # r2's bytes of v3 fail their digests: v3 is blocked for everyone, for good.
    third = _round(fleet, {"r0": (2, 3), "r1": (2, 3), "r2": (2, 3, "check_failed")})
    assert all(a.flip_to is None and a.committed == 2 and a.failed == [3] for a in third.values())
    status = fleet["r0"].status()["flips"]["policy"]
    assert status["replicas"]["r2"] == {"serving": 2, "pull": 3, "outcome": "check_failed"}
    assert "v3 check failed" in format_status(fleet["r0"].status())


def test_an_older_clients_report_is_read_where_unambiguous_and_refused_where_not(fleet):
    from pydantic import BaseModel

    from tensorhub_verl.errors import InvalidRequest
    from tensorhub_verl.ros.wire import messages as msg

    class OlderFlipReport(BaseModel):  # the report of a client that knew no pull outcome
        worker: str
        model: str
        serving: int | None = None
        staged: int | None = None
        failed: int | None = None

    hub = fleet["r0"]._hub
    hub.post(msg.FLIP_REPORT_PATH, OlderFlipReport(worker="r0", model="policy", staged=4), msg.FlipReply)
    assert fleet["r0"].status()["flips"]["policy"]["replicas"]["r0"] == {"serving": None, "pull": 4,
                                                                          "outcome": "staged"}
    before = fleet["r0"].status()["flips"]
    with pytest.raises(InvalidRequest, match="check_failed or unavailable.*update tensorhub_verl"):
        hub.post(msg.FLIP_REPORT_PATH, OlderFlipReport(worker="r0", model="policy", serving=4, failed=5),
                 msg.FlipReply)
    assert fleet["r0"].status()["flips"] == before


def test_a_replica_that_leaves_stops_counting_toward_the_quorum(fleet):
    _round(fleet, {"r0": (None, 5), "r1": (None, 5), "r2": (None, 5)}, fraction=1.0)
    blocked = _round(fleet, {"r0": (5, 6), "r1": (5, 6), "r2": (5, None)}, fraction=1.0)
    assert blocked["r0"].flip_to is None and "2 of 3" in blocked["r0"].blocked
    fleet["r2"].close()  # leaves the hub: its report goes with it
    after = {n: fleet[n].flip_report("policy", serving=5, pull=6, outcome="staged", min_replica_fraction=1.0)
             for n in ("r0", "r1")}
    assert all(a.flip_to == 6 for a in after.values())
    assert sorted(fleet["r0"].status()["flips"]["policy"]["replicas"]) == ["r0", "r1"]


def test_bad_reports_get_a_typed_error_and_change_nothing(fleet, hub):
    import httpx

    from tensorhub_verl.ros.wire import messages as msg

    fleet["r0"].flip_report("policy", serving=None, pull=7, outcome="staged")
    before = fleet["r0"].status()["flips"]
    for body in ({"worker": "r0", "model": "policy", "serving": -1},
                 {"worker": "r0", "model": "policy", "staged": "8"},
                 {"worker": "r0", "model": "policy", "staged": 8, "min_replica_fraction": 0.0},
                 {"worker": "r0", "model": "policy", "staged": 8, "surprise": 1},
                 {"worker": "r0", "model": "policy", "pull": 8},
                 {"worker": "r0", "model": "policy", "pull": 8, "outcome": "lost"},
                 {"worker": "r0", "model": "policy", "outcome": "unavailable"},
                 {"worker": "r0", "model": "policy", "staged": 8, "pull": 8, "outcome": "staged"}):
        reply = httpx.post(hub.url + msg.FLIP_REPORT_PATH, json=body, timeout=10)
        assert reply.status_code == 422 and reply.json()["error"] == "InvalidRequest", reply.text
    assert fleet["r0"].status()["flips"] == before
    # A worker reports only for itself.
    with pytest.raises(NotOwner):
        fleet["r0"]._hub.post(msg.FLIP_REPORT_PATH, msg.FlipReport(worker="r1", model="policy", pull=1,
                                                                                outcome="staged"),
                              msg.FlipReply)
    assert fleet["r0"].status()["flips"] == before
