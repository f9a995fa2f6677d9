"""The hub's soft state: workers, holdings, leases. No I/O here; the HTTP layer wraps it.

Everything in this module can be rebuilt from the workers: after a hub restart each client
re-registers itself, its holdings and its fetches in progress, and nothing is lost.

Invariants:
  - A holding in state ``active`` holds every chunk (``chunks`` None), or, as a row shard (an FSDP rank
    holding its dim-0 rows of every tensor), exactly its rank's chunks; ``filling`` holdings serve the
    chunks they have.
  - A lease is one read of one chunk from one holding. While a lease is live its source's bytes must
    not change, so ``unpublish`` waits for the holding's leases to end. A lease past its deadline is
    revoked: its reader is told to read that chunk again, and it no longer holds up ``unpublish``.
  - A version is visible (``versions``/``latest``, retention, ``/v1/wait``) only while its ``active``
    holdings together have every chunk (``_visible``): one full holder, or row shards that add up.
  - The shards of a k-shard engine (``shard_group``) stay ``pending`` -- neither visible nor read --
    until all k have been published; then they turn ``active`` together. Row shards of one version are
    the k holders of one key, with k distinct ranks.
  - A worker acts only as itself: registration binds a random credential to the worker id (the hub keeps
    only its hash), and the HTTP layer runs every call for a worker inside ``acting_as``. A worker's
    holders are named ``<worker>`` or ``<worker>~<suffix>``, so no worker publishes, unpublishes or fetches
    as a holder of another. A restarted hub knows no credentials: it accepts any unknown id and issues a
    new one (soft state; the trust model in the README says what that allows).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import logging
import secrets
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Callable, TypeVar

from tensorhub_verl.errors import (
    InvalidRequest, ManifestMismatch, NotOwner, OverBudget, UnknownFetch, UnknownWorker, VersionNotFound,
)
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.planes.one_plane import check_one_plane
from tensorhub_verl.ros.chunk_index import ChunkIndex, candidates_for
from tensorhub_verl.ros.chunk_spans import ChunkSpans
from tensorhub_verl.ros.corruption import CorruptionEvidence
from tensorhub_verl.ros.intervals import IntervalSet, first_held, first_missing
from tensorhub_verl.ros.lease_book import Lease, LeaseBook, ReaderRuns
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.limits import (
    HubLimits, PreparedVersion, check_regions, check_row_shard, check_same_chunk_map, prepare_version,
)
from tensorhub_verl.ros.liveness import StallMeter
from tensorhub_verl.ros.manifest import Chunk, Manifest, check_same_tensors
from tensorhub_verl.ros.ownership import DEFAULT_JOB, OwnerRule, Owners, job_of
from tensorhub_verl.ros.planner import HolderView, PlannerConfig, SwarmView, plan_chunks, reader_request, unservable
from tensorhub_verl.ros.topology import Distance, Location

logger = logging.getLogger("tensorhub_verl.ros.hub")

Key = tuple[str, int, str]  # (model, version, layout)
GroupKey = tuple[str, int, str]  # (model, version, shard group)
Member = tuple[Key, str]  # (layout key, holder): the row shards of one group share one key
Ack = TypeVar("Ack", bound=msg.DrainAck)


@dataclass(frozen=True, slots=True, kw_only=True)
class HubConfig:
    worker_timeout_s: float = 10.0
    """A worker that sends no heartbeat for this long is dropped with its holdings."""
    heartbeat_s: float = 1.0
    """How often clients are asked to send heartbeats."""
    lease_ttl_s: float = 30.0
    """A read of one chunk that takes longer than this is revoked and must be redone."""
    suspect_s: float = 3.0
    """After a failed read, its source gets no new reads for this long (unless it proves alive)."""
    quarantine_s: float = 300.0
    """A holding whose bytes failed the digest checks of two readers (``corruption.py``) serves no reads for
    this long; one reader's report keeps only that reader off it, for as long."""
    keep_versions: int = 2
    """Retention: the newest N versions of each model are kept; holders are asked to drop older ones."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    limits: HubLimits = field(default_factory=HubLimits)
    """What one version may cost the hub (tensors, bytes, chunks)."""
    owners: tuple[OwnerRule | str, ...] = ()
    """Models that only the named workers may create (``ownership.py``; an ``OwnerRule`` or
    "MODEL_GLOB=WORKER_GLOB"); other models belong to the job of their first publisher."""
    nixl_within_job: bool = True
    """Plan a reader on a holder whose data plane checks no grant (NIXL: its metadata lets a peer READ and WRITE
    the registered memory) only when both are workers of one job (``ownership.py``); readers of other jobs read
    from holders on a granted plane (TCP). False: any registered reader, as before."""
    require_digests: bool = True
    """Refuse a publish without a digest for every chunk it holds. Off only for trusted tests: a version
    without digests is served unchecked."""

    def __post_init__(self) -> None:
        rules = tuple(r if isinstance(r, OwnerRule) else OwnerRule.parse(r) for r in self.owners)
        object.__setattr__(self, "owners", rules)


@dataclass(slots=True)
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
    stall_at_seen: float = 0.0
    """The hub's own stall total (StallMeter.stalled) when this worker was last heard."""
    job: str = DEFAULT_JOB
    """The job its registration's job key admits it to (``ownership.job_of``)."""
    plane: str = "nixl"
    """Its data plane (``RegisterWorker.plane``): one per hub (``planes/one_plane.py``)."""


