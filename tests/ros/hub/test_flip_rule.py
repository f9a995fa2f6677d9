"""The fleet flip's rule (``flip_rule.decide``), pure: quorum, a failed check blocks a version everywhere (a pull that
could not read the version blocks nothing), at most two versions served at any instant, replicas joining and
leaving."""

from __future__ import annotations

import itertools

import pytest

from tensorhub_verl.ros.hub.flip_rule import (CHECK_FAILED, MAX_SERVED, STAGED, UNAVAILABLE, FlipState, ReplicaReport,
                                              decide, quorum)


def R(serving=None, staged=None, failed=None, unavailable=None):
    """A report: what the replica serves and its last pull, staged, failed its check, or unavailable."""
    pull = [(v, o) for v, o in ((staged, STAGED), (failed, CHECK_FAILED), (unavailable, UNAVAILABLE)) if v is not None]
    assert len(pull) <= 1
    return ReplicaReport(serving=serving, pull=pull[0][0] if pull else None, outcome=pull[0][1] if pull else None)


def test_a_version_is_committed_once_a_quorum_holds_it_staged():
    state = FlipState(committed=1)
    reports = {"a": R(serving=1, staged=2), "b": R(serving=1), "c": R(serving=1)}
    d = decide(reports, state, min_fraction=0.6)
    assert d.state.committed == 1 and d.flips == {} and "1 of 3" in d.blocked

    reports["b"] = R(serving=1, staged=2)
    d = decide(reports, state, min_fraction=0.6)
    assert (d.state.committed, d.state.previous) == (2, 1)
    assert d.flips == {"a": 2, "b": 2} and d.wave("a") == 2 and d.wave("c") is None and d.blocked == ""


def test_quorum_counts_at_least_one_replica():
    assert quorum(0.01, 3) == 1 and quorum(1.0, 3) == 3 and quorum(0.5, 4) == 2 and quorum(1.0, 0) == 1


def test_a_failed_check_on_one_replica_blocks_that_version_everywhere_for_good():
    reports = {"a": R(serving=1, staged=2), "b": R(serving=1, staged=2), "c": R(serving=1, failed=2)}
    d = decide(reports, FlipState(committed=1), min_fraction=0.5)
    assert d.state.committed == 1 and d.flips == {} and 2 in d.state.failed and "failed its check" in d.blocked
    # The failing replica leaves: the version stays blocked.
    d = decide({"a": reports["a"], "b": reports["b"]}, d.state, min_fraction=0.5)
    assert d.state.committed == 1 and d.flips == {}
    # The next version goes through.
    d = decide({"a": R(serving=1, staged=3), "b": R(serving=1, staged=3)}, d.state, min_fraction=0.5)
    assert d.state.committed == 3 and d.flips == {"a": 3, "b": 3}


def test_a_pull_that_found_no_holder_blocks_nothing_and_the_quorum_still_commits():
    # c's pull of v2 failed before any byte was read (no holder, a dead holder, a timeout): c just lacks v2.
    reports = {"a": R(serving=1, staged=2), "b": R(serving=1), "c": R(serving=1, unavailable=2)}
    d = decide(reports, FlipState(committed=1), min_fraction=0.6)
    assert d.state.committed == 1 and d.state.failed == frozenset() and "1 of 3" in d.blocked
    reports["b"] = R(serving=1, staged=2)
    d = decide(reports, d.state, min_fraction=0.6)
    assert (d.state.committed, d.state.previous) == (2, 1) and d.flips == {"a": 2, "b": 2}
    # c reads v2 on its next pull and flips to the commit.
    reports = {"a": R(serving=2), "b": R(serving=2), "c": R(serving=1, staged=2)}
    d = decide(reports, d.state, min_fraction=0.6)
    assert d.flips == {"c": 2} and d.state.committed == 2
    # A digest mismatch on c, by contrast, blocks v3 everywhere though a and b are a quorum.
    reports = {"a": R(serving=2, staged=3), "b": R(serving=2, staged=3), "c": R(serving=2, failed=3)}
    d = decide(reports, d.state, min_fraction=0.6)
    assert d.state.committed == 2 and d.flips == {} and d.state.failed == {3} and "failed its check" in d.blocked


def test_a_report_names_how_its_pull_ended():
    assert R(serving=1, unavailable=2).staged is None and R(serving=1, unavailable=2).check_failed is None
    assert R(failed=2).check_failed == 2 and R(staged=2).staged == 2
    for pull, outcome in ((2, None), (None, STAGED), (2, "lost")):
        with pytest.raises(ValueError, match="go together"):
            ReplicaReport(serving=1, pull=pull, outcome=outcome)


def test_a_replica_behind_catches_up_first_and_the_new_version_waits_for_it():
    # c missed v2 (committed by a quorum); v3 is staged by a and b.
    state = FlipState(committed=2, previous=1)
    reports = {"a": R(serving=2, staged=3), "b": R(serving=2, staged=3), "c": R(serving=1, staged=3)}
    d = decide(reports, state, min_fraction=0.5)
    assert d.state.committed == 2 and d.flips == {} and "more than 2 versions" in d.blocked
    # c stages the fleet's commit instead: it catches up in wave 1 and v3 commits in wave 2.
    reports["c"] = R(serving=1, staged=2)
    d = decide(reports, state, min_fraction=0.5)
    assert (d.state.committed, d.state.previous) == (3, 2)
    assert d.flips == {"a": 3, "b": 3, "c": 2} and d.wave("c") == 1 and d.wave("a") == 2


