"""The TensorHub paper's three rollout modes at cluster scale, TensorHub beside baselines in one run.

Cluster: `racks` racks of `nodes_per_rack` nodes (default 16 x 8 = 128 nodes = 1,024 GPUs at 8 GPUs a
node). The unit of the simulation is a node: one rollout replica per node (TP=8) whose node NIC carries
the whole version; the 8 GPUs behind it share it over NVLink, which is not the bottleneck. The trainer
publishes from one node (its full `hf` tensors, as verl gathers them); the rest of the trainer's nodes
only carry training traffic.

Chunks are coarse (the version / `chunks`) so event counts stay modest. To keep what a coarse chunk
distorts small, a reader keeps `window` (default 2) reads in flight instead of the client's 8: the real
client's 8 reads of a few MiB are a negligible fraction of a version; 8 reads of 1/64 of a version would
add a store-and-forward delay of 8/64 of the whole transfer per hop.

- standalone: R rollouts fetch a new version from the trainer. TensorHub vs every rollout pulling from
  the trainer vs a pipelined chain (ring) and binary-tree broadcast.
- elastic: H rollouts hold the version; J more join one by one (every `join_interval_s`) while the
  trainer is busy training (its NIC carries `busy_flows` endless flows). TensorHub (joiners read from
  peers, nearest first) vs joiners pulling from the busy trainer.
- cross_dc: trainer in dc0, R rollouts in dc1 behind a WAN. TensorHub (seeds cross the WAN, the rest
  read inside dc1) vs every rollout pulling across the WAN. Reports WAN bytes per version.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.planner import PlannerConfig
from tensorhub_verl.sim.engine import FlowSim
from tensorhub_verl.sim.swarm import PullFromSource, Relay, Swarm, chain_parents, tree_parents
from tensorhub_verl.sim.tensorhub import TensorHub
from tensorhub_verl.sim.topology import Cluster, build_cluster

log = logging.getLogger("tensorhub_verl.sim")

PAPER = {"standalone_stall_ratio": 6.7, "elastic_update_ratio": 4.8, "cross_dc_stall_ratio": 19.0}
"""Ratios the TensorHub paper reports (baseline / TensorHub)."""

TRAINER = "trainer"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModeParams:
    weights_gb: float = 100.0
    """Bytes of one version, in GB (1e9)."""
    chunks: int = 64
    """Chunks per version (coarse; see the module docstring)."""
    window: int = 2
    """Reads in flight per reader."""
    nic_gbps: float = 400.0
    """Each node's NIC, per direction."""
    racks: int = 16
    nodes_per_rack: int = 8
    rack_uplink_gbps: float | None = 1600.0
    """Per rack, per direction (2:1 oversubscribed at 8 x 400G)."""
    wan_gbps: float = 100.0
    """Cross-dc mode: each datacenter's WAN access link."""
    rollouts: int = 64
    """Standalone / cross-dc: rollout nodes fetching the version."""
    holders: int = 48
    """Elastic: rollouts already holding the version."""
    joiners: int = 16
    """Elastic: rollouts joining one by one."""
    join_interval_s: float = 5.0
    """Elastic: seconds between two joins."""
    busy_flows: int = 8
    """Elastic: endless training flows out of (and into) the trainer's NIC."""
    max_inflight_per_source: int = 4
    seeds_per_dc: int = 1

    def __post_init__(self) -> None:
        if self.weights_gb <= 0 or self.chunks < 1 or self.window < 1:
            raise ConfigError("weights_gb > 0, chunks >= 1 and window >= 1 are required")
        half = self.racks // 2 * self.nodes_per_rack
        if self.rollouts > half or self.holders + self.joiners > half:
            raise ConfigError(f"rollout nodes (rollouts={self.rollouts}, holders+joiners="
                              f"{self.holders + self.joiners}) must fit the rollout half of the cluster ({half})")

    @property
    def chunk_bytes(self) -> float:
        return self.weights_gb * 1e9 / self.chunks

    def planner(self) -> PlannerConfig:
        return PlannerConfig(max_inflight_per_source=self.max_inflight_per_source, seeds_per_dc=self.seeds_per_dc)


def _cluster(p: ModeParams, dcs: int = 1) -> Cluster:
    # Cross-dc: each dc gets half the racks, so the cluster keeps racks x nodes_per_rack nodes in all.
    racks = p.racks if dcs == 1 else p.racks // 2
    return build_cluster(dcs=dcs, racks_per_dc=racks, nodes_per_rack=p.nodes_per_rack, nic_gbps=p.nic_gbps,
                         rack_uplink_gbps=p.rack_uplink_gbps, wan_gbps=p.wan_gbps if dcs > 1 else None)


def _rollout_nodes(cluster: Cluster, p: ModeParams, dc: int = 0) -> list[str]:
    """Nodes of the cluster's second half (the first half is the trainer's), spread rack by rack."""
    if dc:
        return [n for n in cluster.nodes if n.startswith(f"d{dc}")]
    first = p.racks // 2
    return [n for n, loc in cluster.nodes.items() if int(loc.rack[1:]) >= first]


def _strategy(name: str, swarm: Swarm, p: ModeParams, readers: list[str]):
    if name == "tensorhub":
        return TensorHub(swarm, p.planner(), window=p.window)
    if name == "pull_from_trainer":
        return PullFromSource(swarm, TRAINER, window=p.window)
    # Relays move one chunk at a time per hop: a second one would only share the same dedicated link.
    if name == "ring":
        return Relay(swarm, chain_parents(TRAINER, readers), window=1)
    if name == "tree":
        return Relay(swarm, tree_parents(TRAINER, readers), window=1)
    raise ConfigError(f"unknown strategy {name!r}; choose tensorhub, pull_from_trainer, ring, tree")


