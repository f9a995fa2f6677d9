"""Network faults on real (emulated) links, real processes and NIXL/UCX over TCP: a holder's link cut
mid-fetch (restored, or not), and a straggler holder on a slow link.

Needs root and iproute2 (markers `netns`, `slow`); skips with the reason otherwise. Times are printed
(`-s`) for the README and never asserted: a fetch that hangs fails at its phase's deadline
(`LabBenchParams.timeout_s`, 180 s; one copy takes ~1.4 s at NIC_MBIT, the hub drops a silent holder after 10 s).

    rack r0: trainer (holder, 100 Mbit/s) -- hub -- peer (holder, fetched v1 from the trainer) -- reader
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from tensorhub_dev.bench import modes
from tensorhub_dev.netlab import DatacenterSpec, Lab, LabSpec, RackSpec

pytestmark = [pytest.mark.netns, pytest.mark.slow]

NIC_MBIT = 100
SIZE_MB = 16


@pytest.fixture
def swarm(no_leftovers, tmp_path):
    """A lab with a hub, a trainer holding policy v1 and a peer that fetched and holds it; yields (lab, start)
    where start() begins a fetch by a reader on host "reader" and returns its phase."""
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    spec = LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=(
        RackSpec(name="r0", hosts=("trainer", "hub", "peer", "reader")),)),), nic_mbit=NIC_MBIT)
    params = modes.LabBenchParams(size_mb=SIZE_MB, rollouts=1, timeout_s=180.0)
    phases = []
    with Lab(spec) as lab:
        url, control = modes.start_control(lab, tmp_path, params, copies=0)
        try:
            peer = modes.Phase(lab, tmp_path, "peer", url, params)
            phases.append(peer)
            go = peer.add_reader("peer", "policy", hold=True)
            peer.ready()
            go.touch()
            peer.collect()

            def start() -> modes.Phase:
                phase = modes.Phase(lab, tmp_path, "late", url, params)
                phases.append(phase)
                go = phase.add_reader("reader", "policy", hold=False)
                phase.ready()
                go.touch()
                return phase

            yield lab, start
        finally:
            for phase in reversed(phases):
                phase.stop()
            modes.stop_control(control)


def _fetched(phase: modes.Phase) -> dict:
    [result] = phase.collect()
    print(f"\nfetch {result['seconds']:.2f} s, sources {result['sources']}")
    return result


def test_a_holder_link_cut_and_restored_mid_fetch_costs_seconds(swarm):
    lab, start = swarm
    phase = start()
    time.sleep(0.3)  # the reader reads from both holders: cut the peer mid-fetch
    lab.set_link("peer", up=False)
    time.sleep(3.0)
    lab.set_link("peer", up=True)
    result = _fetched(phase)
    assert sum(result["sources"].values()) == result["bytes"] >= SIZE_MB << 20


def test_a_holder_cut_for_good_mid_fetch_is_planned_around(swarm):
    lab, start = swarm
    phase = start()
    time.sleep(0.3)
    lab.set_link("peer", up=False)  # never restored: the hub drops the peer, its reads are re-planned
    result = _fetched(phase)
    assert sum(result["sources"].values()) == result["bytes"] >= SIZE_MB << 20
    assert result["sources"].get("trainer", 0) > 0


def test_a_straggler_holder_does_not_hold_the_reader_hostage(swarm):
    lab, start = swarm
    lab.shape("peer", NIC_MBIT / 25)  # 4 Mbit/s: alone it would take ~34 s to serve one copy
    result = _fetched(start())
    one_copy_s = (SIZE_MB << 20) * 8 / (NIC_MBIT * 1e6)
    print(f"one copy at the reader's NIC rate: {one_copy_s:.2f} s")
    assert sum(result["sources"].values()) == result["bytes"] >= SIZE_MB << 20
    # A straggler's reads are abandoned once they take 4x the median read (ClientConfig.straggler_factor)
    # and re-planned on the trainer: here 1.65 s and nothing from the straggler. Without that, its first reads
    # set the pace: it served 2 chunks (1 MiB each) and the fetch took 4.3 s.
    assert result["sources"].get("peer-0", 0) <= 1 << 20
