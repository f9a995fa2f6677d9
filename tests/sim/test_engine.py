"""Exact event schedules of the flow engine on small clusters."""

from __future__ import annotations

import math

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.engine import FlowSim, SimulationStuck
from tensorhub_dev.sim.topology import GBIT, build_cluster


def _sim(**kw):
    return FlowSim(build_cluster(**{"nodes_per_rack": 4, "nic_gbps": 8.0, **kw}))  # 8 Gbit/s = 1 GB/s


def test_paths_by_distance():
    c = build_cluster(dcs=2, racks_per_dc=2, nodes_per_rack=2, nic_gbps=8, rack_uplink_gbps=16, wan_gbps=4)
    assert c.path("d0r0n0", "d0r0n0") == (("local", "d0r0n0"),)
    assert c.path("d0r0n0", "d0r0n1") == (("nic_out", "d0r0n0"), ("nic_in", "d0r0n1"))
    assert c.path("d0r0n0", "d0r1n0") == (("nic_out", "d0r0n0"), ("rack_up", "dc0", "r0"),
                                          ("rack_down", "dc0", "r1"), ("nic_in", "d0r1n0"))
    assert c.path("d0r0n0", "d1r0n0") == (("nic_out", "d0r0n0"), ("rack_up", "dc0", "r0"), ("wan_out", "dc0"),
                                          ("wan_in", "dc1"), ("rack_down", "dc1", "r0"), ("nic_in", "d1r0n0"))


def test_single_flow_takes_size_over_rate():
    sim = _sim()
    done = []
    sim.start_flow("d0r0n0", "d0r0n1", 3e9, lambda f: done.append(sim.now))
    sim.run()
    assert done == [pytest.approx(3.0)]


def test_two_flows_out_of_one_nic_get_half_each():
    sim = _sim()
    done = {}
    for dst in ("d0r0n1", "d0r0n2"):
        sim.start_flow("d0r0n0", dst, 1e9, lambda f: done.setdefault(f.dst, sim.now))
    sim.run()
    assert done == {"d0r0n1": pytest.approx(2.0), "d0r0n2": pytest.approx(2.0)}
    assert sim.events == 1  # both drain in the same event


def test_arrival_mid_flow_reshares_the_link():
    # f1 (2 GB) alone for 1 s at 1 GB/s, then shares with f2 (0.5 GB): both at 0.5 GB/s.
    # f2 ends at 1 + 1 = 2 s; f1 has 1 - 0.5 = 0.5 GB left at t=2, alone again: ends at 2.5 s.
    sim = _sim()
    done = {}
    sim.start_flow("d0r0n0", "d0r0n1", 2e9, lambda f: done.setdefault("f1", sim.now))
    sim.at(1.0, lambda: sim.start_flow("d0r0n0", "d0r0n2", 0.5e9, lambda f: done.setdefault("f2", sim.now)))
    sim.run()
    assert done == {"f1": pytest.approx(2.5), "f2": pytest.approx(2.0)}


def test_wan_limited_flow():
    sim = FlowSim(build_cluster(dcs=2, nodes_per_rack=1, nic_gbps=400, wan_gbps=8))
    done = []
    sim.start_flow("d0r0n0", "d1r0n0", 4e9, lambda f: done.append(sim.now))
    sim.run()
    assert done == [pytest.approx(4.0)]
    assert sim.bytes_on[("wan_in", "dc1")] == 4e9


def test_rack_uplink_shared_by_cross_rack_flows_only():
    # uplink 8 Gbit/s (1 GB/s), NICs 16 Gbit/s (2 GB/s): two cross-rack flows share the uplink,
    # the in-rack flow runs at its NIC rate.
    sim = FlowSim(build_cluster(racks_per_dc=2, nodes_per_rack=3, nic_gbps=16, rack_uplink_gbps=8))
    done = {}
    for src, dst in (("d0r0n0", "d0r1n0"), ("d0r0n1", "d0r1n1"), ("d0r0n2", "d0r0n0")):
        sim.start_flow(src, dst, 1e9, lambda f: done.setdefault(f.src, sim.now))
    sim.run()
    assert done == {"d0r0n0": pytest.approx(2.0), "d0r0n1": pytest.approx(2.0), "d0r0n2": pytest.approx(0.5)}


def test_endless_background_flow_takes_its_fair_share():
    sim = _sim()
    done = []
    sim.start_flow("d0r0n0", "d0r0n1", math.inf)
    sim.start_flow("d0r0n0", "d0r0n2", 1e9, lambda f: done.append(sim.now))
    sim.run(until=lambda: bool(done))
    assert done == [pytest.approx(2.0)]


def test_stuck_run_raises():
    sim = _sim()
    with pytest.raises(SimulationStuck):
        sim.run(until=lambda: False)


def test_bad_inputs():
    sim = _sim()
    with pytest.raises(ConfigError):
        sim.start_flow("d0r0n0", "d0r0n1", 0)
    sim.at(1.0, lambda: None)
    sim.run()
    with pytest.raises(ConfigError, match="past"):
        sim.at(0.5, lambda: None)


def test_gbit_unit():
    assert GBIT == 125_000_000