def _run_fetch(p: ModeParams, cluster: Cluster, trainer_node: str, nodes: list[str], strategy: str) -> dict:
    t0 = time.perf_counter()
    sim = FlowSim(cluster)
    swarm = Swarm(sim, p.chunks, p.chunk_bytes)
    swarm.add_holder(TRAINER, trainer_node)
    readers = [f"rollout-{i}" for i in range(len(nodes))]
    strat = _strategy(strategy, swarm, p, readers)
    for name, node in zip(readers, nodes):
        strat.join(name, node)
    sim.run(until=swarm.all_done)
    rep = swarm.report()
    rep.update(strategy=strategy, wan_bytes=sum(v for k, v in sim.bytes_on.items() if k[0] == "wan_in"),
               trainer_bytes_served=swarm.served[TRAINER], wall_s=round(time.perf_counter() - t0, 2),
               plan_calls=getattr(strat, "plan_calls", 0))
    return rep


def standalone(p: ModeParams, strategies=("tensorhub", "pull_from_trainer", "ring", "tree")) -> dict:
    cluster = _cluster(p)
    nodes = _rollout_nodes(cluster, p)[: p.rollouts]
    trainer = next(iter(cluster.nodes))
    runs = {s: _run_fetch(p, cluster, trainer, nodes, s) for s in strategies}
    th = runs["tensorhub"]["max_s"]
    return {"mode": "standalone", "ideal_s": p.chunk_bytes * p.chunks / cluster.nic_Bps[trainer], "runs": runs,
            "stall_ratio_vs": {s: r["max_s"] / th for s, r in runs.items() if s != "tensorhub"},
            "paper_stall_ratio": PAPER["standalone_stall_ratio"]}


def cross_dc(p: ModeParams, strategies=("tensorhub", "pull_from_trainer", "ring")) -> dict:
    cluster = _cluster(p, dcs=2)
    nodes = _rollout_nodes(cluster, p, dc=1)[: p.rollouts]
    trainer = next(iter(cluster.nodes))
    runs = {s: _run_fetch(p, cluster, trainer, nodes, s) for s in strategies}
    th = runs["tensorhub"]
    version = p.chunk_bytes * p.chunks
    return {"mode": "cross_dc", "wan_gbps": p.wan_gbps, "ideal_s": version / (p.wan_gbps * 1e9 / 8), "runs": runs,
            "stall_ratio_vs": {s: r["max_s"] / th["max_s"] for s, r in runs.items() if s != "tensorhub"},
            "wan_copies_per_version": {s: r["wan_bytes"] / version for s, r in runs.items()},
            "paper_stall_ratio": PAPER["cross_dc_stall_ratio"]}


def elastic(p: ModeParams, strategies=("tensorhub", "pull_from_trainer")) -> dict:
    cluster = _cluster(p)
    trainer = next(iter(cluster.nodes))
    # Joiners sit beside holders in every rollout rack, as replicas added to a running job would.
    by_rack: dict[str, list[str]] = {}
    for n in _rollout_nodes(cluster, p):
        by_rack.setdefault(cluster.nodes[n].rack, []).append(n)
    per_rack = math.ceil(p.joiners / len(by_rack))
    joiner_nodes = [n for nodes in by_rack.values() for n in nodes[-per_rack:]][: p.joiners]
    holder_nodes = [n for n in _rollout_nodes(cluster, p) if n not in joiner_nodes][: p.holders]
    busy_peers = [n for n in cluster.nodes if n != trainer and n not in holder_nodes + joiner_nodes][: p.busy_flows]
    runs = {}
    for strategy in strategies:
        t0 = time.perf_counter()
        sim = FlowSim(cluster)
        swarm = Swarm(sim, p.chunks, p.chunk_bytes)
        swarm.add_holder(TRAINER, trainer)
        for i, node in enumerate(holder_nodes):
            swarm.add_holder(f"holder-{i}", node)
        for peer in busy_peers:  # training traffic: endless, shares the trainer's NIC fairly
            sim.start_flow(trainer, peer, math.inf)
            sim.start_flow(peer, trainer, math.inf)
        strat = _strategy(strategy, swarm, p, [])
        names = [f"joiner-{i}" for i in range(len(joiner_nodes))]
        for i, (name, node) in enumerate(zip(names, joiner_nodes)):
            sim.at(i * p.join_interval_s, lambda name=name, node=node: strat.join(name, node))
        sim.run(until=lambda: len(swarm.readers()) == len(names) and swarm.all_done(names))
        rep = swarm.report(names)
        rep.update(strategy=strategy, trainer_bytes_served=swarm.served[TRAINER],
                   wall_s=round(time.perf_counter() - t0, 2), plan_calls=getattr(strat, "plan_calls", 0))
        runs[strategy] = rep
    th = runs["tensorhub"]["mean_s"]
    return {"mode": "elastic", "ideal_s": p.chunk_bytes * p.chunks / cluster.nic_Bps[trainer], "runs": runs,
            "update_ratio_vs": {s: r["mean_s"] / th for s, r in runs.items() if s != "tensorhub"},
            "paper_update_ratio": PAPER["elastic_update_ratio"]}


def run_all(p: ModeParams, modes=("standalone", "elastic", "cross_dc")) -> dict:
    fns = {"standalone": standalone, "elastic": elastic, "cross_dc": cross_dc}
    unknown = set(modes) - set(fns)
    if unknown:
        raise ConfigError(f"unknown mode(s) {sorted(unknown)}; choose from {sorted(fns)}")
    out = {"params": asdict(p), "modes": {}}
    for m in modes:
        t0 = time.perf_counter()
        out["modes"][m] = fns[m](p)
        log.info("mode %s simulated in %.1fs", m, time.perf_counter() - t0)
    return out
