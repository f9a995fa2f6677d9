"""The simulator on the network lab's own topologies, and its error against a lab run.

`tensorhub bench modes` runs real processes over shaped veths; this module runs the same workloads
(same hosts, racks, datacenters, link rates, version size, chunking, window and planner settings)
through the flow simulator, so the two can be compared mode by mode:

    python -m tensorhub_dev.sim.calibrate --lab-json modes.json      # compare with a saved lab run
    python -m tensorhub_dev.sim.calibrate --rollouts 8 --size-mb 64   # simulate the lab only

Both report per-rollout fetch seconds; the comparison is on total stall (sum over rollouts) and worst
rollout, as `error = (sim - lab) / lab`. What the simulator leaves out (and so what the error measures):
process-side costs of a fetch (manifest, buffer registration, hub round trips, Python polling) and TCP
dynamics below the flow level (slow start, tbf bursts).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, fields

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.netlab.spec import DatacenterSpec, LabSpec, RackSpec
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_verl.ros.wire.topology import Location
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.swarm import PullFromSource, Relay, Swarm, tree_parents
from tensorhub_dev.sim.tensorhub import TensorHub
from tensorhub_dev.sim.topology import Cluster

MIB = 1 << 20
MBIT = 1e6 / 8  # bytes per second in one Mbit/s
TRAINER = "trainer"


@dataclass(frozen=True, kw_only=True, slots=True)
class LabWorkload:
    """The lab benchmark's knobs that shape the transfer. `bench.modes.LabBenchParams` extends it with the
    knobs of running real processes, so the simulator always models the workload the lab runs."""

    size_mb: float = 64.0
    """Size of the version (MiB of float32 weights)."""
    chunk_mb: float = 2.0
    """Transfer unit: 2 MiB takes 84 ms on a 200 Mbit/s NIC, a few hub round trips' worth."""
    rollouts: int = 8
    """standalone / cross_dc readers."""
    holders: int = 4
    """elastic: readers already holding the version."""
    joiners: int = 4
    """elastic: readers joining one by one."""
    join_interval_s: float = 2.0
    busy_flows: int = 4
    nic_mbit: float = 200.0
    wan_mbit: float = 100.0
    window: int = 4
    """Reads in flight per reader (ClientConfig.window)."""
    max_inflight_per_source: int = 8
    """Hub planner: reads one source serves at once (PlannerConfig.max_inflight_per_source)."""

    def __post_init__(self) -> None:
        if min(self.rollouts, self.joiners) < 1 or self.holders < 1:
            raise ConfigError("rollouts, holders and joiners must be >= 1")
        if self.size_mb <= 0 or self.chunk_mb <= 0:
            raise ConfigError("size_mb and chunk_mb must be > 0")

    @classmethod
    def from_params(cls, params: dict, **overrides) -> "LabWorkload":
        names = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in params.items() if k in names}, **overrides})

    @property
    def nchunks(self) -> int:
        return max(1, math.ceil(self.size_mb / self.chunk_mb))

    @property
    def chunk_bytes(self) -> float:
        return self.size_mb * MIB / self.nchunks


def lab_spec(w: LabWorkload, mode: str) -> tuple[LabSpec, list[str]]:
    """The network lab that `bench modes` runs ``mode`` in (standalone and elastic share one), and its rollout
    hosts in bench order. The benchmark builds this lab; the simulator models it (``lab_cluster``).

    standalone/elastic: trainer, hub and the busy flows' sink in rack r0; the readers split over racks r1 and
    r2, interleaved. cross_dc: trainer and hub in dc0, the readers in dc1 behind the WAN."""
    if mode == "cross_dc":
        rollouts = tuple(f"c{i}" for i in range(w.rollouts))
        return LabSpec(datacenters=(
            DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=(TRAINER, "hub")),)),
            DatacenterSpec(name="dc1", racks=(RackSpec(name="r0", hosts=rollouts),))),
            nic_mbit=w.nic_mbit, wan_mbit=w.wan_mbit), list(rollouts)
    if mode not in ("standalone", "elastic"):
        raise ConfigError(f"unknown mode {mode!r}")
    n = max(w.rollouts, w.holders + w.joiners)
    half = (n + 1) // 2
    a, b = tuple(f"a{i}" for i in range(half)), tuple(f"b{i}" for i in range(n - half))
    return LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=(
        RackSpec(name="r0", hosts=(TRAINER, "hub", "sink")),
        RackSpec(name="r1", hosts=a),
        RackSpec(name="r2", hosts=b))),), nic_mbit=w.nic_mbit), interleave(a, b)


