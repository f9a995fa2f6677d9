"""Chunked distribution of one version over the simulated cluster, and the baseline strategies.

A `Swarm` tracks who holds which chunk, per-reader join/finish times and bytes per source.
Strategies decide which flows to start:

- `PullFromSource`: every reader pulls every chunk from one fixed holder (the trainer), `window` at once.
- `Relay`: pipelined broadcast along a fixed parent map; a reader pulls chunk c from its parent as soon
  as the parent has it. A chain (parent = previous reader) is a ring broadcast; parent (i-1)//2 is a
  binary tree. This is what NCCL broadcast does, minus the fixed group.
- `tensorhub_dev.sim.tensorhub.TensorHub`: the real ROS planner picks each chunk's source.

A holder may hold only part of the version from the start: a trainer whose FSDP ranks each publish
their own shard is N holders, each with the chunks of its shard (`shard_chunks`). The baselines name such
a sharded holder by the tuple of its ranks' names (`Source`): each chunk is read from the rank that has it.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.wire.topology import Location
from tensorhub_dev.sim.engine import Flow, FlowSim

log = logging.getLogger("tensorhub_dev.sim")

Source = str | tuple[str, ...]
"""A holder's member name, or a sharded holder's rank names (each chunk is held by one of them)."""


def shard_chunks(nchunks: int, ranks: int) -> list[frozenset[int]]:
    """The chunks each of `ranks` trainer ranks holds: every chunk exactly once, counts within one of each other.

    FSDP2 shards dim 0 of every tensor, so each rank holds a 1/N byte range of each tensor and a rank's
    chunks are spread through the version: chunk c goes to rank c % N. A rank must hold at least one chunk.
    """
    if not 1 <= ranks <= nchunks:
        raise ConfigError(f"{ranks} trainer ranks cannot each hold a chunk of a {nchunks}-chunk version: "
                          f"use 1 <= ranks <= chunks")
    return [frozenset(range(r, nchunks, ranks)) for r in range(ranks)]


@dataclass(slots=True)
class Member:
    name: str
    node: str
    location: Location
    have: set[int]
    joined: float
    done_at: float | None = None
    is_reader: bool = True
    inflight: dict[int, str] = field(default_factory=dict)
    """chunk -> source it is being read from."""


class Swarm:
    """State of one version's spread. Holders never read: they hold every chunk, or (a trainer rank) its shard."""

    def __init__(self, sim: FlowSim, nchunks: int, chunk_bytes: float):
        if nchunks < 1 or not chunk_bytes > 0:
            raise ConfigError("Swarm: nchunks must be >= 1 and chunk_bytes > 0")
        self.sim = sim
        self.nchunks = nchunks
        self.chunk_bytes = chunk_bytes
        self.members: dict[str, Member] = {}
        self.served: dict[str, float] = {}
        self.on_landed: list[Callable[[Member, int, str], None]] = []
        self._held: dict[tuple[str, int], Flow | None] = {}
        """Reads whose landing waits for `release` (the hub's answers): (reader, chunk) -> the flow once its
        bytes are there, None before."""

    def add_holder(self, name: str, node: str, chunks: Collection[int] | None = None) -> Member:
        """A member that holds the version from the start: every chunk (a trainer publishing from one node, a
        rollout that fetched it before) or only `chunks` (one trainer rank's shard). It never reads."""
        have = set(range(self.nchunks)) if chunks is None else set(chunks)
        if not have or not have <= set(range(self.nchunks)):
            raise ConfigError(f"holder {name!r}: chunks must be a non-empty subset of 0..{self.nchunks - 1}")
        m = self._add(name, node)
        m.have = have
        m.done_at = m.joined
        m.is_reader = False
        return m

    def add_reader(self, name: str, node: str) -> Member:
        return self._add(name, node)

    def _add(self, name: str, node: str) -> Member:
        if name in self.members:
            raise ConfigError(f"member {name!r} already in the swarm")
        if node not in self.sim.cluster.nodes:
            raise ConfigError(f"unknown node {node!r}")
        m = Member(name, node, self.sim.cluster.nodes[node], set(), self.sim.now)
        self.members[name] = m
        self.served[name] = 0.0
        return m

    def read(self, reader: Member, chunk: int, source: str, held: bool = False) -> Flow:
        """Start reading `chunk` from `source` into `reader`. A `held` read lands once its bytes are there and
        `release` was called for it, whichever comes last."""
        src = self.members[source]
        if chunk not in src.have:
            raise ConfigError(f"{source} does not hold chunk {chunk}")
        if chunk in reader.have or chunk in reader.inflight:
            raise ConfigError(f"{reader.name} already has or reads chunk {chunk}")
        reader.inflight[chunk] = source
        if held:
            self._held[(reader.name, chunk)] = None
        return self.sim.start_flow(src.node, reader.node, self.chunk_bytes, self._arrived,
                                   tag=(reader.name, chunk))

    def release(self, reader: str, chunk: int) -> None:
        """A held read may land: now if its bytes are there, else when they arrive."""
        flow = self._held.pop((reader, chunk))
        if flow is not None:
            self._land(flow)

    def _arrived(self, flow: Flow) -> None:
        if flow.tag in self._held:
            self._held[flow.tag] = flow
        else:
            self._land(flow)

    def _land(self, flow: Flow) -> None:
        name, chunk = flow.tag
        reader = self.members[name]
        source = reader.inflight.pop(chunk)
        reader.have.add(chunk)
        self.served[source] += flow.size
        if len(reader.have) == self.nchunks:
            reader.done_at = self.sim.now
        for cb in self.on_landed:
            cb(reader, chunk, source)

    def is_complete(self, m: Member) -> bool:
        return len(m.have) == self.nchunks

    def holder_of(self, source: Source, chunk: int) -> Member | None:
        """The member of `source` that holds `chunk`, if any (one name, or a sharded holder's rank names)."""
        for name in (source,) if isinstance(source, str) else source:
            m = self.members.get(name)
            if m is not None and chunk in m.have:
                return m
        return None

    def readers(self) -> list[Member]:
        return [m for m in self.members.values() if m.is_reader]

    def all_done(self, names: list[str] | None = None) -> bool:
        pool = [self.members[n] for n in names] if names else self.readers()
        return all(m.done_at is not None for m in pool)

    def report(self, names: list[str] | None = None) -> dict:
        """Per-reader fetch time (join -> last chunk) summary: the stall each reader sees."""
        pool = [self.members[n] for n in names] if names else self.readers()
        times = [m.done_at - m.joined for m in pool if m.done_at is not None]
        if len(times) != len(pool):
            raise ConfigError("report() before every reader finished")
        return {"readers": len(pool), "max_s": max(times), "mean_s": statistics.fmean(times),
                "min_s": min(times), "events": self.sim.events}


