"""The hub as a modeled resource: its queue, its costs, and what it does to TensorHub's updates."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_dev.sim import cli
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.hub import HubQueue, HubRequest
from tensorhub_dev.sim.hub_costs import MEASURED, MIB, HubCosts, calibrate_hub
from tensorhub_dev.sim.modes import FREE_HUB, ModeParams, run_all, standalone
from tensorhub_dev.sim.swarm import Swarm, shard_chunks
from tensorhub_dev.sim.tensorhub import TensorHub
from tensorhub_dev.sim.topology import build_cluster

GB = 1e9
SMALL = dict(racks=4, nodes_per_rack=4, rollouts=6, holders=4, joiners=2, chunks=8, weights_gb=10.0)


def _fetch(hub: HubCosts | None, readers: int = 6, nchunks: int = 16, chunk_bytes: float = 0.25 * GB,
           trainer_ranks: int = 1, dcs: int = 1, join_every_s: float = 0.0):
    """Readers on d<dcs-1>r1n* fetch from a trainer on d0r0n*; returns (done time by reader, strategy)."""
    sim = FlowSim(build_cluster(dcs=dcs, racks_per_dc=2, nodes_per_rack=8, nic_gbps=8.0,
                                wan_gbps=4.0 if dcs > 1 else None))
    swarm = Swarm(sim, nchunks, chunk_bytes)
    for r, chunks in enumerate(shard_chunks(nchunks, trainer_ranks)):
        swarm.add_holder(f"trainer-{r}", f"d0r0n{r}", chunks)
    th = TensorHub(swarm, PlannerConfig(max_inflight_per_source=2), window=3, hub=hub)
    names = [f"r{i}" for i in range(readers)]
    for i, name in enumerate(names):
        sim.at(i * join_every_s, lambda name=name, i=i: th.join(name, f"d{dcs - 1}r1n{i}"))
    sim.run(until=lambda: len(swarm.readers()) == readers and swarm.all_done())
    return {m.name: m.done_at for m in swarm.readers()}, th


# ---- the queue ----------------------------------------------------------------------------------
def _request(sim: FlowSim, log: list, name: str, service: float) -> HubRequest:
    return HubRequest("exchange", serve=lambda: log.append(("serve", name, sim.now)) or service,
                      book=lambda: log.append(("book", name, sim.now)),
                      answer=lambda: log.append(("answer", name, sim.now)))


def test_queue_serves_first_come_first_served_on_its_cores():
    sim = FlowSim(build_cluster())
    hub, log = HubQueue(sim, cores=2, free=False), []
    for name in "abc":
        hub.submit(_request(sim, log, name, 1.0))
    sim.run()
    answers = [(name, t) for kind, name, t in log if kind == "answer"]
    assert answers == [("a", 1.0), ("b", 1.0), ("c", 2.0)]  # c waits for a core
    assert hub.busy_s == 3.0 and hub.wait_max_s == 1.0 and hub.requests["exchange"] == 3
    assert hub.report(2.0)["utilisation"] == 0.75


def test_a_free_hub_books_every_request_of_an_instant_before_it_plans_any():
    sim = FlowSim(build_cluster())
    hub, log = HubQueue(sim, cores=1, free=True), []
    for name in "ab":
        hub.submit(_request(sim, log, name, 0.0))
    sim.run()
    assert [kind for kind, *_ in log] == ["book", "book", "serve", "answer", "serve", "answer"]


# ---- costs and calibration ------------------------------------------------------------------------
def test_leases_for_a_coarse_chunk_follow_the_run_length():
    costs = HubCosts(real_chunk_mib=8.0)
    assert costs.leases_for(64 * MIB) == 8
    assert dataclasses.replace(costs, run_chunks=3).leases_for(64 * MIB) == 3
    assert costs.leases_for(1 * MIB) == 1  # a chunk smaller than the real unit is still one lease
    assert HubCosts().free and not MEASURED.free
    with pytest.raises(ConfigError):
        HubCosts(cores=0)
    with pytest.raises(ConfigError):
        HubCosts(exchange_s=-1.0)


def test_calibrate_from_a_bench_control_report():
    report = {"bench": "control", "chunk_mib": 8.0, "points": [
        {"readers": 8, "chunks": 256, "hub_cpu_per_exchange_ms": 0.5, "reads_per_exchange": 6.0},
        {"readers": 8, "chunks": 4096, "hub_cpu_per_exchange_ms": 0.7, "reads_per_exchange": 7.0},
        {"readers": 64, "chunks": 256, "hub_cpu_per_exchange_ms": 2.0, "reads_per_exchange": 5.0}]}
    fitted = calibrate_hub(report)
    assert fitted["hub_exchange_ms"] == pytest.approx(0.6) and fitted["from_readers"] == 8
    assert calibrate_hub(report, readers=64)["hub_exchange_ms"] == 2.0
    with pytest.raises(ConfigError):
        calibrate_hub(report, readers=16)
    with pytest.raises(ConfigError):
        calibrate_hub({"bench": "transport", "points": []})


# ---- what the hub does to an update -------------------------------------------------------------
@pytest.mark.parametrize("shape", [dict(), dict(trainer_ranks=4), dict(dcs=2), dict(join_every_s=0.3)])
def test_a_free_hub_gives_the_figures_of_no_hub(shape):
    without, th0 = _fetch(None, **shape)
    free, th1 = _fetch(HubCosts(), **shape)
    assert free == without
    assert th1.plan_calls == th0.plan_calls
    assert th1.hub_report()["busy_s"] == 0.0 and th0.hub_report() is None


def test_a_costly_hub_makes_updates_slower_and_reports_its_work():
    fast, _ = _fetch(HubCosts())
    slow, th = _fetch(HubCosts(exchange_s=0.05, begin_s=0.05, end_s=0.05))
    assert max(slow.values()) > max(fast.values()) + 0.05
    hub = th.hub_report()
    requests = sum(hub["requests"].values())
    assert hub["busy_s"] == pytest.approx(0.05 * requests)
    assert hub["requests"]["begin"] == 6 and hub["requests"]["more"] > 0
    assert 0.9 < hub["utilisation"] <= 1.0 + 1e-9  # the hub, not the wire, sets the pace


def test_more_cores_cut_the_queueing():
    costs = HubCosts(exchange_s=0.05, begin_s=0.05, end_s=0.05)
    one, th1 = _fetch(costs)
    eight, th8 = _fetch(dataclasses.replace(costs, cores=8))
    assert th8.hub_report()["wait_mean_s"] < th1.hub_report()["wait_mean_s"] / 2
    assert max(eight.values()) < max(one.values())


def test_run_leases_cut_the_exchanges():
    # 256 MiB chunks are 32 real 8 MiB chunks: 8 exchanges of 4 leases each, or one lease of a 32-chunk run.
    costs = HubCosts(exchange_s=0.002, begin_s=0.002, end_s=0.002, retry_s=0.02)
    per_chunk, th1 = _fetch(costs, chunk_bytes=256 * MIB)
    runs, th32 = _fetch(dataclasses.replace(costs, run_chunks=32), chunk_bytes=256 * MIB)
    r1, r32 = th1.hub_report(), th32.hub_report()
    assert r1["leases_per_chunk"] == 32 and r32["leases_per_chunk"] == 1
    assert r1["requests"]["more"] == 6 * 16 * 7 and "more" not in r32["requests"]
    assert r1["leases"] == 6 * 16 * 32 and r32["leases"] == 6 * 16
    assert sum(r32["requests"].values()) < sum(r1["requests"].values())
    assert r32["busy_s"] < r1["busy_s"]


def test_a_held_read_lands_only_once_released():
    sim = FlowSim(build_cluster(nodes_per_rack=2, nic_gbps=8.0))
    swarm = Swarm(sim, 2, GB)
    swarm.add_holder("trainer", "d0r0n0")
    reader = swarm.add_reader("r", "d0r0n1")
    swarm.read(reader, 0, "trainer", held=True)
    swarm.read(reader, 1, "trainer", held=True)
    sim.at(0.5, lambda: swarm.release("r", 0))  # before its bytes arrive at 2 s
    sim.at(3.0, lambda: swarm.release("r", 1))  # after
    landed = []
    swarm.on_landed.append(lambda m, chunk, src: landed.append((chunk, sim.now)))
    sim.run()
    assert landed == [(0, 2.0), (1, 3.0)]


# ---- the modes and the CLI ------------------------------------------------------------------------
def test_a_mode_with_the_hub_modeled_reports_its_work_and_the_stall_it_adds():
    p = ModeParams(**{**SMALL, "hub_exchange_ms": 20.0, "hub_begin_ms": 20.0, "hub_end_ms": 20.0})
    r = standalone(p, strategies=("tensorhub", "pull_from_trainer"))
    assert set(r["runs"]) == {"tensorhub", FREE_HUB, "pull_from_trainer"}
    assert set(r["stall_ratio_vs"]) == {"pull_from_trainer"}
    hub = r["hub"]
    runs = r["runs"]
    assert hub["extra_stall_s"] == pytest.approx(runs["tensorhub"]["max_s"] - runs[FREE_HUB]["max_s"])
    assert hub["extra_stall_s"] > 0 and hub["busy_s"] > 0 and hub["exchanges_per_reader"] >= 3
    free = standalone(ModeParams(**SMALL), strategies=("tensorhub",))
    assert "hub" not in free and free["runs"]["tensorhub"]["max_s"] == r["runs"][FREE_HUB]["max_s"]


def test_every_mode_counts_the_hub():
    p = ModeParams(**{**SMALL, "hub_exchange_ms": 5.0, "run_chunks": 8})
    res = run_all(p)["modes"]
    for mode in ("standalone", "elastic", "cross_dc"):
        assert res[mode]["hub"]["busy_s"] > 0 and res[mode]["hub"]["run_chunks"] == 8
    assert res["cross_dc"]["wan_copies_per_version"]["tensorhub"] == 1.0  # one WAN copy, hub or not


def test_cli_models_the_hub_when_asked(capsys, tmp_path):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()] + ["--modes", "standalone"]
    assert cli.main([*args, "--hub-measured", "--hub-cores", "2"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["params"]["hub_exchange_ms"] == MEASURED.exchange_s * 1e3 and res["params"]["hub_cores"] == 2
    assert res["modes"]["standalone"]["hub"]["cores"] == 2
    bench = tmp_path / "control.txt"
    bench.write_text("a table\n" + json.dumps({"bench": "control", "chunk_mib": 8.0, "points": [
        {"readers": 8, "chunks": 256, "hub_cpu_per_exchange_ms": 3.0, "reads_per_exchange": 6.0}]}) + "\n")
    assert cli.main([*args, "--hub-json", str(bench), "--sweep", "run_chunks=1,4"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["params"]["hub_exchange_ms"] == 3.0
    assert [row["run_chunks"] for row in res["sweep"]["rows"]] == [1, 4]
    assert all("hub" in row for row in res["sweep"]["rows"])
    assert cli.main([*args, "--hub-json", str(tmp_path / "missing.txt")]) == 2
    assert cli.main([*args, "--hub-json", str(bench), "--hub-measured"]) == 2