@dataclass(slots=True)
class Holding:
    holder: str
    worker: str
    regions: list[msg.RegionMsg]
    chunks: IntervalSet | frozenset[int] | None
    """None: every chunk. A row shard's (frozen) never change; a filling reader's grow, a run as one interval."""
    state: str  # "pending" (a shard of an uncommitted group) | "filling" | "active" | "draining"
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
    every chunk the hub saw read through its own leases. An unvouched copy (a non-owner's publish, or a fetch
    that began with chunks it only announced in ``BeginFetch.have``) serves reads, which readers check, but
    never counts as a reliable copy, and one corruption report quarantines it."""

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


class HubState:
    def __init__(self, config: HubConfig | None = None, clock: Callable[[], float] = time.monotonic):
        self.config = config or HubConfig()
        self.instance = uuid.uuid4().hex[:12]
        self._clock = clock
        self.stall = StallMeter(clock)
        """Ticked by the server's event-loop probe: silence while the hub itself was stalled is not the workers'."""
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._workers: dict[str, WorkerRecord] = {}
        self._versions: dict[Key, VersionRecord] = {}
        self._leases = LeaseBook()
        self._revoked: dict[str, set[int]] = defaultdict(set)
        self._suspect_until: dict[str, float] = {}
        self._model_keys: dict[str, set[Key]] = {}
        """model -> keys of its version records: per-model queries never scan every version."""
        self._release_of: dict[str, dict[Key, msg.HoldingKey]] = {}
        """worker -> its active holdings outside the retention window (sent with each heartbeat ack)."""
        self._release_workers: dict[str, set[str]] = {}
        self._stale_models: set[str] = set()
        self.model_seq: dict[str, int] = {}
        """model -> bumped whenever its active holdings may have changed (parked long-polls compare it)."""
        self._evidence = CorruptionEvidence(self.config.quarantine_s)
        """Readers' reports of bytes that fail their digest, and the quarantines they lead to."""
        self._owners = Owners(self.config.owners)
        self._id_jobs: dict[str, str] = {}
        """worker id -> the job of its first registration: an id that leaves or times out is freed only for
        workers of the same job (an ``--owner`` rule names ids, so a freed id must not change hands)."""
        self._shard_groups: dict[GroupKey, dict[Member, int | None]] = {}
        """group -> its members and their row shard rank (None: a shard in its own layout, e.g. a TP rank)."""
        self._shard_counts: dict[GroupKey, int] = {}
        self._newest_by_model: dict[str, frozenset[str]] = {}
        """model -> the workers actively holding its newest visible version(s): whom a joiner likely reads from."""
        self._newest_dirty: set[str] = set()
        self._newest_union: frozenset[str] | None = None
        self._ids = itertools.count(secrets.randbits(40) << 12 | 1)
        """Lease ids and holding generations, from a random start: a restarted hub must not issue the id of a lease
        the old instance gave, which a reader may still report (it would book that read for another chunk), nor a
        generation a reader has cached (it would keep a holder's stale metadata). Below 2**52."""
        # Counters read by /metrics.
        self.leases_revoked = 0
        self.read_failures: dict[str, int] = defaultdict(int)
        self.corrupt_reads: dict[str, int] = defaultdict(int)
        self.fetch_seconds: list[tuple[str, float]] = []

    # ----------------------------------------------------------------------------------- workers
    def register_worker(self, req: msg.RegisterWorker, credential: str = "",
                        job_key: str = "") -> msg.WorkerAck:
        """Registers (or re-registers) a worker; the reply carries its credential. ``job_key``: the secret
        that admits it to its job (``ownership.py``); empty: the hub's default job.

        A live id is re-registered only with its credential (a worker refreshing its data-plane metadata);
        anyone else gets NotOwner until that worker leaves or misses its heartbeats."""
        with self._lock:
            now = self._clock()
            location = Location(**req.location.model_dump())
            old = self._workers.get(req.worker)
            check_one_plane(req.worker, req.plane, {w: r.plane for w, r in self._workers.items() if w != req.worker})
            if old is not None and not _same_secret(old.credential_hash, credential):
                raise NotOwner(f"worker id {req.worker!r} is held by a live worker; re-registering it needs "
                               f"that worker's credential (the id frees {self.config.worker_timeout_s:g} s after "
                               f"its last heartbeat, or when it leaves)")
            job = job_of(job_key)
            if old is not None and old.job != job:
                raise NotOwner(f"worker {req.worker!r} is registered in job {old.job!r}; a live worker keeps its "
                               f"job (leave, then register with the other job key)")
            first_job = self._id_jobs.setdefault(req.worker, job)
            if first_job != job:
                raise NotOwner(f"worker id {req.worker!r} belongs to job {first_job!r}, whose worker first registered "
                               f"it on hub {self.instance}; a freed id is never given to another job. Register "
                               f"with that job's key (ClientConfig.job_key), or under another worker id")
            secret = credential if old is not None else secrets.token_urlsafe(32)
            if old is not None and old.agent_name != req.agent_name:
                # A new process took over this worker id: the old one's memory is gone.
                logger.info("worker %s restarted (agent %s -> %s); dropping its holdings",
                            req.worker, old.agent_name, req.agent_name)
                self._drop_worker(req.worker)
                old = None
            record = WorkerRecord(req.worker, location, req.spot, req.agent_name, req.agent_metadata_b64, now,
                                  old.bytes_served if old else 0, _hash(secret),
                                  base64.b64decode(req.grant_key_b64) if req.grant_key_b64 else b"",
                                  self.stall.stalled(), job, req.plane)
            self._workers[req.worker] = record
            for holding in self._holdings_of(req.worker):
                holding.generation = next(self._ids)  # readers must reload the agent metadata
            self._changed.notify_all()
            peers = self._likely_sources(record, req.preconnect) if req.preconnect and record.grant_key else []
            return self._ack(req.worker).model_copy(update={"credential": secret, "peers": peers})

    def _likely_sources(self, joiner: WorkerRecord, count: int) -> list[msg.PeerMsg]:
        """Up to ``count`` other workers holding the newest version of some model, nearest to ``joiner`` first
        (ties in random order, so joiners spread over equally near holders): whom it most likely reads from
        first. Only workers whose data plane checks a grant on every read: their metadata is just an address."""
        candidates = [self._workers[w] for w in self._newest_holders()
                      if w != joiner.worker and w in self._workers and self._workers[w].grant_key]
        candidates.sort(key=lambda r: (joiner.location.distance(r.location), secrets.randbits(32)))
        return [msg.PeerMsg(worker=r.worker, agent_name=r.agent_name, agent_metadata_b64=r.agent_metadata_b64)
                for r in candidates[:count]]

    def _newest_holders(self) -> frozenset[str]:
        """Workers with an active holding of some model's newest visible version (in any layout). Kept per model
        and brought up to date only for the models whose holdings changed since (``_holdings_changed``): after a
        hub restart every worker re-registers at once, and a walk of every model's versions for each would cost
        14 ms per registration at 4,000 versions, under the lock."""
        if self._newest_dirty:
            for model in self._newest_dirty:
                self._newest_by_model[model] = holders = self._newest_holders_of(model)
                if not holders:
                    del self._newest_by_model[model]  # a model with no version left costs nothing
            self._newest_dirty.clear()
            self._newest_union = None
        if self._newest_union is None:
            self._newest_union = frozenset().union(*self._newest_by_model.values())
        return self._newest_union

    def _newest_holders_of(self, model: str) -> frozenset[str]:
        found: set[str] = set()
        done_layouts: set[str] = set()
        for key in sorted(self._model_keys.get(model, ()), key=lambda k: -k[1]):  # newest first
            record = self._versions[key]
            if key[2] in done_layouts or not self._visible(record):
                continue
            done_layouts.add(key[2])
            found.update(h.worker for h in record.holdings.values() if h.state == "active")
        return frozenset(found)

    @contextlib.contextmanager
    def acting_as(self, worker: str, credential: str):
        """Holds the hub lock while the caller acts for ``worker``, after checking its credential.

        The check and the action share one critical section, so the id cannot change hands between them."""
        with self._lock:
            record = self._require_worker(worker)
            if not _same_secret(record.credential_hash, credential):
                raise NotOwner(f"this call acts for worker {worker!r} without its credential; only that worker "
                               f"may publish, unpublish, fetch or heartbeat as itself")
            yield

    def heartbeat(self, worker: str) -> msg.WorkerAck:
        with self._lock:
            record = self._require_worker(worker)
            record.last_seen = self._clock()
            record.stall_at_seen = self.stall.stalled()
            self._suspect_until.pop(worker, None)
            return self._ack(worker)

    def leave(self, worker: str) -> None:
        """A worker that closes: it has drained its holdings; forget it now rather than at its timeout."""
        with self._lock:
            if worker in self._workers:
                self._drop_worker(worker)

    def _ack(self, worker: str) -> msg.WorkerAck:
        return msg.WorkerAck(worker=worker, hub_instance=self.instance, heartbeat_s=self.config.heartbeat_s,
                             release=self._retention_release(worker))

    def _retention_release(self, worker: str) -> list[msg.HoldingKey]:
        """O(1) per heartbeat in models and versions: release lists are kept per worker, and only the models
        whose holdings changed since the last heartbeat are looked at again (each in O(its versions))."""
        while self._stale_models:
            self._rebuild_retention(self._stale_models.pop())
        return list(self._release_of.get(worker, {}).values())

    def _holdings_changed(self, *models: str) -> None:
        """Called wherever a holding appears, turns active, or goes: retention and /v1/wait look again."""
        self._stale_models.update(models)
        self._newest_dirty.update(models)
        for model in models:
            self.model_seq[model] = self.model_seq.get(model, 0) + 1
        self._changed.notify_all()

    def _rebuild_retention(self, model: str) -> None:
        """Which active holdings of ``model`` fall outside its newest ``keep_versions``."""
        for worker in self._release_workers.pop(model, set()):
            entries = self._release_of.get(worker, {})
            for key in [k for k in entries if k[0] == model]:
                del entries[key]
            if not entries:
                self._release_of.pop(worker, None)
        keys = self._model_keys.get(model, set())
        visible = sorted({k[1] for k in keys if self._visible(self._versions[k])}, reverse=True)
        if not visible:
            return
        retained = set(visible[:self.config.keep_versions])
        for key in keys:
            if key[1] in retained or key[1] > visible[0]:
                continue
            for holding in self._versions[key].holdings.values():
                if holding.state == "active":
                    self._release_of.setdefault(holding.worker, {})[key] = msg.HoldingKey(
                        model=key[0], version=key[1], layout=key[2])
                    self._release_workers.setdefault(model, set()).add(holding.worker)

    def _records_of(self, model: str):
        """(key, record) of one model's versions: O(its versions), not O(all versions)."""
        return [(k, self._versions[k]) for k in sorted(self._model_keys.get(model, ()))]

    def _require_worker(self, worker: str) -> WorkerRecord:
        record = self._workers.get(worker)
        if record is None:
            raise UnknownWorker(f"worker {worker!r} is not registered with hub {self.instance}; register first")
        return record

    # ---------------------------------------------------------------------------------- holdings
    def authorize_publish(self, req: msg.Publish, credential: str) -> None:
        """The cheap checks of a publish, run before ``prepare`` builds its chunk map (which may cost seconds of
        CPU at the piece limit): the worker's credential, its holder name, the model's owner, and the worker's
        budget of pending shards. ``publish`` checks all of them again under the lock."""
        with self.acting_as(req.worker, credential):
            _check_holder(req.worker, req.holder)
            m = req.manifest
            record = self._versions.get((m.model, m.version, m.layout))
            job = self._workers[req.worker].job
            if not self._owners.owns(m.model, req.worker, job):
                self._check_non_owner_creates_nothing(req, record, job)
            if req.shard_count > 1:
                self._check_pending_budget(req)

    def _check_pending_budget(self, req: msg.Publish) -> None:
        """A worker's pending shards (in shard groups not yet complete) each keep a chunk map on the hub until
        their group completes: their number and pieces are capped per worker (``HubLimits``)."""
        limits, m = self.config.limits, req.manifest
        key = (m.model, m.version, m.layout)
        pending = [(k, h) for k, r in self._versions.items() for h in r.holdings.values()
                   if h.worker == req.worker and h.state == "pending" and (k, h.holder) != (key, req.holder)]
        if len(pending) >= limits.max_pending_shards_per_worker:
            raise OverBudget(f"worker {req.worker!r} already has {len(pending)} shards pending in shard groups that "
                             f"are not complete, the hub's limit per worker (HubLimits.max_pending_shards_per_worker"
                             f"={limits.max_pending_shards_per_worker}); publish the other shards of those groups "
                             f"(or unpublish them) first")
        pieces = len(m.tensors) * m.row_shards + sum(
            len(self._versions[k].manifest.tensors) * self._versions[k].manifest.row_shards for k, _ in pending)
        if pieces > limits.max_pending_pieces_per_worker:
            raise OverBudget(f"worker {req.worker!r}'s pending shards would describe {pieces} pieces (tensors x row "
                             f"shards), over the hub's limit per worker (HubLimits.max_pending_pieces_per_worker="
                             f"{limits.max_pending_pieces_per_worker}); complete or unpublish pending shard groups, "
                             f"or publish fewer, larger tensors")

    def prepare(self, req: msg.Publish) -> PreparedVersion:
        """The heavy, state-free part of a publish (validation, chunk map): call it before taking the lock."""
        if self.config.require_digests and not req.manifest.chunk_digests:
            m = req.manifest
            raise InvalidRequest(f"{m.model} v{m.version}: a publish must carry a digest of every chunk it "
                                 f"holds (ClientConfig.chunk_digests=True, the default), so that readers can "
                                 f"check the bytes; this hub refuses versions without them")
        prepared = prepare_version(req.manifest, self.config.limits, req.shard_rank)
        check_row_shard(req)
        check_regions(req.regions, prepared.manifest, req.shard_rank)
        return prepared

    def publish(self, req: msg.Publish, prepared: PreparedVersion | None = None) -> None:
        """Adds a holding. Every check runs before the first change: a refused publish changes nothing."""
        if prepared is None:
            prepared = self.prepare(req)
        manifest = prepared.manifest
        if req.shard_count > 1 and req.shard_group is None:
            raise InvalidRequest("shard_count > 1 needs a shard_group naming the engine the shards belong to")
        key = (manifest.model, manifest.version, manifest.layout)
        with self._lock:
            job = self._require_worker(req.worker).job
            _check_holder(req.worker, req.holder)
            record = self._versions.get(key)
            owner = self._owners.owns(key[0], req.worker, job)
            if not owner:
                self._check_copy(req, record, job)
            if record is not None:
                check_same_tensors(record.manifest, manifest)
                if req.shard_rank is not None or not owner:
                    check_same_chunk_map(record.manifest, manifest)
                existing = record.holdings.get(req.holder)
                if existing is not None and existing.worker != req.worker:
                    raise NotOwner(f"holder {req.holder!r} belongs to worker {existing.worker!r}")
                if existing is not None and existing.state not in ("active", "pending"):
                    raise InvalidRequest(f"{req.holder} is {existing.state} version {manifest.version} of "
                                         f"{manifest.model!r} ({manifest.layout}); wait for that to finish")
            group = (manifest.model, manifest.version, req.shard_group)
            if req.shard_count > 1:
                self._check_shard(group, req.shard_count, (key, req.holder), req.shard_rank)
                self._check_pending_budget(req)
            if record is None:
                record = VersionRecord(manifest, prepared.chunks)
                self._versions[key] = record
                self._model_keys.setdefault(key[0], set()).add(key)
            elif (record.manifest.chunk_bytes, record.manifest.row_shards) == (manifest.chunk_bytes,
                                                                             manifest.row_shards):
                record.manifest = _merge_digests(record.manifest, manifest)  # fills a partial group's gaps
            state = "pending" if req.shard_count > 1 else "active"
            record.put(Holding(req.holder, req.worker, list(req.regions), prepared.shard_chunks, state,
                               next(self._ids), shard_rank=req.shard_rank, vouched=owner),
                       self._workers[req.worker].location)
            if owner:
                self._owners.bind(key[0], job)
            if req.shard_count > 1:
                self._commit_shard(group, req.shard_count, (key, req.holder), req.shard_rank)
            self._holdings_changed(key[0])

    def _check_copy(self, req: msg.Publish, record: VersionRecord | None, job: str) -> None:
        """A publish by a worker that does not own the model: only a copy of a version already visible, whole
        and with the version's digests, is accepted (a reader re-registering what it fetched, after a hub
        restart)."""
        m = req.manifest
        self._check_non_owner_creates_nothing(req, record, job)
        if tuple(m.chunk_digests) != record.manifest.chunk_digests:
            raise ManifestMismatch(f"{m.model} v{m.version} ({m.layout}) is published with other chunk "
                                   f"digests; a copy by a worker outside the model's owner job must carry "
                                   f"the version's own")

    def _check_non_owner_creates_nothing(self, req: msg.Publish, record: VersionRecord | None, job: str) -> None:
        """A worker outside the model's owner publishes no shard and no version the hub does not show yet."""
        m = req.manifest
        if req.shard_count > 1:
            self._owners.check_create(m.model, req.worker, job, f"shards of group {req.shard_group!r}")
        if record is None or not self._visible(record):
            self._owners.check_create(m.model, req.worker, job, f"version {m.version} ({m.layout})")

    def _check_shard(self, group: GroupKey, count: int, member: Member, rank: int | None) -> None:
        known = self._shard_counts.get(group, count)
        if known != count:
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} has {known} shards, not {count}")
        others = {m: r for m, r in self._live_members(group).items() if m != member}
        if len(others) >= count:
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} has more than {count} shards")
        if any((r is None) != (rank is None) for r in others.values()):
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} mixes row shards (shard_rank "
                                 f"set) with shards in their own layouts; use one group for each")
        if rank is not None and any(r == rank for r in others.values()):
            holder = next(m[1] for m, r in others.items() if r == rank)
            raise InvalidRequest(f"row shard {rank} of {group[0]} v{group[1]} (group {group[2]!r}) is already "
                                 f"published by {holder!r}; each rank publishes once")
        if rank is not None and any(m[0] != member[0] for m in others):
            raise InvalidRequest(f"the row shards of group {group[2]!r} of {group[0]} v{group[1]} are one layout, "
                                 f"{next(iter(others))[0][2]!r}, not {member[0][2]!r}")

    def _live_members(self, group: GroupKey) -> dict[Member, int | None]:
        """The group's members whose holdings still exist: a shard that died leaves room for its replacement."""
        members = self._shard_groups.get(group, {})
        return {m: r for m, r in members.items()
                if m[0] in self._versions and m[1] in self._versions[m[0]].holdings}

    def _commit_shard(self, group: GroupKey, count: int, member: Member, rank: int | None) -> None:
        members = self._live_members(group)
        members[member] = rank
        self._shard_groups[group] = members
        self._shard_counts[group] = count
        if len(members) < count:
            return
        for key, holder in members:
            holding = self._versions[key].holdings[holder]
            if holding.state == "pending":  # not one that is draining meanwhile
                holding.state = "active"
        logger.info("%s v%d: all %d shards of %s committed", group[0], group[1], count, group[2])

    def unpublish(self, req: msg.Unpublish) -> msg.UnpublishAck:
        key = (req.model, req.version, req.layout)
        with self._lock:
            _check_holder(req.worker, req.holder)
            record = self._versions.get(key)
            holding = record.holdings.get(req.holder) if record else None
            if holding is None:
                raise VersionNotFound(f"{req.holder} holds no version {req.version} of {req.model!r} "
                                      f"({req.layout}); nothing to unpublish")
            if holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            holding.state = "draining"
            self._holdings_changed(req.model)
            return self._drain(key, req.holder, req.wait_s, msg.UnpublishAck)

    def _drain(self, key: Key, holder: str, wait_s: float, reply: type[Ack]) -> Ack:
        deadline = self._clock() + wait_s
        while True:
            self._expire_leases()
            inflight = self._leases.reads_from(key, holder)
            if inflight == 0:
                record = self._versions.get(key)
                if record is not None:
                    record.pop(holder)
                    self._forget_if_empty(key)
                self._holdings_changed(key[0])
                return reply(drained=True, inflight=0)
            remaining = deadline - self._clock()
            if remaining <= 0:
                return reply(drained=False, inflight=inflight)
            self._changed.wait(min(remaining, 0.05))

    def must_preserve(self, req: msg.PreserveQuery) -> msg.PreserveAnswer:
        """True when ``holder`` holds the last reliable copy of a version inside the retention window.

        A row shard is never a copy by itself (False, with the reason): its rows alone would keep nothing
        fetchable once the other ranks go. Row shards that together hold every rank's rows (an FSDP trainer's
        ranks), all active, on live workers none of which is spot, are a reliable copy: while they are, no
        other holder needs to copy the version in its unpublish."""
        with self._lock:
            visible = sorted({k[1] for k, r in self._records_of(req.model) if self._visible(r)}, reverse=True)
            if req.version not in visible[: self.config.keep_versions]:
                return msg.PreserveAnswer(must_preserve=False, reason="outside the retention window")
            record = self._versions.get((req.model, req.version, req.layout))
            holding = record.holdings.get(req.holder) if record else None
            if holding is None or self._workers.get(holding.worker) is None:
                return msg.PreserveAnswer(must_preserve=False, reason="not a holder")
            if self._workers[holding.worker].spot:
                return msg.PreserveAnswer(must_preserve=False, reason="spot workers are not reliable copies")
            if holding.chunks is not None:
                # A row shard's rows alone are no copy of the version: archiving them would keep nothing fetchable.
                return msg.PreserveAnswer(must_preserve=False, reason="a row shard holds part of the version, not "
                                          "a copy; fetch the version to keep a copy")
            now = self._clock()
            for key, record in self._records_of(req.model):
                if key[1] != req.version:
                    continue
                for other in record.holdings.values():
                    worker = self._workers.get(other.worker)
                    if other.holder != req.holder and other.state == "active" and other.chunks is None and worker \
                            and not worker.spot and self._reliable(key, other, now):
                        return msg.PreserveAnswer(must_preserve=False, reason=f"{other.holder} holds a copy")
                group = self._reliable_row_shards(record, req.holder)
                if group:
                    return msg.PreserveAnswer(must_preserve=False, reason=f"row shards {', '.join(group)} together "
                                              f"hold a complete copy")
            return msg.PreserveAnswer(must_preserve=True, reason="last reliable copy of a retained version")

    def _reliable_row_shards(self, record: VersionRecord, asking: str) -> list[str]:
        """The holders of a complete set of ``record``'s row shards that count as a reliable copy (every rank's
        rows active on a live, non-spot worker), or [] when there is none. Silence is measured as ``sweep``
        does, so a rank that stopped sending heartbeats counts as dead before the sweep drops it."""
        ranks: dict[int, str] = {}
        now, stalled = self._clock(), self.stall.stalled()
        key = (record.manifest.model, record.manifest.version, record.manifest.layout)
        for other in record.holdings.values():
            worker = self._workers.get(other.worker)
            if other.shard_rank is None or other.holder == asking or other.state != "active" or worker is None \
                    or worker.spot or not self._reliable(key, other, now):
                continue
            if now - worker.last_seen - (stalled - worker.stall_at_seen) > self.config.worker_timeout_s:
                continue
            ranks.setdefault(other.shard_rank, other.holder)
        if len(ranks) != record.manifest.row_shards:
            return []
        return [ranks[r] for r in sorted(ranks)]

    def _reliable(self, key: Key, holding: Holding, now: float) -> bool:
        """A copy the hub may count on: it knows where its bytes came from, and no readers found them bad."""
        return holding.vouched and not self._evidence.quarantined(key, holding.holder, now)

    # ----------------------------------------------------------------------------------- fetches
    def begin_fetch(self, req: msg.BeginFetch) -> Manifest:
        key = (req.model, req.version, req.layout)
        with self._lock:
            self._require_worker(req.worker)
            _check_holder(req.worker, req.holder)
            record = self._versions.get(key)
            if record is None or not record.holdings:
                raise VersionNotFound(f"no worker holds version {req.version} of {req.model!r} in layout "
                                      f"{req.layout!r}; see `tensorhub status` for what is published")
            if req.digest != record.manifest.digest:
                raise ManifestMismatch(f"layout digest {req.digest} differs from version {req.version}'s "
                                       f"{record.manifest.digest}; the buffers do not describe this layout")
            check_regions(req.regions, record.manifest, None, ranged=req.need is not None)
            self._check_some_holder_serves(req.worker, record)
            existing = record.holdings.get(req.holder)
            if existing is not None and existing.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {existing.worker!r}")
            if existing is not None and existing.state != "filling":
                raise InvalidRequest(f"{req.holder} already holds version {req.version} of {req.model!r} "
                                     f"({existing.state}); unpublish it before fetching it again")
            # Announced chunks are not read again, but the hub never saw them land: they serve nobody during
            # this fetch, and the holding never counts as a reliable copy (Holding.vouched).
            chunks = IntervalSet(c for c in req.have if c < len(record.chunks))
            need = None if req.need is None else frozenset(c for c in req.need if c < len(record.chunks))
            record.put(Holding(req.holder, req.worker, list(req.regions), chunks, "filling", next(self._ids),
                               need=need, unserved=frozenset(req.unserved) | frozenset(chunks), vouched=not chunks),
                       self._workers[req.worker].location)
            self._revoked.pop(req.holder, None)
            return record.manifest

    def exchange(self, req: msg.Exchange) -> msg.ExchangeReply:
        key = (req.model, req.version, req.layout)
        with self._lock:
            reader = self._require_worker(req.worker)
            _check_holder(req.worker, req.holder)
            reader.last_seen = self._clock()
            record = self._versions.get(key)
            holding = record.holdings.get(req.holder) if record else None
            if holding is not None and holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            if holding is None or holding.state != "filling":
                raise UnknownFetch(f"{req.holder} has no fetch of {key} in progress; begin the fetch first")
            revoked = self._settle(req, record, holding)
            deadline = self._clock() + req.wait_s
            while True:
                assignments, everyone, needed = self._plan(key, record, holding, reader.location, req.want,
                                                           req.run_chunks)
                if assignments or self._clock() >= deadline or not self._waits_for_work(key, record, holding):
                    break
                self._changed.wait(min(0.05, max(0.0, deadline - self._clock())))
                self._expire_leases()
            now = self._clock()
            replies, sources, tensors = [], {}, defaultdict(set)
            for a in assignments:
                end = a.chunk + a.count
                lease = Lease(next(self._ids), key, req.holder, reader.location, a.source, a.chunk,
                              record.spans.nbytes(a.chunk, end), a.distance, now + self.config.lease_ttl_s, a.count)
                self._leases.add(lease)
                replies.append(msg.AssignmentMsg(lease=lease.id, chunk=a.chunk, count=a.count, source=a.source,
                                                 distance=int(a.distance), grant=self._grant(record, lease)))
                tensors[a.source].update(record.spans.tensors(a.chunk, end))
            # A holder's data-plane metadata and addresses go only to a reader it now has a lease to serve, and
            # only the addresses of the tensors those leases read; the metadata only once per generation.
            for holder_name, needed_tensors in tensors.items():
                source = record.holdings[holder_name]
                worker = self._workers[source.worker]
                fresh = req.known_sources.get(holder_name) != source.generation
                sources[holder_name] = msg.SourceInfo(
                    holder=holder_name, worker=source.worker, generation=source.generation,
                    agent_name=worker.agent_name, agent_metadata_b64=worker.agent_metadata_b64 if fresh else "",
                    regions={t: source.regions[t] for t in sorted(needed_tensors)}, partial=source.state == "filling")
            return msg.ExchangeReply(assignments=replies, sources=list(sources.values()), revoked=sorted(revoked),
                                     have=len(holding.chunks), total=len(record.chunks),
                                     unservable=[] if assignments else unservable(needed, everyone(), req.holder))

    def plan_changes(self, model: str) -> int:
        """Grows when a plan for a reader of ``model`` may find work it did not: a lease ended or a version came or
        went. (Two int reads, no lock: a parked exchange polls it.)"""
        return self._leases.ended + self.model_seq.get(model, 0)

    def fetch_waits_for_work(self, req: msg.Exchange) -> bool:
        """Whether an exchange of ``req``'s fetch that got no work should keep waiting for some: as ``exchange``
        itself decides when ``wait_s`` is set (the route that parks exchanges on the event loop asks this)."""
        key = (req.model, req.version, req.layout)
        with self._lock:
            record = self._versions.get(key)
            holding = record.holdings.get(req.holder) if record else None
            return holding is not None and holding.state == "filling" and self._waits_for_work(key, record, holding)

    def _waits_for_work(self, key: Key, record: VersionRecord, holding: Holding) -> bool:
        """A filling reader with no read of this version in flight that still needs chunks."""
        return not self._leases.of_reader(holding.holder, key) and not holding.complete(len(record.chunks))

    def _grant(self, record: VersionRecord, lease: Lease) -> str:
        """The signed grant for exactly the bytes this lease reads, when its source's data plane checks one."""
        source = record.holdings[lease.source]
        key = self._workers[source.worker].grant_key
        if not key:
            return ""
        # A row shard's region starts at byte ``offset`` of its tensor (the fetcher's ``remote_address``).
        ranges = grants.run_ranges([
            [(source.regions[seg.tensor].addr + seg.offset - source.regions[seg.tensor].offset, seg.length)
             for seg in record.chunks[chunk].segments] for chunk in lease.chunks])
        return grants.sign(key, lease.id, grants.expiry_ms(self.config.lease_ttl_s), ranges)

    def _settle(self, req: msg.Exchange, record: VersionRecord, holding: Holding) -> set[int]:
        """Books the reader's finished and failed reads; returns the leases it must redo."""
        revoked = set()
        past = self._revoked.get(req.holder, set())
        for lease_id in req.completed:
            lease = self._leases.get(lease_id)
            if lease is None and lease_id in holding.settled:
                continue  # booked by the first try of a repeated exchange
            if lease is None or lease.reader != req.holder:
                revoked.add(lease_id)  # revoked, or issued by a hub that has since restarted: read again
                past.discard(lease_id)
                continue
            self._leases.pop(lease_id)
            holding.settled.add(lease_id)
            self._land(record, holding, lease, lease.chunks)
        for failure in req.failed:
            lease = self._leases.get(failure.lease)
            if lease is None or lease.reader != req.holder:
                if failure.landed:
                    revoked.add(failure.lease)  # the run's landed chunks are not booked: read them again
                    past.discard(failure.lease)
                continue
            self._leases.pop(failure.lease)
            if failure.landed:  # the part of a run that did land
                self._land(record, holding, lease, sorted(set(failure.landed) & set(lease.chunks)))
            source = record.holdings.get(lease.source)
            if source is not None and failure.corrupt:
                self._report_corrupt(req.worker, lease, source)
            if source is not None:
                self._suspect_until[source.worker] = self._clock() + self.config.suspect_s
                self.read_failures[source.worker] += 1
                logger.warning("read of chunk %d from %s failed (%s); re-planning", lease.chunk, lease.source,
                               failure.reason[:200])
        # Leases revoked since the last exchange (deadline passed, or their source was dropped): the reader
        # abandons those reads if still in flight and the chunks are planned again.
        revoked |= past
        past.clear()
        if req.completed or req.failed:
            self._changed.notify_all()
        return revoked

    def _land(self, record: VersionRecord, holding: Holding, lease: Lease, chunks) -> None:
        """Books chunks of ``lease`` as landed: the reader holds them (and serves the whole ones)."""
        holding.chunks.update(chunks)
        record.index.add(holding.holder, (c for c in chunks if c not in holding.unserved) if holding.unserved
                         else chunks)
        nbytes = lease.nbytes if len(chunks) == lease.count else sum(record.spans.nbytes(c, c + 1) for c in chunks)
        source = record.holdings.get(lease.source)
        if source is not None:
            source.served_bytes += nbytes
            worker = self._workers.get(source.worker)
            if worker is not None:
                worker.bytes_served += nbytes

    def _report_corrupt(self, reader: str, lease: Lease, source: Holding) -> None:
        """Bytes that fail the publisher's digest: a holder that changed its tensor after publishing, or a
        reader that claimed chunks it never verified, or a reader that lies. The reporter reads that chunk
        elsewhere and is never planned on that copy again; the copy is quarantined on independent evidence
        (corruption.py)."""
        quarantined = self._evidence.report(lease.key, lease.source, reader, source.vouched, self._clock())
        self.corrupt_reads[source.worker] += 1
        outcome = "that reader reads it elsewhere" if not quarantined else \
            f"quarantining that copy of {lease.key} for {self.config.quarantine_s:.0f} s"
        logger.error("reader %s found chunk %d from %s (worker %s) corrupt; %s", reader, lease.chunk,
                     lease.source, source.worker, outcome)

    def _plan(self, key: Key, record: VersionRecord, holding: Holding, location: Location, want: int,
              run_chunks: int = 1):
        """One reader's next reads, in O(want + complete holders + the candidate chunks' holders): the lease book
        and the chunk index answer what walks of every lease, holding and chunk once did."""
        now = self._clock()
        self._expire_leases()
        own = self._leases.of_reader(holding.holder, key)
        mine = self._leases.chunks_of(holding.holder, key)
        own_inflight = Counter(lease.source for lease in own)
        own_wan = sum(lease.distance == Distance.WAN for lease in own)
        views: dict[str, HolderView | None] = {}
        suspects: set[str] = set()
        reader_job = self._workers[holding.worker].job

        def view_of(name: str) -> HolderView | None:
            """A holder's view, built the first time this plan meets it; None: it serves nothing now."""
            if name not in views:
                h = record.holdings.get(name)
                worker = self._workers.get(h.worker) if h is not None else None
                views[name] = None
                if worker is not None and h.state not in ("draining", "pending") \
                        and self._may_get_metadata(reader_job, worker) \
                        and not self._evidence.excluded(key, name, holding.worker, now):
                    # A ranged reader's partly read chunks are never served (the index leaves them out too).
                    chunks = h.chunks - h.unserved if h.chunks is not None and h.unserved else h.chunks
                    views[name] = HolderView(name, worker.location, chunks, self._leases.reads_from(key, name),
                                             h.served_bytes, published=h.state == "active")
                    if self._suspect_until.get(h.worker, 0) > now:
                        suspects.add(name)
            return views[name]

        def serving(names) -> list[HolderView]:
            return [v for n in names if (v := view_of(n)) is not None and n not in suspects]

        pulling, wan = self._leases.pulling(key), self._leases.wan_pulling(key)
        view = SwarmView(serving(record.index.complete), pulling, wan,
                         partial_holders=lambda chunk: serving(record.index.holders_of(chunk)),
                         nearer_holders=lambda here, distance: serving(record.index.nearer(here, distance)))

        def everyone() -> SwarmView:
            """The candidates' holders, suspects too: a suspect may recover, so a chunk only it has is servable."""
            names = set(record.index.complete).union(*(record.index.holders_of(c) for c in needed))
            return SwarmView([v for n in sorted(names) if (v := view_of(n)) is not None], pulling, wan)

        cursor = record.index.cursor(holding.holder)
        needed = cursor.candidates(holding.chunks, mine, candidates_for(want))
        filling = record.index.filling()
        seeds = [s for s in record.seeds[location.dc] if s in record.holdings]
        request, record.seeds[location.dc] = reader_request(
            holding.holder, location, needed, want, seeds=seeds, filling=filling, own_inflight=own_inflight,
            own_wan_reads=own_wan, config=self.config.planner, run_chunks=run_chunks,
            needs=_needs(holding, len(record.chunks), mine), needs_until=_needs_until(holding, len(record.chunks), mine))
        assignments = plan_chunks(request, view, self.config.planner)
        if len(assignments) < want:
            cursor.move_on()  # these candidates are busy or far: the next plan looks at the next ones
        return assignments, everyone, needed

    def _check_some_holder_serves(self, reader: str, record: VersionRecord) -> None:
        """A fetch whose every possible source is another job's NIXL holder would starve: refuse it at once."""
        reader_job = self._workers[reader].job
        sources = [self._workers[h.worker] for h in record.holdings.values()
                   if h.worker != reader and h.worker in self._workers]
        if sources and not any(self._may_get_metadata(reader_job, w) for w in sources):
            m = record.manifest
            raise NotOwner(f"{m.model} v{m.version} ({m.layout}) is held only by workers of job(s) "
                           f"{sorted({w.job for w in sources})} on NIXL, whose metadata (a capability to read and "
                           f"write their memory) goes only to workers of their own job; worker {reader!r} is in job "
                           f"{reader_job!r}. Connect with that job's key (ClientConfig.job_key), or have a holder "
                           f"serve on the TCP plane (transport='tcp'), or start the hub with "
                           f"HubConfig(nixl_within_job=False) where every job is trusted")

    def _may_get_metadata(self, reader_job: str, source: WorkerRecord) -> bool:
        """Whether a reader of ``reader_job`` may be planned on ``source``, which hands it its data-plane metadata
        with the lease. A plane that checks a grant on every read (TCP) serves anyone the hub leases; NIXL
        metadata is a capability over the holder's memory, so it goes only to the holder's own job (the
        allow-list), unless ``HubConfig.nixl_within_job`` is off."""
        return bool(source.grant_key) or source.job == reader_job or not self.config.nixl_within_job

    def end_fetch(self, req: msg.EndFetch) -> msg.EndFetchAck:
        key = (req.model, req.version, req.layout)
        with self._lock:
            _check_holder(req.worker, req.holder)
            record = self._versions.get(key)
            holding = record.holdings.get(req.holder) if record else None
            if holding is None:
                raise InvalidRequest(f"{req.holder} has no fetch of {key} in progress")
            if holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            if holding.state == "draining":
                # A repeated end while the holding's reads drain: it only waits for them.
                return self._drain(key, req.holder, req.wait_s, msg.EndFetchAck)
            if holding.state != "filling":
                raise InvalidRequest(f"{req.holder} has no fetch of {key} in progress: its holding is "
                                     f"{holding.state}; only a fetch begun with /v1/fetch/begin can end")
            if req.ok and holding.chunks is not None and not holding.complete(len(record.chunks)):
                raise InvalidRequest(f"{req.holder} reports a finished fetch with {len(holding.chunks)} of "
                                     f"{len(record.chunks) if holding.need is None else len(holding.need)} chunks")
            if req.ok and req.hold and holding.need is not None:
                raise InvalidRequest(f"{req.holder} read parts of {key}: a ranged reader cannot hold the version")
            for lease in self._leases.of_reader(req.holder):
                self._leases.pop(lease.id)
            self._revoked.pop(req.holder, None)
            holding.settled = set()
            record.index.leave(holding)  # planned no more as a partial holder: it holds all, or drains
            if req.ok:
                self.fetch_seconds.append((req.model, req.seconds))
                del self.fetch_seconds[:-10_000]
            if req.ok and req.hold:
                holding.state, holding.chunks = "active", None
                record.index.enter(holding)  # a complete holder now
                self._holdings_changed(req.model)
                return msg.EndFetchAck(drained=True, inflight=0)
            holding.state = "draining"
            return self._drain(key, req.holder, req.wait_s, msg.EndFetchAck)

    # ------------------------------------------------------------------------------------ upkeep
    def sweep(self) -> None:
        """Expires silent workers and overdue leases. The server calls it a few times a second.

        A worker's silence is counted in the hub's awake time (see ``liveness``): heartbeats that queued
        while the hub's own event loop was stalled do not count against the worker that sent them."""
        with self._lock:
            now = self._clock()
            stalled = self.stall.stalled()
            for worker, r in list(self._workers.items()):
                silence = now - r.last_seen - (stalled - r.stall_at_seen)
                if silence > self.config.worker_timeout_s:
                    logger.warning("worker %s sent no heartbeat for %.1f s (%.1f s of it while the hub was "
                                   "awake); dropping it and its holdings", worker, now - r.last_seen, silence)
                    self._drop_worker(worker)
            self._expire_leases()
            self._evidence.expire(now)

    def _expire_leases(self) -> None:
        overdue = self._leases.overdue(self._clock())
        for lease in overdue:
            self._revoked[lease.reader].add(lease.id)
            self.leases_revoked += 1
            logger.warning("lease %d (chunk %d from %s to %s) outlived its deadline; revoked",
                           lease.id, lease.chunk, lease.source, lease.reader)
        if overdue:
            self._changed.notify_all()

    def _drop_worker(self, worker: str) -> None:
        self._workers.pop(worker, None)
        self._suspect_until.pop(worker, None)
        dropped, models = set(), set()
        for key, record in list(self._versions.items()):
            for holder in [h for h, holding in record.holdings.items() if holding.worker == worker]:
                record.pop(holder)
                dropped.add(holder)
                models.add(key[0])
            self._forget_if_empty(key)
        for holder in dropped:
            self._revoked.pop(holder, None)
        for lease in self._leases.all():
            if lease.reader in dropped:
                self._leases.pop(lease.id)
            elif lease.source in dropped:
                # Its source is gone (dead, or frozen past the heartbeat timeout): tell the reader now, so
                # it re-plans the chunk instead of waiting out its read timeout.
                self._leases.pop(lease.id)
                self._revoked[lease.reader].add(lease.id)
        self._holdings_changed(*models)

    def _forget_if_empty(self, key: Key) -> None:
        record = self._versions.get(key)
        if record is not None and not record.holdings:
            del self._versions[key]
            keys = self._model_keys.get(key[0], set())
            keys.discard(key)
            if not keys:
                self._model_keys.pop(key[0], None)
            if not any(k[1] == key[1] for k in keys):
                for group in [g for g in self._shard_groups if g[:2] == key[:2]]:
                    del self._shard_groups[group]
                    self._shard_counts.pop(group, None)

    def _holdings_of(self, worker: str) -> list[Holding]:
        return [h for r in self._versions.values() for h in r.holdings.values() if h.worker == worker]

    @staticmethod
    def _visible(record: VersionRecord) -> bool:
        """Its active holdings together have every chunk: a full holder, or one row shard of every rank (an
        active holding is one or the other). A row shard that died without a stand-in hides the version again.
        O(holdings), not O(chunks): it runs for every version of a model on each query."""
        ranks = set()
        for h in record.holdings.values():
            if h.state == "active" and h.chunks is None:
                return True
            if h.state == "active":
                ranks.add(h.shard_rank)
        return len(ranks) == record.manifest.row_shards

    # ------------------------------------------------------------------------------------ queries
    def manifest(self, model: str, version: int | str, layout: str) -> Manifest:
        with self._lock:
            resolved = self.resolve(model, version, layout)
            return self._versions[(model, resolved, layout)].manifest

    def resolve(self, model: str, version: int | str, layout: str) -> int:
        """Resolves "latest" once; a version counts only when a holder of it in ``layout`` is active."""
        with self._lock:
            if version == "latest":
                active = [k[1] for k, r in self._records_of(model) if k[2] == layout and self._visible(r)]
                if not active:
                    raise VersionNotFound(f"model {model!r} has no published version in layout {layout!r}")
                return max(active)
            record = self._versions.get((model, int(version), layout))
            if record is None or not self._visible(record):
                known = sorted({k[1] for k, r in self._records_of(model) if self._visible(r)})
                raise VersionNotFound(f"version {version} of {model!r} in layout {layout!r} is not published; "
                                      f"published versions: {known or 'none'}")
            return int(version)

    def versions(self, model: str, layout: str | None = None) -> dict[int, list[str]]:
        with self._lock:
            result: dict[int, list[str]] = defaultdict(list)
            for (m, v, lay), record in self._records_of(model):
                if layout is not None and lay != layout:
                    continue
                holders = [h.worker for h in record.holdings.values() if h.state == "active"]
                if holders and self._visible(record):
                    result[v].extend(w for w in holders if w not in result[v])
            return {v: sorted(ws) for v, ws in sorted(result.items())}

    def wait_for_change(self, timeout: float) -> None:
        with self._lock:
            self._changed.wait(timeout)

    def status(self) -> msg.StatusReply:
        with self._lock:
            now = self._clock()
            workers = {w: msg.WorkerStatus(location=r.location.as_dict(), spot=r.spot, bytes_served=r.bytes_served,
                                           last_seen_s=round(now - r.last_seen, 3)) for w, r in self._workers.items()}
            models: dict[str, list[msg.VersionStatus]] = defaultdict(list)
            for (model, version, layout), record in sorted(self._versions.items()):
                models[model].append(msg.VersionStatus(
                    version=version, layout=layout, bytes=record.manifest.nbytes, chunks=len(record.chunks),
                    holders=[msg.HolderStatus(holder=h.holder, worker=h.worker, state=h.state,
                                              quarantined=self._evidence.quarantined(
                                                  (model, version, layout), h.holder, now),
                                              chunks=len(record.chunks) if h.chunks is None else len(h.chunks),
                                              served_bytes=h.served_bytes) for h in record.holdings.values()],
                ))
            return msg.StatusReply(hub_instance=self.instance, workers=workers, models=dict(models),
                                   leases_in_flight=len(self._leases), leases_revoked=self.leases_revoked)

    def metrics_snapshot(self) -> dict:
        with self._lock:
            holders = {k: sum(1 for h in r.holdings.values() if h.state == "active") for k, r in self._versions.items()}
            return {"bytes_served": {w: r.bytes_served for w, r in self._workers.items()},
                    "holders": holders, "fetch_seconds": list(self.fetch_seconds),
                    "leases_revoked": self.leases_revoked, "read_failures": dict(self.read_failures),
                    "corrupt_reads": dict(self.corrupt_reads),
                    "leases_in_flight": len(self._leases), "workers": len(self._workers)}


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _same_secret(expected_hash: bytes, presented: str) -> bool:
    return bool(presented) and hmac.compare_digest(expected_hash, _hash(presented))


