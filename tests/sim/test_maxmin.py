"""Max-min fair rates on hand-checked topologies."""

from __future__ import annotations

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.maxmin import max_min_rates


def test_two_flows_sharing_one_link_get_half_each():
    assert max_min_rates({1: ["l"], 2: ["l"]}, {"l": 10.0}) == {1: 5.0, 2: 5.0}


def test_textbook_example_bottlenecks_free_capacity_for_others():
    # f2 crosses both links; B (cap 4) is the first bottleneck: f2 = f3 = 2, then f1 takes A's rest.
    rates = max_min_rates({1: ["A"], 2: ["A", "B"], 3: ["B"]}, {"A": 10.0, "B": 4.0})
    assert rates == {1: 8.0, 2: 2.0, 3: 2.0}


def test_three_hop_chain_limited_by_its_narrowest_link():
    rates = max_min_rates({1: ["nic_out", "uplink", "nic_in"]}, {"nic_out": 400.0, "uplink": 100.0, "nic_in": 400.0})
    assert rates == {1: 100.0}


def test_parking_lot():
    # Long flow over 3 links of cap 1, one short flow on each: everyone gets 1/2.
    paths = {0: ["a", "b", "c"], 1: ["a"], 2: ["b"], 3: ["c"]}
    assert max_min_rates(paths, {"a": 1.0, "b": 1.0, "c": 1.0}) == {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}


def test_rates_never_exceed_any_link():
    paths = {i: ["x", f"y{i % 3}"] for i in range(10)}
    cap = {"x": 7.0, "y0": 1.0, "y1": 2.0, "y2": 100.0}
    rates = max_min_rates(paths, cap)
    for link, c in cap.items():
        assert sum(r for f, r in rates.items() if link in paths[f]) <= c + 1e-9
    assert sum(rates.values()) == pytest.approx(7.0)  # x is saturated


def test_empty_path_and_unknown_link_are_config_errors():
    with pytest.raises(ConfigError, match="empty path"):
        max_min_rates({1: []}, {})
    with pytest.raises(ConfigError, match="no capacity"):
        max_min_rates({1: ["nope"]}, {})


def test_no_flows():
    assert max_min_rates({}, {"l": 1.0}) == {}