def interleave(a: tuple[str, ...], b: tuple[str, ...]) -> list[str]:
    """a0, b0, a1, b1, ...: consecutive readers sit in different racks, so every rack gets holders and joiners."""
    out = [h for pair in zip(a, b) for h in pair]
    return out + list(a[len(b):]) + list(b[len(a):])


def lab_cluster(w: LabWorkload, mode: str) -> tuple[Cluster, list[str]]:
    """The lab's topology (``lab_spec``) as a simulator cluster; returns it and the rollout hosts in bench order."""
    spec, rollouts = lab_spec(w, mode)
    nodes = {host: Location(dc=dc.name, rack=rack.name, node=host)
             for dc in spec.datacenters for rack in dc.racks for host in rack.hosts}
    return Cluster(nodes=nodes, nic_Bps={n: spec.nic_mbit * MBIT for n in nodes},
                   rack_uplink_Bps=None if spec.rack_uplink_mbit is None else spec.rack_uplink_mbit * MBIT,
                   wan_Bps=None if spec.wan_mbit is None else spec.wan_mbit * MBIT), rollouts


def _strategy(name: str, swarm: Swarm, w: LabWorkload, readers: list[str], report_lag_s: float):
    if name == "tensorhub":
        return TensorHub(swarm, PlannerConfig(max_inflight_per_source=w.max_inflight_per_source),
                         window=w.window, report_lag_s=report_lag_s)
    if name == "pull_from_trainer":
        return PullFromSource(swarm, TRAINER, window=w.window)
    if name == "broadcast":
        # gloo's broadcast of one CPU tensor: a binomial tree, whole buffer per hop (no pipelining).
        return Relay(swarm, binomial_parents(TRAINER, readers), window=swarm.nchunks)
    if name == "tree":
        return Relay(swarm, tree_parents(TRAINER, readers), window=1)
    raise ConfigError(f"unknown strategy {name!r}")


def binomial_parents(root: str, readers: list[str]) -> dict[str, str]:
    """Binomial-tree broadcast over ranks 0..n (0 = root): rank r's parent is r with its highest bit cleared."""
    ranks = [root, *readers]
    return {r: ranks[i + 1 - (1 << ((i + 1).bit_length() - 1))] for i, r in enumerate(readers)}


def _fetch(w: LabWorkload, mode: str, strategy: str, report_lag_s: float) -> dict:
    cluster, hosts = lab_cluster(w, mode)
    sim = FlowSim(cluster)
    whole = strategy == "broadcast"
    swarm = Swarm(sim, 1 if whole else w.nchunks, w.size_mb * MIB if whole else w.chunk_bytes)
    swarm.add_holder(TRAINER, TRAINER)
    names = [f"rollout-{i}" for i in range(w.rollouts)]
    strat = _strategy(strategy, swarm, w, names, report_lag_s)
    for name, host in zip(names, hosts):
        strat.join(name, host)
    sim.run(until=swarm.all_done)
    return _report(swarm, names, sim)


def _elastic(w: LabWorkload, strategy: str, report_lag_s: float) -> dict:
    cluster, hosts = lab_cluster(w, "elastic")
    sim = FlowSim(cluster)
    swarm = Swarm(sim, w.nchunks, w.chunk_bytes)
    swarm.add_holder(TRAINER, TRAINER)
    for i, host in enumerate(hosts[: w.holders]):
        swarm.add_holder(f"holder-{i}", host)
    for _ in range(w.busy_flows):  # the bench's endless TCP flows trainer -> sink
        sim.start_flow(TRAINER, "sink", math.inf)
    strat = _strategy(strategy, swarm, w, [], report_lag_s)
    names = [f"joiner-{i}" for i in range(w.joiners)]
    for i, (name, host) in enumerate(zip(names, hosts[w.holders: w.holders + w.joiners])):
        sim.at(i * w.join_interval_s, lambda name=name, host=host: strat.join(name, host))
    sim.run(until=lambda: len(swarm.readers()) == len(names) and swarm.all_done(names))
    return _report(swarm, names, sim)


