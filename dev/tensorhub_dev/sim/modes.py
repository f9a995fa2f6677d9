"""The TensorHub paper's three rollout modes at cluster scale, TensorHub beside baselines in one run.

Cluster: `racks` racks of `nodes_per_rack` nodes (default 16 x 8 = 128 nodes = 1,024 GPUs at 8 GPUs a
node). The unit of the simulation is a node with one NIC of `nic_gbps` (the node's way out, whether one
NIC or one per GPU): one rollout replica per node (TP=8) whose NIC carries the whole version; the 8 GPUs
behind it share it over NVLink, which is not the bottleneck. The first half of the racks is the
trainer's, the second half the rollouts'.

The trainer publishes from `trainer_nodes` nodes (the first ones of its half, rack by rack, as a job is
packed). 1 is today's verl path: every tensor gathered to the master rank, which publishes the whole
version through its node's NIC. N > 1 is every FSDP rank publishing its own shard: FSDP2 shards dim 0 of
every tensor, so the ranks of a node hold a contiguous 1/N byte range of each tensor, and the node is a
holder of 1/N of the chunks (`swarm.shard_chunks`), each chunk held by exactly one trainer node. The
node's 8 GPU ranks share its NIC in this model, as a rollout's 8 GPUs share theirs, so the physical
limit stays one copy of the version over one NIC (`ideal_s` = weights_gb * 8 / nic_gbps): every reader
must take in a whole copy through its own NIC. The version is visible only once every rank has
published, so all ranks hold their shards when the readers begin.

Chunks are coarse (the version / `chunks`) so event counts stay modest. To keep what a coarse chunk
distorts small, a reader keeps `window` (default 2) reads in flight instead of the client's 8: the real
client's 8 reads of a few MiB are a negligible fraction of a version; 8 reads of 1/64 of a version would
add a store-and-forward delay of 8/64 of the whole transfer per hop.

- standalone: R rollouts fetch a new version from the trainer. TensorHub vs every rollout pulling from
  the trainer vs a pipelined chain (ring) and binary-tree broadcast.
- elastic: H rollouts hold the version; J more join one by one (every `join_interval_s`) while the
  trainer is busy training (each of its nodes' NICs carries `busy_flows` endless flows). TensorHub
  (joiners read from peers, nearest first) vs joiners pulling from the busy trainer.
- cross_dc: trainer in dc0, R rollouts in dc1 behind a WAN. TensorHub (seeds cross the WAN, the rest
  read inside dc1) vs every rollout pulling across the WAN. Reports WAN bytes per version.

Deltas (``delta_changed_fraction`` > 0): standalone and cross_dc also run on the delta N-1 -> N, the version's
second form, beside the full version: every rollout holds N-1, so each moves the delta's encoded bytes,
``weights_gb x changed fraction x bytes per changed element / element bytes`` (the figures that
``tensorhub bench delta`` measures), as a version of that size with the same number of chunks. Each chunk's
delta is one object, so the hub grants as many leases as for the full version (``real_chunk_mib`` shrinks with
the bytes), unless ``delta_packed``: the per-chunk payloads then travel packed into wire chunks of
``real_chunk_mib``, and the hub grants leases for the delta's bytes. TensorHub with the delta (holders of the
delta serve it, one WAN copy per datacenter) is compared with the full baselines and with the same baselines
moving the delta (every rollout pulling the delta from the trainer: verl's ``delta_sharded`` shape). With
``delta_apply_gbps`` a rollout also applies the delta as chunks land, at that rate in GB/s of version bytes:
its stall is ``max(transfer, apply) + the last chunk's apply``. Elastic joiners hold no base version: they read
in full, so the elastic mode has no delta run.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, replace

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.hub_costs import MIB, HubCosts
from tensorhub_dev.sim.swarm import (
    PullFromSource,
    Relay,
    Source,
    Swarm,
    chain_parents,
    shard_chunks,
    tree_parents,
)
from tensorhub_dev.sim.tensorhub import TensorHub
from tensorhub_dev.sim.topology import GBIT, Cluster, build_cluster

log = logging.getLogger("tensorhub_dev.sim")

PAPER = {"standalone": 6.7, "elastic": 4.8, "cross_dc": 19.0}
"""Ratios the TensorHub paper reports (baseline / TensorHub), by mode: the stall for standalone and cross_dc,
the update time for elastic. The simulator and the lab benchmark (``bench.modes``) compare with these."""

TRAINER = "trainer"
FREE_HUB = "tensorhub_free_hub"
"""TensorHub with a hub that answers at once: run beside "tensorhub" when the hub is modeled, to tell the
stall the hub adds."""


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
    """Elastic: endless training flows out of (and into) each trainer node's NIC."""
    max_inflight_per_source: int = 4
    seeds_per_dc: int = 1
    trainer_nodes: int = 1
    """Trainer nodes publishing, each its own shard (1/N of the chunks) through its own NIC; 1 = the whole
    version gathered to one node (see the module docstring)."""
    hub_exchange_ms: float = 0.0
    """Hub CPU per exchange. With every hub_*_ms at 0 the hub is not modeled: it answers at once."""
    hub_lease_ms: float = 0.0
    """Hub CPU per lease granted, on top of the exchange's."""
    hub_begin_ms: float = 0.0
    hub_end_ms: float = 0.0
    hub_cores: int = 1
    """Requests the hub serves at once."""
    hub_retry_ms: float = 20.0
    """A reader whose answer came back short asks for work again no sooner than this."""
    run_chunks: int = 1
    """Real chunks per lease (1: today's protocol)."""
    real_chunk_mib: float = 8.0
    """The real transfer unit: each simulated chunk stands for chunk_bytes / this many real chunks."""
    hub_leases_per_exchange: int = 4
    """Leases one exchange grants (the fetcher asks when half its window of 8 is free)."""
    delta_changed_fraction: float = 0.0
    """Fraction of the version's elements one step changes; > 0 adds delta runs beside the full ones."""
    delta_bytes_per_changed: float = 1.2
    """Encoded bytes per changed element (``tensorhub bench delta``'s chosen encodings)."""
    element_bytes: int = 2
    """Bytes per element of the published version (bf16)."""
    delta_apply_gbps: float = 0.0
    """A rollout's apply rate, GB/s of version bytes; 0: the apply is not modeled (free)."""
    delta_packed: int = 1
    """1: the delta's per-chunk payloads travel packed into wire chunks of ``real_chunk_mib`` (leases scale with
    its bytes: the product's delta form, a blob chunked like any layout); 0: one object per chunk of the version
    (as many leases as the full version, each small)."""

    def __post_init__(self) -> None:
        if self.weights_gb <= 0 or self.chunks < 1 or self.window < 1:
            raise ConfigError("weights_gb > 0, chunks >= 1 and window >= 1 are required")
        half = self.racks // 2 * self.nodes_per_rack
        if not 1 <= self.trainer_nodes <= min(half, self.chunks):
            raise ConfigError(f"trainer_nodes={self.trainer_nodes} must be >= 1, fit the trainer half of the "
                              f"cluster ({half} nodes) and hold at least one of the {self.chunks} chunks each")
        if self.rollouts > half or self.holders + self.joiners > half:
            raise ConfigError(f"rollout nodes (rollouts={self.rollouts}, holders+joiners="
                              f"{self.holders + self.joiners}) must fit the rollout half of the cluster ({half})")
        if not 0 <= self.delta_changed_fraction <= 1 or self.delta_bytes_per_changed <= 0 \
                or self.element_bytes < 1 or self.delta_apply_gbps < 0:
            raise ConfigError("delta_changed_fraction must be in [0, 1], delta_bytes_per_changed > 0, "
                              "element_bytes >= 1 and delta_apply_gbps >= 0")
        self.hub()  # the hub's fields are checked where they are used

    @property
    def chunk_bytes(self) -> float:
        return self.weights_gb * 1e9 / self.chunks

    @property
    def delta_gb(self) -> float:
        """The delta's encoded bytes, in GB (0 without deltas)."""
        return (self.weights_gb * self.delta_changed_fraction * self.delta_bytes_per_changed
                / self.element_bytes)

    def delta(self, hub_chunks: bool = True) -> "ModeParams":
        """The same cluster moving the delta instead of the version (module docstring). ``hub_chunks``: with the
        hub modeled, a packed delta gets no more simulated chunks than it has lease runs (the model makes at
        least one hub exchange per simulated chunk, which the real fetcher does not for a delta of few real
        chunks); False keeps the version's chunking (for the baselines, which do not use the hub)."""
        if not self.delta_packed:
            return replace(self, weights_gb=self.delta_gb, delta_changed_fraction=0.0,
                           real_chunk_mib=self.real_chunk_mib * self.delta_gb / self.weights_gb)
        chunks = self.chunks
        if hub_chunks and self.hub() is not None:
            runs = math.ceil(self.delta_gb * 1e9 / (self.real_chunk_mib * MIB * self.run_chunks) - 1e-9)
            chunks = min(self.chunks, max(runs, self.trainer_nodes, 1))
        return replace(self, weights_gb=self.delta_gb, chunks=chunks, delta_changed_fraction=0.0)

    def hub(self) -> HubCosts | None:
        """The modeled hub, or None when every hub cost is 0 (the hub answers at once)."""
        costs = HubCosts(exchange_s=self.hub_exchange_ms / 1e3, lease_s=self.hub_lease_ms / 1e3,
                         begin_s=self.hub_begin_ms / 1e3, end_s=self.hub_end_ms / 1e3, cores=self.hub_cores,
                         run_chunks=self.run_chunks, real_chunk_mib=self.real_chunk_mib,
                         leases_per_exchange=self.hub_leases_per_exchange, retry_s=self.hub_retry_ms / 1e3)
        return None if costs.free else costs

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