def test_joining_and_leaving_replicas_change_the_quorum():
    state = FlipState(committed=4)
    reports = {"a": R(serving=4, staged=5), "b": R(serving=4)}
    assert decide(reports, state, 1.0).state.committed == 4
    # b leaves: a alone is the fleet.
    assert decide({"a": reports["a"]}, state, 1.0).flips == {"a": 5}
    # a new replica serving nothing joins and stages v5: it flips with the others, adding no version.
    reports = {"a": R(serving=4, staged=5), "b": R(serving=4, staged=5), "n": R(staged=5)}
    d = decide(reports, state, 1.0)
    assert d.state.committed == 5 and d.flips == {"a": 5, "b": 5, "n": 5}


def test_the_newest_version_with_a_quorum_wins_over_older_staged_ones():
    reports = {"a": R(serving=1, staged=3), "b": R(serving=1, staged=3), "c": R(serving=1, staged=2)}
    d = decide(reports, FlipState(committed=1), min_fraction=0.5)
    assert d.state.committed == 3 and d.flips == {"a": 3, "b": 3}


def _served_through_waves(reports, decision):
    """Every set of versions served at some instant while the replicas flip one by one, wave 1 first."""
    serving = {w: r.serving for w, r in reports.items()}
    seen = [set(v for v in serving.values() if v is not None)]
    for wave in (1, 2):
        for w in sorted(w for w in decision.flips if decision.wave(w) == wave):
            serving[w] = decision.flips[w]
            seen.append(set(v for v in serving.values() if v is not None))
    return seen, serving


def test_no_sequence_of_reports_makes_the_fleet_serve_three_versions():
    """Exhaustive over small fleets: three replicas, each serving, staging and failing any of a few versions,
    repeated rounds; every instant of every flip serves at most two versions, and no failed version is flipped to."""
    versions = [None, 1, 2, 3]
    options = [R(serving=s, staged=t) for s in versions for t in versions if t is None or s is None or t > s]
    options += [R(serving=s, **{kind: 3}) for s in versions for kind in ("failed", "unavailable")]
    checked = 0
    for combo in itertools.islice(itertools.product(options, repeat=3), 0, None, 5):
        reports = dict(zip("abc", combo))
        served = {r.serving for r in combo if r.serving is not None}
        if len(served) > MAX_SERVED:
            continue  # a fleet the rule never produces
        committed = max(served, default=None)
        previous = min(served) if len(served) == 2 else None
        d = decide(reports, FlipState(committed=committed, previous=previous), 0.5)
        seen, _ = _served_through_waves(reports, d)
        assert all(len(s) <= MAX_SERVED for s in seen), (reports, d)
        assert not (set(d.flips.values()) & d.state.failed), (reports, d)
        checked += 1
    assert checked > 100


def test_a_commit_that_a_later_report_finds_failed_is_withdrawn():
    reports = {"a": R(serving=1, staged=2), "b": R(serving=1, staged=2), "c": R(serving=1)}
    d = decide(reports, FlipState(committed=1), min_fraction=0.5)
    assert d.state.committed == 2
    reports["c"] = R(serving=1, failed=2)
    d = decide(reports, d.state, min_fraction=0.5)
    assert d.state.committed == 1 and d.flips == {}


def test_a_restarted_hub_knows_no_commit_and_still_lets_the_straggler_catch_up_first():
    # Soft state: after a hub restart the rule starts from no commit. The straggler stages the version the fleet
    # serves; that older version is committed now, the newest waits a round.
    reports = {"a": R(serving=2, staged=3), "b": R(serving=2, staged=3), "c": R(serving=1, staged=2)}
    d = decide(reports, FlipState(), min_fraction=0.5)
    assert d.state.committed == 2 and d.flips == {"c": 2} and "v3" in d.blocked
    reports["c"] = R(serving=2, staged=3)
    d = decide(reports, d.state, min_fraction=0.5)
    assert d.state.committed == 3 and d.flips == {"a": 3, "b": 3, "c": 3}


def test_a_commit_nobody_can_serve_any_more_falls_back_to_what_the_fleet_serves():
    # v3 was committed but its flips were held back; nobody serves or stages it and the trainer dropped it
    # (keep_versions): only v2 (a and b serve it), v1 (c) and the newest v4 have a holder.
    state = FlipState(committed=3, previous=2)
    reports = {"a": R(serving=2, staged=4), "b": R(serving=2, staged=4), "c": R(serving=1, staged=2)}
    d = decide(reports, state, 0.5, fetchable=frozenset({1, 2, 4}))
    # c catches up to what its peers serve (wave 1), then a and b flip to v4: never three versions served.
    assert (d.state.committed, d.state.previous) == (4, 2), d
    assert d.flips == {"a": 4, "b": 4, "c": 2} and d.wave("c") == 1 and d.wave("a") == 2
    # While the hub still sees a holder of v3 it stays committed and the straggler's v2 is a catch-up to it.
    d = decide(reports, state, 0.5, fetchable=frozenset({1, 2, 3, 4}))
    assert d.state.committed == 3 and d.flips == {"c": 2} and "more than 2 versions" in d.blocked
    # No previous left either: the commit falls back to the newest version a replica serves.
    d = decide({"a": R(serving=2), "b": R(serving=1)}, FlipState(committed=3, previous=0), 0.5,
               fetchable=frozenset({1, 2}))
    assert (d.state.committed, d.state.previous) == (2, None) and d.flips == {}


def test_a_commit_someone_still_stages_or_serves_stays():
    state = FlipState(committed=3, previous=2)
    reports = {"a": R(serving=2, staged=3), "b": R(serving=3)}
    assert decide(reports, state, 0.5, fetchable=frozenset()).state.committed == 3
    assert decide(reports, state, 0.5, fetchable=frozenset()).flips == {"a": 3}