def _report(swarm: Swarm, names: list[str], sim: FlowSim) -> dict:
    secs = [swarm.members[n].done_at - swarm.members[n].joined for n in names]
    return {"total_s": sum(secs), "max_s": max(secs), "mean_s": statistics.fmean(secs), "seconds": secs,
            "wan_bytes": sum(v for k, v in sim.bytes_on.items() if k[0] == "wan_in")}


STRATEGIES = {"standalone": ("tensorhub", "pull_from_trainer", "broadcast"),
              "elastic": ("tensorhub", "pull_from_trainer"),
              "cross_dc": ("tensorhub", "pull_from_trainer")}


def simulate_lab(w: LabWorkload, modes: tuple[str, ...] = ("standalone", "elastic", "cross_dc"),
                 report_lag_s: float = 0.0) -> dict:
    """Every mode's strategies on the lab topology: {mode: {strategy: report}}. `report_lag_s` is the hub
    round trip charged before a landed chunk can be served onward (0: the planner's ideal)."""
    out = {}
    for mode in modes:
        if mode not in STRATEGIES:
            raise ConfigError(f"unknown mode {mode!r}; choose from {sorted(STRATEGIES)}")
        out[mode] = {s: (_elastic(w, s, report_lag_s) if mode == "elastic" else _fetch(w, mode, s, report_lag_s))
                     for s in STRATEGIES[mode]}
    return out


def compare(lab: dict, sim: dict) -> list[dict]:
    """Rows (mode, variant, metric, lab, sim, error) for every variant both ran.

    `lab` is `bench modes` JSON ("modes" -> mode -> runs -> variant -> {total_s, max_s}); `sim` is
    `simulate_lab`'s result.
    """
    rows = []
    for mode, runs in sim.items():
        lab_runs = lab.get("modes", {}).get(mode, {}).get("runs", {})
        for variant, s in runs.items():
            if variant not in lab_runs:
                continue
            for metric in ("total_s", "max_s"):
                l_val = lab_runs[variant][metric]
                rows.append({"mode": mode, "variant": variant, "metric": metric, "lab_s": round(l_val, 3),
                             "sim_s": round(s[metric], 3), "error": round((s[metric] - l_val) / l_val, 3)})
    return rows


def calibrate(lab: dict, report_lag_s: float = 0.0, **overrides) -> dict:
    """Simulates the workload a saved lab run describes and compares; returns {"sim", "rows"}."""
    w = LabWorkload.from_params(lab["params"], **overrides)
    modes = tuple(m for m in lab.get("modes", {}) if m in STRATEGIES)
    sim = simulate_lab(w, modes, report_lag_s)
    return {"workload": {f.name: getattr(w, f.name) for f in fields(w)}, "sim": sim, "rows": compare(lab, sim)}


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'mode':<11} {'variant':<18} {'metric':<8} {'lab s':>8} {'sim s':>8} {'error':>7}"]
    for r in rows:
        lines.append(f"{r['mode']:<11} {r['variant']:<18} {r['metric']:<8} {r['lab_s']:>8.2f} {r['sim_s']:>8.2f} "
                     f"{r['error']:>+7.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.sim.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab-json", help="a `tensorhub bench modes --out` file to compare with")
    ap.add_argument("--modes", default="standalone,elastic,cross_dc")
    ap.add_argument("--report-lag-s", type=float, default=0.0,
                    help="hub round trip charged before a landed chunk is served onward")
    for f in fields(LabWorkload):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None)
    a = ap.parse_args(argv)
    overrides = {f.name: getattr(a, f.name) for f in fields(LabWorkload) if getattr(a, f.name) is not None}
    try:
        if a.lab_json:
            with open(a.lab_json) as fh:
                lab = json.loads(fh.read().strip().splitlines()[-1])
            result = calibrate(lab, a.report_lag_s, **overrides)
            print(format_rows(result["rows"]), file=sys.stderr)
        else:
            result = {"sim": simulate_lab(LabWorkload(**overrides), tuple(m for m in a.modes.split(",") if m),
                                          a.report_lag_s)}
    except (ConfigError, OSError, KeyError, ValueError) as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