def _trainer_nodes(cluster: Cluster, p: ModeParams) -> list[str]:
    """The first `trainer_nodes` nodes of datacenter 0 (the trainer's half), rack by rack."""
    return list(cluster.nodes)[: p.trainer_nodes]


def _add_trainer(swarm: Swarm, nodes: list[str]) -> Source:
    """The trainer as holders: one complete holder, or one holder per node with that node's shard."""
    if len(nodes) == 1:
        swarm.add_holder(TRAINER, nodes[0])
        return TRAINER
    ranks = tuple(f"{TRAINER}-{r}" for r in range(len(nodes)))
    for name, node, chunks in zip(ranks, nodes, shard_chunks(swarm.nchunks, len(nodes))):
        swarm.add_holder(name, node, chunks)
    return ranks


def _trainer_served(swarm: Swarm, trainer: Source) -> dict:
    ranks = (trainer,) if isinstance(trainer, str) else trainer
    by_rank = [swarm.served[r] for r in ranks]
    return {"trainer_bytes_served": sum(by_rank), "trainer_bytes_by_rank": by_rank}


def _strategy(name: str, swarm: Swarm, p: ModeParams, trainer: Source, readers: list[str]):
    if name == "tensorhub":
        return TensorHub(swarm, p.planner(), window=p.window, hub=p.hub())
    if name == FREE_HUB:
        return TensorHub(swarm, p.planner(), window=p.window)
    if name == "pull_from_trainer":
        return PullFromSource(swarm, trainer, window=p.window)
    # Relays move one chunk at a time per hop: a second one would only share the same dedicated link.
    if name == "ring":
        return Relay(swarm, chain_parents(trainer, readers), window=1)
    if name == "tree":
        return Relay(swarm, tree_parents(trainer, readers), window=1)
    raise ConfigError(f"unknown strategy {name!r}; choose tensorhub, {FREE_HUB}, pull_from_trainer, ring, "
                      f"tree")


