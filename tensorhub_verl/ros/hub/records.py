"""What the hub keeps per worker, per holding and per version: plain records that the parts own and change."""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.chunk_index import ChunkIndex
from tensorhub_verl.ros.hub.chunk_spans import ChunkSpans
from tensorhub_verl.ros.hub.intervals import IntervalSet
from tensorhub_verl.ros.wire.manifest import Chunk, Manifest
from tensorhub_verl.ros.hub.ownership import DEFAULT_JOB
from tensorhub_verl.ros.wire.topology import Location

Key = tuple[str, int, str]  # (model, version, layout)
GroupKey = tuple[str, int, str]  # (model, version, shard group)
Member = tuple[Key, str]  # (layout key, holder): the row shards of one group share one key


class HoldingState(str, enum.Enum):
    """Where one holding is in its life. It compares equal to, and prints as, its value."""

    PENDING = "pending"
    """A shard of a group not yet committed: invisible to readers."""
    FILLING = "filling"
    """A reader's copy still arriving: it serves the chunks it has."""
    ACTIVE = "active"
    """Serves every chunk it holds; counts as a holder of the version."""
    DRAINING = "draining"
    """Being unpublished: no new reads, waits for those in flight."""
    HELD = "held"
    """A finished fetch that began with chunks the reader only announced (``BeginFetch.have``): the hub never
    saw those bytes land, so the copy is its worker's to use, unpublish and release, but never a source, never
    listed among the version's holders and never counted as a copy."""

    def __str__(self) -> str:
        return self.value


@dataclass(slots=True, kw_only=True)
class WorkerRecord:
    worker: str
    location: Location
    spot: bool
    agent_name: str
    agent_metadata_b64: str
    last_seen: float
    bytes_served: int = 0
    credential_hash: bytes = b""
    """sha256 of the worker's credential: a leaked status dump or core file does not leak the secret."""
    grant_key: bytes = b""
    """The key this worker's data-plane server checks read grants with (grants.py); empty: it needs none."""
    awake_at_seen: float | None = None
    """The hub's awake clock (its clock less its own stalls, ``liveness``) when this worker was last heard; None:
    ``last_seen`` (no stall yet). One float, so a heartbeat answered without the state lock writes it in one
    store and the sweeper never reads half of an update."""
    job: str = DEFAULT_JOB
    """The job its registration's job key admits it to (``ownership.job_of``)."""
    plane: str = "nixl"
    """Its data plane (``RegisterWorker.plane``): one per hub (``planes/one_plane.py``)."""
    registered_from: str | None = None
    """The address its registration came from (None: unknown, e.g. a hub driven without HTTP)."""
    served_at_metadata: int = 0
    """Bytes readers read from it, and found good, since it last changed its data-plane metadata: only a worker
    that served reads at the address it advertises is named to joiners as a peer to connect to early."""

    def __post_init__(self) -> None:
        if self.awake_at_seen is None:
            self.awake_at_seen = self.last_seen


@dataclass(slots=True)
class Holding:
    holder: str
    worker: str
    regions: list[msg.RegionMsg]
    chunks: IntervalSet | frozenset[int] | None
    """None: every chunk. A row shard's (frozen) never change; a filling reader's grow, a run as one interval."""
    state: HoldingState
    generation: int
    served_bytes: int = 0
    shard_rank: int | None = None
    """Set for a row shard: it holds that rank's chunks of the version's chunk map."""
    need: frozenset[int] | None = None
    """A ranged reader's chunks (None: all of them)."""
    unserved: frozenset[int] = frozenset()
    """Chunks a ranged reader reads only in part: never planned from it."""
    settled: set[int] = field(default_factory=set)
    """A filling reader's leases it reported finished: an exchange the client repeated (its reply was lost) finds
    them booked, instead of calling them revoked for chunks the hub already counts."""
    vouched: bool = True
    """Whether the hub knows where these bytes came from: a publish by the model's owner, or a fetch whose
    every chunk the hub saw read through its own leases. An unvouched copy never counts as a reliable copy: a
    non-owner's publish serves reads, which readers check; a fetch that began with chunks it only announced in
    ``BeginFetch.have`` never serves those chunks, and ends ``held``, never a source."""

    def complete(self, total: int) -> bool:
        """A filling reader has every chunk it reads."""
        return len(self.chunks) == total if self.need is None else self.need <= self.chunks


@dataclass(slots=True)
class VersionRecord:
    manifest: Manifest
    chunks: tuple[Chunk, ...]
    holdings: dict[str, Holding] = field(default_factory=dict)
    seeds: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    index: ChunkIndex = field(init=False)
    """Who serves each chunk as a partial holder, and each filling reader's chunks still to read."""
    spans: ChunkSpans = field(init=False)
    """A run's bytes and tensors without a visit of each of its chunks."""

    def __post_init__(self) -> None:
        self.index = ChunkIndex(len(self.chunks))
        self.spans = ChunkSpans(self.chunks)

    def put(self, holding: Holding, location: Location) -> None:
        """Adds (or replaces) a holding of a worker at ``location``; its chunks enter the index."""
        self.pop(holding.holder)
        self.holdings[holding.holder] = holding
        self.index.enter(holding, location)

    def pop(self, holder: str) -> Holding | None:
        holding = self.holdings.pop(holder, None)
        if holding is not None:
            self.index.leave(holding)
        return holding
