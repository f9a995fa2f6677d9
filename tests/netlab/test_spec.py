"""The lab's address plan and shaping, as pure data (no root needed)."""

from __future__ import annotations

import ipaddress

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.netlab.spec import DatacenterSpec, LabSpec, RackSpec, plan_lab, tbf_args


def test_uniform_two_dc_plan_addresses_and_router():
    plan = plan_lab(LabSpec.uniform(dcs=2, racks_per_dc=2, hosts_per_rack=2, nic_mbit=200, wan_mbit=100), "thl-1-ab")
    assert [h.name for h in plan.hosts] == ["d0r0h0", "d0r0h1", "d0r1h0", "d0r1h1",
                                            "d1r0h0", "d1r0h1", "d1r1h0", "d1r1h1"]
    assert [h.ip for h in plan.hosts[:3]] == ["10.77.0.10", "10.77.0.11", "10.77.0.12"]
    assert plan.hosts[4].ip == "10.77.1.10" and plan.hosts[4].gateway == "10.77.1.1"
    assert plan.router_ns == "thl-1-ab-wan"
    assert dict(plan.router_ifs) == {"dc0": "d-dc0", "dc1": "d-dc1"}
    assert all(ns.startswith("thl-1-ab-") for ns in plan.namespaces)
    assert len(plan.namespaces) == len(set(plan.namespaces)) == 1 + 2 + 4 + 8


def test_every_address_stays_in_the_private_lab_subnet():
    plan = plan_lab(LabSpec.uniform(dcs=3, hosts_per_rack=4), "thl-1-ab")
    net = ipaddress.ip_network("10.77.0.0/16")
    addrs = [h.ip for h in plan.hosts] + [c.split("/")[0] for _, c in plan.router_addrs]
    assert all(ipaddress.ip_address(a) in net for a in addrs)
    assert len(set(addrs)) == len(addrs)


def test_shaping_both_directions_of_every_link():
    plan = plan_lab(LabSpec.uniform(dcs=2, nic_mbit=200, rack_uplink_mbit=300, wan_mbit=100), "p")
    by_if = {(v.a_if, v.b_if.split("-")[0]): (v.a_mbit, v.b_mbit) for v in plan.veths}
    assert by_if[("eth0", "h")] == (200, 200)
    assert by_if[("uplink", "r")] == (300, 300)
    assert by_if[("wan", "d")] == (100, 100)


def test_single_dc_has_no_router_and_no_gateway():
    plan = plan_lab(LabSpec.uniform(dcs=1, hosts_per_rack=3), "p")
    assert plan.router_ns is None and plan.router_ifs == ()
    assert all(h.gateway is None for h in plan.hosts)


def test_interface_names_fit_the_kernel_limit():
    plan = plan_lab(LabSpec(datacenters=(DatacenterSpec(name="dcwest", racks=(
        RackSpec(name="rackname0001", hosts=("hostname0001",)),)),)), "p")
    for v in plan.veths:
        assert len(v.a_if) <= 15 and len(v.b_if) <= 15


def test_rack_uplink_override():
    spec = LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=(
        RackSpec(name="r0", hosts=("a",), uplink_mbit=50), RackSpec(name="r1", hosts=("b",)))),),
        rack_uplink_mbit=400)
    ups = [(v.a_mbit, v.b_mbit) for v in plan_lab(spec, "p").veths if v.a_if == "uplink"]
    assert ups == [(50, 50), (400, 400)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(subnet="8.8.0.0/16"), "private"),
    (dict(subnet="127.0.0.0/16"), "private"),
    (dict(subnet="10.77.0.0/24"), "/16"),
    (dict(nic_mbit=0), "nic_mbit"),
])
def test_bad_lab_spec_raises_config_error(kwargs, match):
    dcs = (DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=("a",)),)),)
    with pytest.raises(ConfigError, match=match):
        LabSpec(datacenters=dcs, **kwargs)


@pytest.mark.parametrize("dcs, match", [
    ((), "at least one datacenter"),
    ((DatacenterSpec(name="dc0", racks=()),), "at least one rack"),
    ((DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=("a", "a")),)),), "twice"),
    ((DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=("Bad-Name",)),)),), "host name"),
    ((DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=("waytoolonghostname",)),)),), "host name"),
])
def test_bad_topology_raises_config_error(dcs, match):
    with pytest.raises(ConfigError, match=match):
        LabSpec(datacenters=dcs)


def test_tbf_burst_grows_with_rate():
    low = tbf_args(100)
    high = tbf_args(10_000)
    assert low[:3] == ["tbf", "rate", "100mbit"]
    assert int(high[high.index("burst") + 1]) > int(low[low.index("burst") + 1])


def test_the_queue_depth_is_the_tbf_latency_and_must_be_positive():
    assert tbf_args(200)[-2:] == ["latency", "50ms"], "the depth every figure before was measured with"
    assert tbf_args(200, 5.0)[-2:] == ["latency", "5ms"]
    dcs = (DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=("a",)),)),)
    assert LabSpec(datacenters=dcs, queue_ms=5.0).queue_ms == 5.0
    with pytest.raises(ConfigError, match="queue_ms"):
        LabSpec(datacenters=dcs, queue_ms=0.0)