class PullFromSource:
    """Every reader pulls all chunks from `source` (each from the rank that has it, if sharded), `window` reads
    at once, in chunk order."""

    def __init__(self, swarm: Swarm, source: Source | Mapping[str, Source], window: int = 8):
        self.swarm, self.window = swarm, window
        self._source = source
        swarm.on_landed.append(lambda reader, chunk, src: self._fill(reader))

    def join(self, name: str, node: str) -> None:
        self._fill(self.swarm.add_reader(name, node))

    def _fill(self, reader: Member) -> None:
        src = self._source[reader.name] if isinstance(self._source, Mapping) else self._source
        nxt = len(reader.have) + len(reader.inflight)
        while len(reader.inflight) < self.window and nxt < self.swarm.nchunks:
            holder = self.swarm.holder_of(src, nxt)
            if holder is None:
                raise ConfigError(f"{src} holds no chunk {nxt}: {reader.name} cannot pull it")
            self.swarm.read(reader, nxt, holder.name)
            nxt += 1


class Relay:
    """Pipelined broadcast over a fixed parent map (chain = ring broadcast, (i-1)//2 = binary tree)."""

    def __init__(self, swarm: Swarm, parent: Mapping[str, Source], window: int = 8):
        self.swarm, self.parent, self.window = swarm, dict(parent), window
        self.children: dict[str, list[str]] = {}
        for child, par in self.parent.items():
            self.children.setdefault(par, []).append(child)
        swarm.on_landed.append(self._landed)

    def join(self, name: str, node: str) -> None:
        if name not in self.parent:
            raise ConfigError(f"{name} has no parent in the relay")
        self._fill(self.swarm.add_reader(name, node))

    def _landed(self, reader: Member, chunk: int, source: str) -> None:
        self._fill(reader)
        for child in self.children.get(reader.name, ()):
            if child in self.swarm.members:
                self._fill(self.swarm.members[child])

    def _fill(self, reader: Member) -> None:
        par = self.parent[reader.name]
        nxt = len(reader.have) + len(reader.inflight)  # in-order: the next chunk not yet asked for
        while len(reader.inflight) < self.window and nxt < self.swarm.nchunks:
            holder = self.swarm.holder_of(par, nxt)
            if holder is None:
                return
            self.swarm.read(reader, nxt, holder.name)
            nxt += 1


def chain_parents(root: Source, readers: list[str]) -> dict[str, Source]:
    return {r: (root if i == 0 else readers[i - 1]) for i, r in enumerate(readers)}


def tree_parents(root: Source, readers: list[str], fanout: int = 2) -> dict[str, Source]:
    everyone = [root, *readers]
    # Heap order: the reader at position k = i + 1 hangs under position (k - 1) // fanout = i // fanout.
    return {r: everyone[i // fanout] for i, r in enumerate(readers)}
