"""The span bookkeeping as pure functions: boundaries to spans, parts of a resumed response, labels, the ledger."""

from __future__ import annotations

import pytest

from tensorhub_verl.vllm.version_spans import (
    VersionLedger,
    WeightVersionSpan as S,
    concat,
    from_wire,
    label,
    spans_from_boundaries,
    to_wire,
)


def test_no_apply_one_span():
    assert spans_from_boundaries(3, [], 10) == [S(3, 0, 10)]


def test_apply_mid_request_two_spans():
    assert spans_from_boundaries(3, [(4, 4)], 10) == [S(3, 0, 4), S(4, 4, 10)]


def test_apply_before_first_token_leaves_no_empty_span():
    assert spans_from_boundaries(3, [(0, 4)], 10) == [S(4, 0, 10)]


def test_two_applies_three_spans_and_a_version_with_no_token_is_dropped():
    assert spans_from_boundaries(1, [(2, 2), (5, 3), (5, 4)], 9) == [S(1, 0, 2), S(2, 2, 5), S(4, 5, 9)]


def test_apply_after_last_token_changes_nothing():
    assert spans_from_boundaries(1, [(6, 2)], 6) == [S(1, 0, 6)]


def test_empty_response_keeps_its_admission_version():
    assert spans_from_boundaries(5, [], 0) == [S(5, 0, 0)]
    assert label([S(5, 0, 0)]) == (5, 5)


def test_label_is_first_and_last_version_with_tokens():
    assert label([S(2, 0, 3), S(3, 3, 7)]) == (2, 3)
    assert label([S(2, 0, 3)]) == (2, 2)


def test_concat_of_a_resumed_partial_rollout():
    first = [S(2, 0, 5)]  # aborted for an apply after 5 tokens
    second = [S(3, 0, 4)]  # resumed on the new version
    assert concat([first, second], [5, 4]) == [S(2, 0, 5), S(3, 5, 9)]
    assert concat([[S(2, 0, 5)], [S(2, 0, 4)]], [5, 4]) == [S(2, 0, 9)]  # same version: one span
    with pytest.raises(ValueError):
        concat([first], [5, 4])


def test_wire_round_trip_and_json():
    spans = [S(2, 0, 5), S(None, 5, 6)]
    assert from_wire(to_wire(spans)) == spans
    assert from_wire("[[2, 0, 5], [null, 5, 6]]") == spans


def test_bad_span_is_refused():
    with pytest.raises(ValueError, match="start <= end"):
        S(1, 4, 2)


def test_ledger_records_positions_of_requests_in_flight_only():
    ledger = VersionLedger()
    ledger.admit("early")  # not enabled: nothing is kept
    ledger.enable()
    ledger.apply(1, {})
    ledger.admit("a")
    ledger.admit("b")
    ledger.apply(2, {"a": 7, "b": 0, "gone": 3})
    ledger.apply(2, {"a": 9})  # the same version again is no apply
    ledger.admit("c")
    assert ledger.finish("a", 10) == [S(1, 0, 7), S(2, 7, 10)]
    assert ledger.finish("b", 4) == [S(2, 0, 4)]
    assert ledger.finish("c", 4) == [S(2, 0, 4)]
    assert ledger.finish("a", 10) is None and ledger.finish("early", 1) is None
    assert ledger.applies == 2 and ledger.in_flight == 0


def test_ledger_forgets_oldest_beyond_its_bound():
    ledger = VersionLedger(max_requests=2)
    ledger.enable()
    for rid in "xyz":
        ledger.admit(rid)
    assert ledger.finish("x", 1) is None and ledger.finish("z", 1) == [S(None, 0, 1)]


def test_an_apply_rpc_records_the_positions_of_the_requests_in_flight():
    from tensorhub_verl.vllm.results import ApplyResult, HolderStatus
    from tensorhub_verl.vllm.version_truth import record_from_rpc

    ledger = VersionLedger()
    record_from_rpc(ledger, "generate", [], dict)  # not ours: the ledger stays off
    assert not ledger.active
    status = HolderStatus(worker="e", layout="l", served=4).as_dict()
    record_from_rpc(ledger, "th_status", [status], dict)  # the engine already serves v4
    assert ledger.active and ledger.version == 4 and ledger.applies == 1
    ledger.admit("r")
    apply = ApplyResult(worker="e", version=5, applied=True, source_layout="hf").as_dict()
    record_from_rpc(ledger, "th_apply", [apply, apply], lambda: {"r": 3})  # two ranks, one version
    record_from_rpc(ledger, "th_status", [HolderStatus(worker="e", layout="l", served=5)], dict)
    assert ledger.finish("r", 8) == [S(4, 0, 3), S(5, 3, 8)]
    other = ApplyResult(worker="e", version=6, applied=True, source_layout="hf")
    record_from_rpc(ledger, "th_apply", [apply, other], dict)  # ranks disagree: nothing recorded
    assert ledger.version == 5
