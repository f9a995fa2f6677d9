"""Distribution strategies on small clusters: exact schedules for the baselines, invariants for TensorHub."""

from __future__ import annotations

from collections import Counter

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.swarm import PullFromSource, Relay, Swarm, chain_parents, shard_chunks, tree_parents
from tensorhub_dev.sim.tensorhub import TensorHub
from tensorhub_dev.sim.topology import build_cluster

GB = 1e9


def _swarm(nchunks: int, chunk_bytes: float = GB, trainer_ranks: int = 1, **cluster):
    """A swarm whose trainer is one holder on d0r0n0, or `trainer_ranks` holders on d0r0n0.. each with its shard."""
    sim = FlowSim(build_cluster(**{"nodes_per_rack": 8, "nic_gbps": 8.0, **cluster}))  # NICs: 1 GB/s
    swarm = Swarm(sim, nchunks, chunk_bytes)
    if trainer_ranks == 1:
        swarm.add_holder("trainer", "d0r0n0")
    else:
        for r, chunks in enumerate(shard_chunks(nchunks, trainer_ranks)):
            swarm.add_holder(f"trainer-{r}", f"d0r0n{r}", chunks)
    return sim, swarm


def _done(swarm: Swarm) -> dict[str, float]:
    return {m.name: round(m.done_at, 9) for m in swarm.readers()}


def test_pull_from_trainer_is_bound_by_the_trainer_nic():
    sim, swarm = _swarm(3)
    strat = PullFromSource(swarm, "trainer", window=2)
    for i in range(3):
        strat.join(f"r{i}", f"d0r0n{i + 1}")
    sim.run(until=swarm.all_done)
    # 9 GB leave one 1 GB/s NIC, shared fairly: everyone ends at 9 s.
    assert _done(swarm) == {"r0": 9.0, "r1": 9.0, "r2": 9.0}
    assert swarm.served["trainer"] == 9 * GB


def test_chain_pipelines_one_chunk_per_hop():
    sim, swarm = _swarm(4)
    names = ["r0", "r1", "r2"]
    strat = Relay(swarm, chain_parents("trainer", names), window=1)
    for i, n in enumerate(names):
        strat.join(n, f"d0r0n{i + 1}")
    sim.run(until=swarm.all_done)
    # (chunks + hop - 1) chunk times: 4, 5, 6 s.
    assert _done(swarm) == {"r0": 4.0, "r1": 5.0, "r2": 6.0}


def test_binary_tree_schedule():
    sim, swarm = _swarm(2)
    names = ["r0", "r1", "r2"]
    assert tree_parents("trainer", names) == {"r0": "trainer", "r1": "trainer", "r2": "r0"}
    strat = Relay(swarm, tree_parents("trainer", names), window=1)
    for i, n in enumerate(names):
        strat.join(n, f"d0r0n{i + 1}")
    sim.run(until=swarm.all_done)
    # r0, r1 share the trainer's NIC (0.5 GB/s each): chunks at 2 s and 4 s; r2 trails r0 by one chunk time.
    assert _done(swarm) == {"r0": 4.0, "r1": 4.0, "r2": 5.0}


def test_relay_reader_without_parent_is_an_error():
    _, swarm = _swarm(1)
    with pytest.raises(ConfigError, match="no parent"):
        Relay(swarm, {}, window=1).join("x", "d0r0n1")


def _record_concurrency(swarm: Swarm) -> Counter:
    """Highest number of reads each source served at once."""
    peak: Counter = Counter()
    live: Counter = Counter()
    read = swarm.read

    def counting_read(reader, chunk, source):
        live[source] += 1
        peak[source] = max(peak[source], live[source])
        return read(reader, chunk, source)

    swarm.read = counting_read
    swarm.on_landed.insert(0, lambda reader, chunk, source: live.update({source: -1}))
    return peak


def test_tensorhub_delivers_every_chunk_and_respects_source_limits():
    sim, swarm = _swarm(16, chunk_bytes=0.25 * GB)
    peak = _record_concurrency(swarm)
    th = TensorHub(swarm, PlannerConfig(max_inflight_per_source=2), window=3)
    for i in range(6):
        th.join(f"r{i}", f"d0r0n{i + 1}")
    sim.run(until=swarm.all_done)
    assert all(m.have == set(range(16)) for m in swarm.readers())
    assert sum(swarm.served.values()) == 6 * 16 * 0.25 * GB
    assert max(peak.values()) <= 2
    # Readers served each other: the trainer sent far less than every copy.
    assert swarm.served["trainer"] < 6 * 4 * GB / 2