def _run_fetch(p: ModeParams, cluster: Cluster, trainer_nodes: list[str], nodes: list[str], strategy: str) -> dict:
    t0 = time.perf_counter()
    sim = FlowSim(cluster)
    swarm = Swarm(sim, p.chunks, p.chunk_bytes)
    trainer = _add_trainer(swarm, trainer_nodes)
    readers = [f"rollout-{i}" for i in range(len(nodes))]
    strat = _strategy(strategy, swarm, p, trainer, readers)
    for name, node in zip(readers, nodes):
        strat.join(name, node)
    sim.run(until=swarm.all_done)
    rep = swarm.report()
    rep.update(strategy=strategy, wan_bytes=sum(v for k, v in sim.bytes_on.items() if k[0] == "wan_in"),
               **_trainer_served(swarm, trainer), wall_s=round(time.perf_counter() - t0, 2),
               plan_calls=getattr(strat, "plan_calls", 0), **_hub_report(strat))
    return rep


def _hub_report(strategy) -> dict:
    """{"hub": the hub's figures} for TensorHub with a modeled hub, else {}."""
    hub = strategy.hub_report() if isinstance(strategy, TensorHub) else None
    return {} if hub is None else {"hub": hub}


def _with_free_hub(p: ModeParams, strategies: tuple[str, ...]) -> tuple[str, ...]:
    """With a modeled hub, TensorHub runs a second time with a free one (the stall the hub adds)."""
    return (*strategies, FREE_HUB) if p.hub() is not None and "tensorhub" in strategies else strategies