def _needs(holding: Holding, total: int, pulling: AbstractSet[int]):
    """Whether the filling ``holding`` lacks a chunk and is not pulling it (what a run may extend into)."""
    have, need = holding.chunks, holding.need
    return lambda c: c < total and c not in have and c not in pulling and (need is None or c in need)


def _needs_until(holding: Holding, total: int, pulling: ReaderRuns):
    """The first chunk in [start, end) that ``_needs`` refuses, by interval lookups (a ranged reader's ``need``
    chunk by chunk)."""
    have, need = holding.chunks, holding.need

    def until(start: int, end: int) -> int:
        end = pulling.first_in(start, first_held(have, start, min(end, total)))
        return end if need is None else first_missing(need, start, end)
    return until


def _check_holder(worker: str, holder: str) -> None:
    if holder != worker and not holder.startswith(worker + msg.HOLDER_SEPARATOR):
        raise NotOwner(f"worker {worker!r} may act only for holders named {worker!r} or "
                       f"'{worker}{msg.HOLDER_SEPARATOR}<suffix>', not {holder!r}")


def _merge_digests(existing: Manifest, incoming: Manifest) -> Manifest:
    """Each row shard knows its own chunks' digests: the version's manifest collects them, so that once the
    group commits every reader checks every chunk."""
    if not incoming.chunk_digests:
        return existing
    old = existing.chunk_digests or ("",) * len(incoming.chunk_digests)
    merged = tuple(a or b for a, b in zip(old, incoming.chunk_digests))
    return existing if merged == existing.chunk_digests else replace(existing, chunk_digests=merged)
