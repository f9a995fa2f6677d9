"""The hub's soft state, behind one facade: workers, holdings, leases. No I/O here; the HTTP layer wraps it.

Everything here can be rebuilt from the workers: after a hub restart each client re-registers itself, its holdings
and its fetches in progress, and nothing is lost.

The state is split by the data each part owns; ``HubState`` holds the lock, calls the parts, and is the only
caller of more than one of them::

    HubState (lock, change notifier, ids)
      |- Registry      workers, credential hashes, worker id -> job      registry.py
      |- VersionStore  versions, their holdings and chunk index          versions.py
      |- Retention     release lists, newest-holders cache               retention.py
      |- ShardGroups   pending shard groups                              shard_groups.py
      |- Leases        reads in flight, revocations (LeaseBook)          leases.py
      |- Quarantine    suspects, corruption evidence, failure counts     quarantine.py
      |- ReadDesk      planning and booking glue over the parts above    reads.py
      |- Owners        model -> owner job                                ../ownership.py
      |- FlipBook      replicas' serving/staged reports, fleet commits   flips.py
      '- FetchTimes    fetch latencies for /metrics                      status.py

A part never calls the facade or reaches into another part's data; where a part needs another's answer (retention
needs which versions are visible) the facade passes that part in and it calls its public methods.

Locks and the event loop: every public method takes the state lock (a ``threading.RLock``) and runs on a thread,
never on the HTTP server's event loop (``hub.app``): a pool thread's long ``status()`` or drop of a worker then
stalls no other request. One exception, ``heartbeat_unlocked``: it takes no lock and runs on the loop (it reads
entries that the locked side replaces in one store, and writes one timestamp). Coroutines that wait for a change wait without the lock: ``/v1/wait`` on
``changes.wait_async``, a parked exchange on the park that ``exchange`` queued under the lock (``Changes``: a report
wakes only the parked readers it can serve); threads wait on the lock's condition. A change of holdings notifies all.

Invariants:
  - A holding in state ``active`` holds every chunk (``chunks`` None), or, as a row shard (an FSDP rank
    holding its dim-0 rows of every tensor), exactly its rank's chunks; ``filling`` holdings serve the
    chunks they have.
  - A lease is one read of one chunk from one holding. While a lease is live its source's bytes must
    not change, so ``unpublish`` waits for the holding's leases to end. A lease past its deadline is
    revoked: its reader is told to read that chunk again, and it no longer holds up ``unpublish``.
  - A version is visible (``versions``/``latest``, retention, ``/v1/wait``) only while its ``active``
    holdings together have every chunk (``VersionStore.visible``): one full holder, or row shards that add up.
  - The shards of a k-shard engine (``shard_group``) stay ``pending`` -- neither visible nor read --
    until all k have been published; then they turn ``active`` together.
  - A worker acts only as itself: registration binds a random credential to the worker id (the hub keeps
    only its hash), and the HTTP layer runs every call for a worker inside ``acting_as``. A worker's
    holders are named ``<worker>`` or ``<worker>~<suffix>``, so no worker publishes, unpublishes or fetches
    as a holder of another. A restarted hub knows no credentials: it accepts any unknown id and issues a
    new one (soft state; the trust model in the README says what that allows).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import logging
import secrets
import threading
import time
import uuid
from collections import defaultdict
from typing import Callable, TypeVar

from tensorhub_verl.errors import InvalidRequest, ManifestMismatch, NotOwner, UnknownFetch, VersionNotFound
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.admission import check_copy, check_non_owner_creates_nothing, check_pending_budget
from tensorhub_verl.ros.hub.changes import Changes, ReaderPark, Wake
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.leases import Leases
from tensorhub_verl.ros.hub.preserve import must_preserve
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.flips import FlipBook
from tensorhub_verl.ros.hub.delta_rules import check_delta_listed, check_delta_publish, report_bad_delta
from tensorhub_verl.ros.hub.reads import ReadDesk
from tensorhub_verl.ros.hub.records import GroupKey, Holding, HoldingState, Key, Member, VersionRecord, WorkerRecord
from tensorhub_verl.ros.hub.registry import Registry, hash_secret, heard
from tensorhub_verl.ros.hub.retention import Retention
from tensorhub_verl.ros.hub.shard_groups import ShardGroups
from tensorhub_verl.ros.hub.status import FetchTimes, metrics_snapshot, status_reply
from tensorhub_verl.ros.hub.versions import VersionStore
from tensorhub_verl.ros.hub.intervals import IntervalSet
from tensorhub_verl.ros.hub.limits import PreparedVersion, check_regions, check_row_shard, check_same_chunk_map, \
    prepare_version
from tensorhub_verl.ros.hub.liveness import StallMeter
from tensorhub_verl.ros.wire.manifest import Manifest, check_same_tensors
from tensorhub_verl.ros.hub.ownership import Owners
from tensorhub_verl.ros.planes.one_plane import hub_plane
from tensorhub_verl.ros.planes.tcp_wire import advertises_own_address
from tensorhub_verl.ros.hub.planner import unservable
from tensorhub_verl.ros.hub.shard_digests import merge_shard_digests
from tensorhub_verl.ros.wire.topology import Location

__all__ = ["HubConfig", "HubState", "Holding", "VersionRecord", "WorkerRecord", "Key", "GroupKey", "Member"]

logger = logging.getLogger("tensorhub_verl.ros.hub")

Ack = TypeVar("Ack", bound=msg.DrainAck)


class HubState:
    def __init__(self, config: HubConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 hub_url: str = "http://127.0.0.1"):
        """``hub_url``: where the hub serves (its plane's 'auto' resolves for it, ``planes/one_plane.py``)."""
        self.config = config = config or HubConfig()
        self.plane = hub_plane(config.plane, hub_url)
        """The data plane every worker of this hub uses."""
        self.instance = uuid.uuid4().hex[:12]
        self.sweeps = 0
        """Upkeep passes made (``sweep``), in ``status()``: tests and operators see the sweeper run."""
        self._clock = clock
        self.stall = StallMeter(clock)
        """Ticked by the server's event-loop probe: silence while the hub itself was stalled is not the workers'."""
        self._lock = threading.RLock()
        self.changes = Changes(self._lock)
        self.registry = Registry(self.instance, config.worker_timeout_s, self.plane)
        self.store = VersionStore()
        self.retention = Retention(config.keep_versions)
        self.shard_groups = ShardGroups()
        self.leases = Leases()
        self.quarantine = Quarantine(config.quarantine_s, config.suspect_s)
        self.reads = ReadDesk(self.registry, self.leases, self.quarantine, config.planner, config.lease_ttl_s,
                              config.nixl_within_job, retained=lambda model: self.retention.retained(model, self.store))
        self.owners = Owners(config.owners)
        self.fetch_times = FetchTimes()
        self.flips = FlipBook()
        self._ids = itertools.count(secrets.randbits(40) << 12 | 1)
        """Lease ids and holding generations, from a random start: a restarted hub must not issue the id of a lease
        the old instance gave, which a reader may still report (it would book that read for another chunk), nor a
        generation a reader has cached (it would keep a holder's stale metadata). Below 2**52."""

    @property
    def model_seq(self) -> dict[str, int]:
        """model -> bumped whenever its active holdings may have changed (parked long-polls compare it)."""
        return self.store.model_seq

    # ----------------------------------------------------------------------------------- workers
    def register_worker(self, req: msg.RegisterWorker, credential: str = "",
                        job_key: str = "", registered_from: str | None = None) -> msg.WorkerAck:
        """Registers (or re-registers) a worker; the reply carries its credential. ``job_key``: the secret
        that admits it to its job (``ownership.py``); empty: the hub's default job. ``registered_from``: the
        address the registration came from.

        A live id is re-registered only with its credential (a worker refreshing its data-plane metadata);
        anyone else gets NotOwner until that worker leaves or misses its heartbeats."""
        with self._lock:
            now = self._clock()
            admitted = self.registry.admit(req, credential, job_key)
            old = admitted.old
            if admitted.restarted:
                logger.info("worker %s restarted (agent %s -> %s); dropping its holdings",
                            req.worker, old.agent_name, req.agent_name)
                self._drop_worker(req.worker)
                old = None
            same_address = old is not None and (old.agent_metadata_b64, old.registered_from) == (
                req.agent_metadata_b64, registered_from)
            record = WorkerRecord(
                worker=req.worker, location=Location(**req.location.model_dump()), spot=req.spot,
                agent_name=req.agent_name, agent_metadata_b64=req.agent_metadata_b64, last_seen=now,
                bytes_served=old.bytes_served if old else 0, credential_hash=hash_secret(admitted.secret),
                grant_key=base64.b64decode(req.grant_key_b64) if req.grant_key_b64 else b"",
                awake_at_seen=now - self.stall.stalled(), job=admitted.job, plane=req.plane,
                registered_from=registered_from, served_at_metadata=old.served_at_metadata if same_address else 0)
            self.registry.put(record)
            for holding in self.store.holdings_of(req.worker):
                holding.generation = next(self._ids)  # readers must reload the agent metadata
            self.changes.notify_threads()
            peers = self._likely_sources(record, req.preconnect) if req.preconnect and record.grant_key else []
            return self._ack(req.worker).model_copy(update={"credential": admitted.secret, "peers": peers})

    def _likely_sources(self, joiner: WorkerRecord, count: int) -> list[msg.PeerMsg]:
        """Up to ``count`` other workers holding the newest version of some model, nearest to ``joiner`` first
        (ties in random order, so joiners spread over equally near holders): whom it most likely reads from
        first. Only workers whose data plane checks a grant on every read (their metadata is just an address),
        that served reads readers found good since they last set that metadata, at the address they registered
        from: a joiner never opens a connection where a worker's self-chosen metadata alone points it."""
        candidates = [r for w in self.retention.newest_holders(self.store)
                      if w != joiner.worker and (r := self.registry.get(w)) is not None and r.grant_key
                      and r.served_at_metadata > 0 and advertises_own_address(r.agent_metadata_b64,
                                                                              r.registered_from)]
        candidates.sort(key=lambda r: (joiner.location.distance(r.location), secrets.randbits(32)))
        return [msg.PeerMsg(worker=r.worker, agent_name=r.agent_name, agent_metadata_b64=r.agent_metadata_b64)
                for r in candidates[:count]]

    @property
    def lock(self) -> threading.RLock:
        """The state's lock (re-entrant): ``StateCalls.short`` runs a fetch-path call on the event loop when it is
        free."""
        return self._lock

    @contextlib.contextmanager
    def acting_as(self, worker: str, credential: str):
        """Holds the hub lock while the caller acts for ``worker``, after checking its credential.

        The check and the action share one critical section, so the id cannot change hands between them."""
        with self._lock:
            self.registry.authenticate(worker, credential)
            yield

    def heartbeat(self, worker: str) -> msg.WorkerAck:
        with self._lock:
            self.registry.touch(worker, self._clock(), self.stall.stalled())
            if self.quarantine.cleared(worker):
                self.changes.notify()  # readers waiting for work may be planned on it again
            return self._ack(worker)

    def heartbeat_unlocked(self, worker: str, credential: str) -> msg.WorkerAck | None:
        """A heartbeat answered without the state lock, on the event loop: checks the credential (UnknownWorker:
        the worker registers again; NotOwner), records when the worker was heard (one store, ``registry.heard``)
        and answers from the release lists when they are settled. None when the heartbeat needs the lock: the
        worker has a suspicion to clear, or retention lists are being brought up to date; the caller then runs
        ``heartbeat`` inside ``acting_as``.

        Reads only dict entries and fields that the locked side replaces in one store; ordered against a
        concurrent locked call as if it came just before or just after it."""
        record = self.registry.authenticate(worker, credential)
        heard(record, self._clock(), self.stall.stalled())
        if self.quarantine.listed(worker):
            return None
        release = self.retention.settled_release(worker)
        return None if release is None else self._ack(worker, release)

    def leave(self, worker: str) -> None:
        """A worker that closes: it has drained its holdings; forget it now rather than at its timeout."""
        with self._lock:
            if worker in self.registry:
                self._drop_worker(worker)

    def _ack(self, worker: str, release: list[msg.HoldingKey] | None = None) -> msg.WorkerAck:
        """``release``: the worker's release list when the caller has it (None: looked up, under the lock)."""
        if release is None:
            release = self.retention.release_for(worker, self.store)
        return msg.WorkerAck(worker=worker, hub_instance=self.instance, heartbeat_s=self.config.heartbeat_s,
                             release=release, plane=self.plane)

    def _holdings_changed(self, *models: str) -> None:
        """Called wherever a holding appears, turns active, or goes: retention and waiters look again."""
        self.retention.changed(*models)
        self.store.changed(*models)
        self.changes.notify(*models)

    # ---------------------------------------------------------------------------------- holdings
    def authorize_publish(self, req: msg.Publish, credential: str) -> None:
        """The cheap checks of a publish, run before ``prepare`` builds its chunk map (which may cost seconds of
        CPU at the piece limit): the worker's credential, its holder name, the model's owner, and the worker's
        budget of pending shards. ``publish`` checks all of them again under the lock."""
        with self.acting_as(req.worker, credential):
            _check_holder(req.worker, req.holder)
            m = req.manifest
            record = self.store.get((m.model, m.version, m.layout))
            job = self.registry.require(req.worker).job
            if not self.owners.owns(m.model, req.worker, job):
                check_non_owner_creates_nothing(req, record, job, self.owners)
            if req.shard_count > 1:
                check_pending_budget(req, self.config.limits, self.store, self._job_of, job)

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
            worker = self.registry.require(req.worker)
            _check_holder(req.worker, req.holder)
            record = self.store.get(key)
            owner = self.owners.owns(key[0], req.worker, worker.job)
            if not owner:
                check_copy(req, record, worker.job, self.owners)
            check_delta_publish(req, record, self.store)
            if record is not None:
                check_same_tensors(record.manifest, manifest)
                if req.shard_rank is not None or not owner:
                    check_same_chunk_map(record.manifest, manifest)
                existing = record.holdings.get(req.holder)
                if existing is not None and existing.worker != req.worker:
                    raise NotOwner(f"holder {req.holder!r} belongs to worker {existing.worker!r}")
                if existing is not None and existing.state not in (HoldingState.ACTIVE, HoldingState.PENDING):
                    raise InvalidRequest(f"{req.holder} is {existing.state} version {manifest.version} of "
                                         f"{manifest.model!r} ({manifest.layout}); wait for that to finish")
            group = (manifest.model, manifest.version, req.shard_group)
            member = (key, req.holder)
            if req.shard_count > 1:
                self.shard_groups.check(group, req.shard_count, member, req.shard_rank, self._member_alive)
                check_pending_budget(req, self.config.limits, self.store, self._job_of, worker.job)
            if record is None:
                record = VersionRecord(manifest, prepared.chunks)
                self.store.add(key, record)
            elif (record.manifest.chunk_bytes, record.manifest.row_shards) == (manifest.chunk_bytes,
                                                                             manifest.row_shards):
                record.manifest = merge_shard_digests(record.manifest, manifest)  # fills a partial group's gaps
            state = HoldingState.PENDING if req.shard_count > 1 else HoldingState.ACTIVE
            record.put(Holding(req.holder, req.worker, list(req.regions), prepared.shard_chunks, state,
                               next(self._ids), shard_rank=req.shard_rank, vouched=owner), worker.location)
            if owner:
                self.owners.bind(key[0], worker.job)
            if req.shard_count > 1:
                for member_key, holder in self.shard_groups.commit(group, req.shard_count, member, req.shard_rank,
                                                                   self._member_alive):
                    holding = self.store.holding(member_key, holder)
                    if holding.state == HoldingState.PENDING:  # not one that is draining meanwhile
                        holding.state = HoldingState.ACTIVE
            self._holdings_changed(key[0])

    def _job_of(self, worker: str) -> str | None:
        record = self.registry.get(worker)
        return None if record is None else record.job

    def _member_alive(self, member: Member) -> bool:
        """Whether a shard group member's holding still exists: a shard that died leaves room for its stand-in."""
        return self.store.holding(*member) is not None

    def unpublish(self, req: msg.Unpublish) -> msg.UnpublishAck:
        key = (req.model, req.version, req.layout)
        with self._lock:
            _check_holder(req.worker, req.holder)
            holding = self.store.holding(key, req.holder)
            if holding is None:
                raise VersionNotFound(f"{req.holder} holds no version {req.version} of {req.model!r} "
                                      f"({req.layout}); nothing to unpublish")
            if holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            holding.state = HoldingState.DRAINING
            self._holdings_changed(req.model)
            return self._drain(key, req.holder, req.wait_s, msg.UnpublishAck)

    def _drain(self, key: Key, holder: str, wait_s: float, reply: type[Ack]) -> Ack:
        """Waits (at most ``wait_s``) until no read from ``holder``'s holding of ``key`` is in flight, then drops
        it. It wakes when a reader reports (``exchange`` notifies) or when the next lease deadline passes."""
        deadline = self._clock() + wait_s
        while True:
            self._expire_leases()
            inflight = self.leases.drains(key, holder)
            if inflight == 0:
                record = self.store.get(key)
                if record is not None:
                    record.pop(holder)
                    self._forget_if_empty(key)
                self._holdings_changed(key[0])
                return reply(drained=True, inflight=0)
            remaining = deadline - self._clock()
            if remaining <= 0:
                return reply(drained=False, inflight=inflight)
            self.changes.wait(self._until_next_due(remaining))

    def _until_next_due(self, remaining: float, *more: float | None) -> float:
        """How long a thread may wait for a notification: at most ``remaining``, and no later than the next lease
        deadline (that lease must be revoked) or any of ``more`` (clock times when the plan may change)."""
        dues = [d for d in (self.leases.next_deadline(), *more) if d is not None]
        if not dues:
            return remaining
        return min(remaining, max(0.0, min(dues) - self._clock()) + 1e-3)

    def must_preserve(self, req: msg.PreserveQuery) -> msg.PreserveAnswer:
        """True when ``holder`` holds the last reliable copy of a version inside the retention window
        (``preserve.py``)."""
        with self._lock:
            return must_preserve(req, self.retention.retained(req.model, self.store), self.store,
                                 self.registry, self.quarantine, self._clock(), self.stall.stalled())

    # ----------------------------------------------------------------------------------- fetches
    def begin_fetch(self, req: msg.BeginFetch) -> Manifest:
        key = (req.model, req.version, req.layout)
        with self._lock:
            worker = self.registry.require(req.worker)
            _check_holder(req.worker, req.holder)
            record = self.store.get(key)
            if record is None or not record.holdings:
                raise VersionNotFound(f"no worker holds version {req.version} of {req.model!r} in layout "
                                      f"{req.layout!r}; see `tensorhub status` for what is published")
            if req.digest != record.manifest.digest:
                raise ManifestMismatch(f"layout digest {req.digest} differs from version {req.version}'s "
                                       f"{record.manifest.digest}; the buffers do not describe this layout")
            check_regions(req.regions, record.manifest, None, ranged=req.need is not None)
            self.reads.check_some_holder_serves(req.worker, record)
            existing = record.holdings.get(req.holder)
            if existing is not None and existing.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {existing.worker!r}")
            if existing is not None and existing.state != HoldingState.FILLING:
                raise InvalidRequest(f"{req.holder} already holds version {req.version} of {req.model!r} "
                                     f"({existing.state}); unpublish it before fetching it again")
            # Announced chunks are not read again, but the hub never saw them land: they serve nobody during
            # this fetch, and the holding never counts as a reliable copy (Holding.vouched).
            chunks = IntervalSet(c for c in req.have if c < len(record.chunks))
            need = None if req.need is None else frozenset(c for c in req.need if c < len(record.chunks))
            record.put(Holding(req.holder, req.worker, list(req.regions), chunks, HoldingState.FILLING,
                               next(self._ids), need=need, unserved=frozenset(req.unserved) | frozenset(chunks),
                               vouched=not chunks),
                       worker.location)
            self.leases.forget_revoked(req.holder)
            return record.manifest

    def exchange(self, req: msg.Exchange, park: ReaderPark | None = None,
                 woken: Wake | None = None) -> msg.ExchangeReply:
        """Books the reader's reports and plans its next reads; with ``wait_s``, waits (on the lock's condition)
        until some work can be planned, the fetch needs none, or ``wait_s`` passes. With ``park`` (the event
        loop's wait, ``fetch_routes.exchange``), a reader that gets no work and waits for some is parked in the
        same critical section (``Changes.park_reader``); ``woken``: the report's wake that woke it, handed on
        when it still gets no work."""
        key = (req.model, req.version, req.layout)
        with self._lock:
            reader = self.registry.require(req.worker)
            _check_holder(req.worker, req.holder)
            self.registry.touch(req.worker, self._clock(), self.stall.stalled())
            record = self.store.get(key)
            holding = record.holdings.get(req.holder) if record else None
            if holding is not None and holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            if holding is None or holding.state != HoldingState.FILLING:
                raise UnknownFetch(f"{req.holder} has no fetch of {key} in progress; begin the fetch first")
            revoked, landed = self.reads.settle(req, record, holding, self._clock())
            if req.failed:
                self.changes.notify(req.model)  # a source failed: every reader waiting for work looks again
            elif landed:
                self.changes.wake_readers(*self.reads.wake_for(key, record, holding, landed))
            deadline = self._clock() + req.wait_s
            while True:
                self._expire_leases()
                assignments, everyone, needed = self.reads.plan(key, record, holding, reader.location, req.want,
                                                                req.run_chunks, self._clock())
                remaining = deadline - self._clock()
                if assignments or remaining <= 0 or not self.reads.waits_for_work(key, record, holding):
                    break
                self.changes.wait(self._until_next_due(remaining, self.quarantine.next_end(self._clock())))
            reply = self.reads.lease(req, key, record, holding, reader.location, assignments, revoked,
                                     unservable_now=lambda: unservable(needed, everyone(), req.holder),
                                     ids=self._ids, now=self._clock())
            if not assignments:
                if park is not None and self.reads.waits_for_work(key, record, holding):
                    self.changes.park_reader(park, key, req.holder, req.model)
                if woken is not None:
                    self.changes.pass_on(woken)  # a wake this reader could not use: the next reader looks
            return reply

    def end_fetch(self, req: msg.EndFetch) -> msg.EndFetchAck:
        key = (req.model, req.version, req.layout)
        with self._lock:
            _check_holder(req.worker, req.holder)
            record = self.store.get(key)
            holding = record.holdings.get(req.holder) if record else None
            if holding is None:
                raise InvalidRequest(f"{req.holder} has no fetch of {key} in progress")
            if holding.worker != req.worker:
                raise NotOwner(f"holder {req.holder!r} belongs to worker {holding.worker!r}")
            if holding.state == HoldingState.DRAINING:
                # A repeated end while the holding's reads drain: it only waits for them.
                return self._drain(key, req.holder, req.wait_s, msg.EndFetchAck)
            if holding.state != HoldingState.FILLING:
                raise InvalidRequest(f"{req.holder} has no fetch of {key} in progress: its holding is "
                                     f"{holding.state}; only a fetch begun with /v1/fetch/begin can end")
            if req.ok and holding.chunks is not None and not holding.complete(len(record.chunks)):
                raise InvalidRequest(f"{req.holder} reports a finished fetch with {len(holding.chunks)} of "
                                     f"{len(record.chunks) if holding.need is None else len(holding.need)} chunks")
            if req.ok and req.hold and holding.need is not None:
                raise InvalidRequest(f"{req.holder} read parts of {key}: a ranged reader cannot hold the version")
            self.leases.reader_done(req.holder)
            holding.settled = set()
            record.index.leave(holding)  # planned no more as a partial holder: it holds all, or drains
            if req.ok:
                self.fetch_times.add(req.model, req.seconds)
            if req.ok and req.hold and not holding.vouched:
                # Chunks it only announced: the hub cannot tell whether it holds the version at all. Its own
                # copy to use and unpublish, never a source and never counted as one.
                holding.state, holding.chunks = HoldingState.HELD, None
                self._holdings_changed(req.model)
                return msg.EndFetchAck(drained=True, inflight=0)
            if req.ok and req.hold:
                holding.state, holding.chunks = HoldingState.ACTIVE, None
                record.index.enter(holding)  # a complete holder now
                self._holdings_changed(req.model)
                return msg.EndFetchAck(drained=True, inflight=0)
            holding.state = HoldingState.DRAINING
            return self._drain(key, req.holder, req.wait_s, msg.EndFetchAck)

    # ------------------------------------------------------------------------------------ upkeep
    def sweep(self) -> None:
        """Expires silent workers and overdue leases. The server calls it a few times a second.

        A worker's silence is counted in the hub's awake time (see ``liveness``): heartbeats that queued
        while the hub's own event loop was stalled do not count against the worker that sent them."""
        with self._lock:
            now = self._clock()
            self.sweeps += 1
            for record, silence in self.registry.silent(now, self.stall.stalled()):
                logger.warning("worker %s sent no heartbeat for %.1f s (%.1f s of it while the hub was "
                               "awake); dropping it and its holdings", record.worker, now - record.last_seen,
                               silence)
                self._drop_worker(record.worker)
            self._expire_leases()
            if self.quarantine.expire(now):
                self.changes.notify()  # a source serves again: readers waiting for work look again

    def _expire_leases(self) -> None:
        overdue = self.leases.expire(self._clock())
        if overdue:
            self.changes.notify(*{lease.key[0] for lease in overdue})

    def _drop_worker(self, worker: str) -> None:
        self.registry.remove(worker)
        self.flips.forget(worker)
        self.quarantine.cleared(worker)
        dropped, models = set(), set()
        for key, record in self.store.items():
            for holder in [h for h, holding in record.holdings.items() if holding.worker == worker]:
                record.pop(holder)
                dropped.add(holder)
                models.add(key[0])
            self._forget_if_empty(key)
        self.leases.holders_gone(dropped)
        self._holdings_changed(*models)

    def _forget_if_empty(self, key: Key) -> None:
        if self.store.forget_if_empty(key):
            self.shard_groups.forget_version(key[0], key[1])

    def report_bad_delta(self, req: msg.DeltaReport) -> msg.DeltaReportAck:
        """Books a reader's report that a delta does not build its version (``delta_rules.py``)."""
        with self._lock:
            job = self.registry.require(req.worker).job
            key = (req.model, req.version, req.layout)
            if self.store.get(key) is None:
                raise VersionNotFound(f"no delta {req.layout!r} of {req.model!r} v{req.version} to report")
            owner_job = job if self.owners.owns(req.model, req.worker, job) else ""
            quarantined = report_bad_delta(self.quarantine, key, req.worker, job, owner_job, self._clock())
            logger.error("reader %s found the delta %s of %s v%d does not build the version (%s)%s", req.worker,
                         req.layout, req.model, req.version, req.reason[:200],
                         "; withholding it from every reader" if quarantined else "")
            return msg.DeltaReportAck(quarantined=quarantined)

    def flip_report(self, req: msg.FlipReport) -> msg.FlipReply:
        """Books a rollout replica's report for the fleet flip and answers whether it flips (``flips.py``)."""
        with self._lock:
            self.registry.require(req.worker)
            return self.flips.report(req, frozenset(self.versions(req.model)))

    # ------------------------------------------------------------------------------------ queries
    def manifest(self, model: str, version: int | str, layout: str) -> Manifest:
        with self._lock:
            resolved = self.resolve(model, version, layout)
            check_delta_listed(self.quarantine, (model, resolved, layout), self._clock())
            return self.store.get((model, resolved, layout)).manifest

    def resolve(self, model: str, version: int | str, layout: str) -> int:
        """Resolves "latest" once; a version counts only when a holder of it in ``layout`` is active."""
        with self._lock:
            store = self.store
            if version == "latest":
                active = [k[1] for k, r in store.records_of(model) if k[2] == layout and store.visible(r)]
                if not active:
                    raise VersionNotFound(f"model {model!r} has no published version in layout {layout!r}")
                return max(active)
            record = store.get((model, int(version), layout))
            if record is None or not store.visible(record):
                known = sorted(store.visible_versions(model))
                raise VersionNotFound(f"version {version} of {model!r} in layout {layout!r} is not published; "
                                      f"published versions: {known or 'none'}")
            return int(version)

    def versions(self, model: str, layout: str | None = None) -> dict[int, list[str]]:
        with self._lock:
            result: dict[int, list[str]] = defaultdict(list)
            for (m, v, lay), record in self.store.records_of(model):
                if layout is not None and lay != layout:
                    continue
                holders = [h.worker for h in record.holdings.values() if h.state == HoldingState.ACTIVE]
                if holders and self.store.visible(record):
                    result[v].extend(w for w in holders if w not in result[v])
            return {v: sorted(ws) for v, ws in sorted(result.items())}

    def status(self) -> msg.StatusReply:
        with self._lock:
            return status_reply(self.instance, self.registry, self.store, self.leases, self.quarantine,
                                self._clock(), sweeps=self.sweeps).model_copy(update={"flips": self.flips.status()})

    def metrics_snapshot(self) -> dict:
        with self._lock:
            return metrics_snapshot(self.registry, self.store, self.leases, self.quarantine, self.fetch_times,
                                    self.reads.delta_bytes)


def _check_holder(worker: str, holder: str) -> None:
    if holder != worker and not holder.startswith(worker + msg.HOLDER_SEPARATOR):
        raise NotOwner(f"worker {worker!r} may act only for holders named {worker!r} or "
                       f"'{worker}{msg.HOLDER_SEPARATOR}<suffix>', not {holder!r}")