def _hub_figures(runs: dict, metric: str) -> dict:
    """The hub's figures for the mode's report: its work, use, and the stall it adds (`metric` of TensorHub
    with the hub modeled minus with a free hub); {} when the hub is not modeled."""
    hub = runs["tensorhub"].get("hub")
    if hub is None or FREE_HUB not in runs:
        return {}
    readers = runs["tensorhub"]["readers"]
    exchanges = sum(hub["requests"].values())
    return {"hub": {**hub, "readers": readers, "exchanges_per_reader": exchanges / readers,
                    "extra_stall_s": runs["tensorhub"][metric] - runs[FREE_HUB][metric],
                    "free_hub_s": runs[FREE_HUB][metric]}}


def _baselines(runs: dict) -> dict:
    return {s: r for s, r in runs.items() if s not in ("tensorhub", FREE_HUB)}


def standalone(p: ModeParams, strategies=("tensorhub", "pull_from_trainer", "ring", "tree")) -> dict:
    cluster = _cluster(p)
    nodes = _rollout_nodes(cluster, p)[: p.rollouts]
    trainer = _trainer_nodes(cluster, p)
    runs = {s: _run_fetch(p, cluster, trainer, nodes, s) for s in _with_free_hub(p, strategies)}
    th = runs["tensorhub"]["max_s"]
    ideal = p.chunk_bytes * p.chunks / (p.nic_gbps * GBIT)
    return {"mode": "standalone", "trainer_nodes": p.trainer_nodes, "ideal_s": ideal,
            "stall_vs_ideal": th / ideal, "runs": runs,
            "stall_ratio_vs": {s: r["max_s"] / th for s, r in _baselines(runs).items()},
            "paper_stall_ratio": PAPER["standalone"], **_hub_figures(runs, "max_s")}


def cross_dc(p: ModeParams, strategies=("tensorhub", "pull_from_trainer", "ring")) -> dict:
    cluster = _cluster(p, dcs=2)
    nodes = _rollout_nodes(cluster, p, dc=1)[: p.rollouts]
    trainer = _trainer_nodes(cluster, p)
    runs = {s: _run_fetch(p, cluster, trainer, nodes, s) for s in _with_free_hub(p, strategies)}
    th = runs["tensorhub"]
    version = p.chunk_bytes * p.chunks
    return {"mode": "cross_dc", "wan_gbps": p.wan_gbps, "ideal_s": version / (p.wan_gbps * 1e9 / 8), "runs": runs,
            "stall_ratio_vs": {s: r["max_s"] / th["max_s"] for s, r in _baselines(runs).items()},
            "wan_copies_per_version": {s: r["wan_bytes"] / version for s, r in runs.items()},
            "paper_stall_ratio": PAPER["cross_dc"], **_hub_figures(runs, "max_s")}


def elastic(p: ModeParams, strategies=("tensorhub", "pull_from_trainer")) -> dict:
    cluster = _cluster(p)
    trainer_nodes = _trainer_nodes(cluster, p)
    # Joiners sit beside holders in every rollout rack, as replicas added to a running job would.
    by_rack: dict[str, list[str]] = {}
    for n in _rollout_nodes(cluster, p):
        by_rack.setdefault(cluster.nodes[n].rack, []).append(n)
    per_rack = math.ceil(p.joiners / len(by_rack))
    joiner_nodes = [n for nodes in by_rack.values() for n in nodes[-per_rack:]][: p.joiners]
    holder_nodes = [n for n in _rollout_nodes(cluster, p) if n not in joiner_nodes][: p.holders]
    # Training traffic: each trainer node exchanges endless flows with the next `busy_flows` nodes of the
    # trainer's half (FSDP's all-gathers and reduce-scatters), which share its NIC fairly.
    half = [n for n in cluster.nodes if n not in _rollout_nodes(cluster, p)]
    busy = [(t, half[(i + k) % len(half)]) for i, t in enumerate(trainer_nodes) for k in range(1, p.busy_flows + 1)]
    runs = {}
    for strategy in _with_free_hub(p, strategies):
        t0 = time.perf_counter()
        sim = FlowSim(cluster)
        swarm = Swarm(sim, p.chunks, p.chunk_bytes)
        trainer = _add_trainer(swarm, trainer_nodes)
        for i, node in enumerate(holder_nodes):
            swarm.add_holder(f"holder-{i}", node)
        for node, peer in busy:
            sim.start_flow(node, peer, math.inf)
            sim.start_flow(peer, node, math.inf)
        strat = _strategy(strategy, swarm, p, trainer, [])
        names = [f"joiner-{i}" for i in range(len(joiner_nodes))]
        for i, (name, node) in enumerate(zip(names, joiner_nodes)):
            sim.at(i * p.join_interval_s, lambda name=name, node=node: strat.join(name, node))
        sim.run(until=lambda: len(swarm.readers()) == len(names) and swarm.all_done(names))
        rep = swarm.report(names)
        rep.update(strategy=strategy, **_trainer_served(swarm, trainer),
                   wall_s=round(time.perf_counter() - t0, 2), plan_calls=getattr(strat, "plan_calls", 0),
                   **_hub_report(strat))
        runs[strategy] = rep
    th = runs["tensorhub"]["mean_s"]
    return {"mode": "elastic", "ideal_s": p.chunk_bytes * p.chunks / (p.nic_gbps * GBIT), "runs": runs,
            "update_ratio_vs": {s: r["mean_s"] / th for s, r in _baselines(runs).items()},
            "paper_update_ratio": PAPER["elastic"], **_hub_figures(runs, "mean_s")}