@pytest.mark.parametrize("seeds", [1, 2])
def test_tensorhub_crosses_the_wan_once_per_chunk(seeds):
    sim, swarm = _swarm(8, dcs=2, nodes_per_rack=4, wan_gbps=4.0)
    th = TensorHub(swarm, PlannerConfig(seeds_per_dc=seeds), window=2)
    for i in range(4):
        th.join(f"r{i}", f"d1r0n{i}")
    sim.run(until=swarm.all_done)
    assert sim.bytes_on[("wan_in", "dc1")] == 8 * GB  # one copy of the version, whatever the seed count
    assert len(th.seeds["dc1"]) == seeds


def test_pull_across_the_wan_costs_one_copy_per_reader():
    sim, swarm = _swarm(2, dcs=2, nodes_per_rack=4, wan_gbps=4.0)
    strat = PullFromSource(swarm, "trainer", window=2)
    for i in range(4):
        strat.join(f"r{i}", f"d1r0n{i}")
    sim.run(until=swarm.all_done)
    assert sim.bytes_on[("wan_in", "dc1")] == 4 * 2 * GB
    # 8 GB through a 0.5 GB/s WAN.
    assert _done(swarm) == {f"r{i}": 16.0 for i in range(4)}


def test_tensorhub_joiner_reads_from_its_rack_not_the_trainer():
    sim, swarm = _swarm(4, racks_per_dc=2, nodes_per_rack=2)
    swarm.add_holder("peer", "d0r1n0")
    th = TensorHub(swarm, window=2)
    th.join("joiner", "d0r1n1")
    sim.run(until=swarm.all_done)
    assert swarm.served == {"trainer": 0.0, "peer": 4 * GB, "joiner": 0.0}
    assert _done(swarm) == {"joiner": 4.0}


def test_swarm_rejects_bad_reads():
    _, swarm = _swarm(2)
    r = swarm.add_reader("r", "d0r0n1")
    with pytest.raises(ConfigError, match="does not hold"):
        swarm.read(r, 0, "r")
    with pytest.raises(ConfigError, match="already"):
        swarm.add_reader("r", "d0r0n2")
    with pytest.raises(ConfigError, match="unknown node"):
        swarm.add_reader("q", "nope")


def test_shard_chunks_gives_every_chunk_to_exactly_one_rank():
    shards = shard_chunks(10, 4)
    assert sorted(c for shard in shards for c in shard) == list(range(10))
    assert sorted(len(shard) for shard in shards) == [2, 2, 3, 3]
    with pytest.raises(ConfigError, match="ranks"):
        shard_chunks(4, 5)


def test_a_partial_holder_must_hold_chunks_of_the_version():
    _, swarm = _swarm(4)
    with pytest.raises(ConfigError, match="subset"):
        swarm.add_holder("rank", "d0r0n1", [])
    with pytest.raises(ConfigError, match="subset"):
        swarm.add_holder("rank", "d0r0n1", [4])


def test_pull_from_a_sharded_trainer_reads_each_chunk_from_its_rank():
    sim, swarm = _swarm(4, trainer_ranks=2)
    ranks = ("trainer-0", "trainer-1")
    strat = PullFromSource(swarm, ranks, window=2)
    for i in range(2):
        strat.join(f"r{i}", f"d0r0n{i + 2}")
    sim.run(until=swarm.all_done)
    # 8 GB leave two 1 GB/s NICs (4 s), not one (8 s): chunks 0 and 1 come from different ranks.
    assert _done(swarm) == {"r0": 4.0, "r1": 4.0}
    assert swarm.served == {"trainer-0": 4 * GB, "trainer-1": 4 * GB, "r0": 0.0, "r1": 0.0}


def test_a_ring_rooted_at_a_sharded_trainer_reads_from_every_rank():
    sim, swarm = _swarm(4, trainer_ranks=2)
    names = ["r0", "r1"]
    strat = Relay(swarm, chain_parents(("trainer-0", "trainer-1"), names), window=1)
    for i, n in enumerate(names):
        strat.join(n, f"d0r0n{i + 2}")
    sim.run(until=swarm.all_done)
    assert swarm.served == {"trainer-0": 2 * GB, "trainer-1": 2 * GB, "r0": 4 * GB, "r1": 0.0}
    assert _done(swarm) == {"r0": 4.0, "r1": 5.0}


def test_tensorhub_reads_a_sharded_trainer_from_every_rank_evenly():
    sim, swarm = _swarm(16, chunk_bytes=0.25 * GB, trainer_ranks=4, racks_per_dc=2)
    th = TensorHub(swarm, PlannerConfig(max_inflight_per_source=2), window=3)
    for i in range(6):
        th.join(f"r{i}", f"d0r1n{i}")
    sim.run(until=swarm.all_done)
    assert all(m.have == set(range(16)) for m in swarm.readers())
    by_rank = [swarm.served[f"trainer-{r}"] for r in range(4)]
    # Each rank is the only first source of its 4 chunks (1 GB), and no rank carries the others' load.
    assert min(by_rank) >= 4 * 0.25 * GB
    assert max(by_rank) <= 1.5 * min(by_rank)
