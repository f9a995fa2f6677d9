"""The lab on a real kernel: build, run processes inside, count WAN bytes, always clean up.

Needs root and iproute2 (marker `netns`); skips with the reason otherwise. No timing assertions:
rates are reported by `scripts/netlab.sh selftest`, not checked here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tensorhub_dev.netlab import Lab, LabSpec, NetlabError, cleanup_stale, ip_netns_names
from tensorhub_dev.netlab.measure import measure_flows, measure_nixl

pytestmark = pytest.mark.netns


def _lab_namespaces(lab: Lab) -> set[str]:
    return {ns for ns in ip_netns_names() if ns.startswith(lab.prefix + "-")}


def test_build_and_close_leave_nothing(no_leftovers):
    lab = Lab(LabSpec.uniform(dcs=2, hosts_per_rack=2, nic_mbit=200, wan_mbit=100))
    with lab:
        assert _lab_namespaces(lab) == set(lab.plan.namespaces)
    assert _lab_namespaces(lab) == set()


def test_exception_inside_the_lab_still_cleans_up(no_leftovers):
    lab = Lab(LabSpec.uniform(dcs=1, hosts_per_rack=2))
    with pytest.raises(KeyboardInterrupt):
        with lab:
            lab.host("d0r0h0").popen([sys.executable, "-c", "import time; time.sleep(60)"])
            raise KeyboardInterrupt
    assert _lab_namespaces(lab) == set()


def test_host_process_sees_its_ip_and_ucx_env(no_leftovers):
    with Lab(LabSpec.uniform(dcs=1, hosts_per_rack=2)) as lab:
        h = lab.host("d0r0h1")
        code = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('UCX_TLS', 'UCX_NET_DEVICES', 'X')}))"
        out = h.run([sys.executable, "-c", code], timeout=30, env={"X": "1"}).stdout
        assert json.loads(out) == {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0", "X": "1"}
        addrs = h.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], timeout=10).stdout
        assert h.ip in addrs


def test_hosts_route_only_the_lab_subnet(no_leftovers):
    with Lab(LabSpec.uniform(dcs=2, hosts_per_rack=1)) as lab:
        h = lab.host("d0r0h0")
        # `ip route get` asks the routing table only; nothing is sent.
        assert h.run(["ip", "route", "get", lab.host("d1r0h0").ip], timeout=10).returncode == 0
        assert h.run(["ip", "route", "get", "192.0.2.1"], timeout=10, check=False).returncode != 0


def test_intra_dc_transfer_does_not_touch_the_wan(no_leftovers):
    with Lab(LabSpec.uniform(dcs=2, racks_per_dc=2, hosts_per_rack=1, nic_mbit=400, wan_mbit=200)) as lab:
        [res] = measure_flows(lab, [("d0r0h0", "d0r1h0")], 2_000_000)
        assert res["bytes"] == 2_000_000
        assert res["wan_bytes_during_run"] < 10_000  # a few ARP frames at most


def test_cross_dc_bytes_are_counted_on_the_wan(no_leftovers):
    with Lab(LabSpec.uniform(dcs=2, hosts_per_rack=1, nic_mbit=400, wan_mbit=200)) as lab:
        before = lab.wan_tx_bytes_by_dc()
        [res] = measure_flows(lab, [("d0r0h0", "d1r0h0")], 2_000_000)
        after = lab.wan_tx_bytes_by_dc()
        assert res["bytes"] == 2_000_000
        assert after["dc1"] - before["dc1"] >= 2_000_000          # payload crossed into dc1
        assert after["dc0"] - before["dc0"] < 2_000_000 // 10      # only acks came back


def test_unshaped_lifts_every_tbf_and_puts_back_each_rate_even_after_an_error(no_leftovers):
    with Lab(LabSpec.uniform(dcs=2, hosts_per_rack=1, nic_mbit=200, wan_mbit=100)) as lab:
        lab.shape("d0r0h0", 50)  # a straggler's rate is put back as it was, not as planned
        before = lab.shaped_rates()
        nic = [r for (ns, ifname), r in before.items() if ns == lab.host("d0r0h0").netns]
        assert nic == [50.0] and sorted(set(before.values())) == [50.0, 100.0, 200.0], before
        with pytest.raises(RuntimeError):
            with lab.unshaped():
                assert lab.shaped_rates() == {}
                [res] = measure_flows(lab, [("d0r0h0", "d1r0h0")], 1_000_000)  # traffic still flows
                assert res["bytes"] == 1_000_000
                raise RuntimeError("setup failed")
        assert lab.shaped_rates() == before


def test_unknown_host_is_a_typed_error(no_leftovers):
    with Lab(LabSpec.uniform(dcs=1, hosts_per_rack=1)) as lab:
        with pytest.raises(NetlabError, match="no host"):
            lab.host("nope")


def test_cleanup_stale_removes_a_killed_runs_lab(no_leftovers, tmp_path):
    code = ("import sys, time; from tensorhub_dev.netlab import Lab, LabSpec;"
            "lab = Lab(LabSpec.uniform(dcs=2, hosts_per_rack=1)).build();"
            "print(lab.prefix, flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        prefix = proc.stdout.readline().strip()
        assert prefix.startswith("thl-")
        assert cleanup_stale(prefix) == []  # creator alive: left alone
    finally:
        proc.send_signal(signal.SIGKILL)  # no chance to clean up
        proc.wait(timeout=30)
    time.sleep(0.1)
    removed = cleanup_stale(prefix)
    assert removed and all(ns.startswith(prefix) for ns in removed)
    assert not [ns for ns in ip_netns_names() if ns.startswith(prefix)]


def test_sigterm_on_the_cli_cleans_up(no_leftovers):
    proc = subprocess.Popen([sys.executable, "-m", "tensorhub_dev.netlab", "up", "--dcs", "2", "--hosts", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        desc = json.loads(proc.stdout.readline())
        assert [ns for ns in ip_netns_names() if ns.startswith(desc["prefix"])]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not [ns for ns in ip_netns_names() if ns.startswith(desc["prefix"])]


@pytest.mark.slow
def test_nixl_read_across_lab_hosts(no_leftovers):
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    with Lab(LabSpec.uniform(dcs=2, hosts_per_rack=1, nic_mbit=400, wan_mbit=200)) as lab:
        rep = measure_nixl(lab, "d0r0h0", "d1r0h0", 2 << 20, reps=1)
        assert rep["ok"], rep
        assert rep["ucx_tls"] == "tcp" and rep["ucx_net_devices"] == "eth0"
        assert rep["wan_bytes_during_run"] >= 2 << 20  # the READ really crossed the WAN