DELTA_MODES = ("standalone", "cross_dc")
"""The modes with a delta run (elastic joiners hold no base version)."""


def with_delta(p: ModeParams, full: dict, mode: str) -> dict:
    """The delta run of ``mode`` beside its full run ``full``: TensorHub moving the delta against every full
    baseline and against the same baselines moving the delta."""
    fns = {"standalone": standalone, "cross_dc": cross_dc}
    baselines = tuple(s for s in full["runs"] if s not in ("tensorhub", FREE_HUB))
    d = fns[mode](p.delta(), strategies=("tensorhub",))
    fine = p.delta(hub_chunks=False)
    cluster = _cluster(fine, dcs=2 if mode == "cross_dc" else 1)
    nodes = _rollout_nodes(cluster, fine, dc=1 if mode == "cross_dc" else 0)[: fine.rollouts]
    trainer = _trainer_nodes(cluster, fine)
    d["runs"].update({s: _run_fetch(fine, cluster, trainer, nodes, s) for s in baselines})
    apply_s = p.weights_gb / p.delta_apply_gbps if p.delta_apply_gbps else 0.0
    for r in d["runs"].values():
        r["transfer_max_s"] = r["max_s"]
        if apply_s:
            r["max_s"] = max(r["max_s"], apply_s) + apply_s / p.chunks
    th = d["runs"]["tensorhub"]["max_s"]
    version = p.weights_gb * 1e9
    return {"delta_gb": p.delta_gb, "delta_over_version": p.delta_gb / p.weights_gb,
            "changed_fraction": p.delta_changed_fraction, "bytes_per_changed": p.delta_bytes_per_changed,
            "packed": bool(p.delta_packed),
            "apply_s": apply_s, "runs": d["runs"],
            "stall_ratio_vs_full": {s: r["max_s"] / th for s, r in full["runs"].items() if s != FREE_HUB},
            "stall_ratio_vs_delta": {s: r["max_s"] / th for s, r in _baselines(d["runs"]).items()},
            "wan_bytes_per_version": {s: r["wan_bytes"] for s, r in d["runs"].items()} if mode == "cross_dc" else {},
            "wan_over_delta": ({s: r["wan_bytes"] / (p.delta_gb * 1e9) for s, r in d["runs"].items()}
                               if mode == "cross_dc" else {}),
            "version_bytes": version}


def run_all(p: ModeParams, modes=("standalone", "elastic", "cross_dc")) -> dict:
    fns = {"standalone": standalone, "elastic": elastic, "cross_dc": cross_dc}
    unknown = set(modes) - set(fns)
    if unknown:
        raise ConfigError(f"unknown mode(s) {sorted(unknown)}; choose from {sorted(fns)}")
    out = {"params": asdict(p), "modes": {}}
    for m in modes:
        t0 = time.perf_counter()
        out["modes"][m] = fns[m](p)
        if p.delta_changed_fraction > 0 and m in DELTA_MODES:
            out["modes"][m]["delta"] = with_delta(p, out["modes"][m], m)
        log.info("mode %s simulated in %.1fs", m, time.perf_counter() - t0)
    return out
