"""The read path's glue: plans a reader's next reads over the parts that know the sources (registry, leases,
quarantine, the version's chunk index), issues their leases and grants, and books the reads it reports.

``ReadDesk`` owns no state of its own: it holds the parts it reads and calls only their public methods. The
facade calls it under the hub lock.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import AbstractSet, Callable, Iterator

from tensorhub_verl.errors import NotOwner
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.delta_form import is_delta_layout
from tensorhub_verl.ros.hub.changes import Wake
from tensorhub_verl.ros.hub.chunk_index import candidate_stride, candidates_for
from tensorhub_verl.ros.hub.leases import Leases
from tensorhub_verl.ros.hub.preserve import last_vouched_copy
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.records import Holding, Key, VersionRecord, WorkerRecord
from tensorhub_verl.ros.hub.registry import Registry
from tensorhub_verl.ros.hub.intervals import first_held, first_missing
from tensorhub_verl.ros.hub.lease_book import Lease, ReaderRuns
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.hub.planner import (HolderView, PlannerConfig, SwarmView, holder_hash, plan_chunks,
                                            reader_request, reader_salt)
from tensorhub_verl.ros.wire.topology import Distance, Location

logger = logging.getLogger("tensorhub_verl.ros.hub")


class ReadDesk:
    def __init__(self, registry: Registry, leases: Leases, quarantine: Quarantine, planner: PlannerConfig,
                 lease_ttl_s: float, nixl_within_job: bool, retained: Callable[[str], list[int]] = lambda m: []):
        self.registry, self.leases, self.quarantine = registry, leases, quarantine
        self.delta_bytes: dict[str, int] = {}
        """model -> bytes of its delta forms read by readers (``delta_form.py``), over the hub's life."""
        self.planner, self.lease_ttl_s, self.nixl_within_job = planner, lease_ttl_s, nixl_within_job
        self.retained = retained
        """model -> its versions inside the retention window (``Retention.retained``)."""

    def may_get_metadata(self, reader_job: str, source: WorkerRecord) -> bool:
        """Whether a reader of ``reader_job`` may be planned on ``source``, which hands it its data-plane metadata
        with the lease. A plane that checks a grant on every read (TCP) serves anyone the hub leases; NIXL
        metadata is a capability over the holder's memory, so it goes only to the holder's own job (the
        allow-list), unless ``HubConfig.nixl_within_job`` is off."""
        return bool(source.grant_key) or source.job == reader_job or not self.nixl_within_job

    def check_some_holder_serves(self, reader: str, record: VersionRecord) -> None:
        """A fetch whose every possible source is another job's NIXL holder would starve: refuse it at once."""
        reader_job = self.registry.require(reader).job
        sources = [w for h in record.holdings.values()
                   if h.worker != reader and (w := self.registry.get(h.worker)) is not None]
        if sources and not any(self.may_get_metadata(reader_job, w) for w in sources):
            m = record.manifest
            raise NotOwner(f"{m.model} v{m.version} ({m.layout}) is held only by workers of job(s) "
                           f"{sorted({w.job for w in sources})} on NIXL, whose metadata (a capability to read and "
                           f"write their memory) goes only to workers of their own job; worker {reader!r} is in job "
                           f"{reader_job!r}. Connect with that job's key (ClientConfig.job_key), or have a holder "
                           f"serve on the TCP plane (transport='tcp'), or start the hub with "
                           f"HubConfig(nixl_within_job=False) where every job is trusted")

    def waits_for_work(self, key: Key, record: VersionRecord, holding: Holding) -> bool:
        """A filling reader with no read of this version in flight that still needs chunks."""
        return not self.leases.book.of_reader(holding.holder, key) and not holding.complete(len(record.chunks))

    def plan(self, key: Key, record: VersionRecord, holding: Holding, location: Location, want: int,
             run_chunks: int, now: float):
        """One reader's next reads, in O(want + complete holders + the candidate chunks' holders): the lease book
        and the chunk index answer what walks of every lease, holding and chunk once did."""
        book = self.leases.book
        own = book.of_reader(holding.holder, key)
        mine = book.chunks_of(holding.holder, key)
        own_inflight = Counter(lease.source for lease in own)
        own_wan = sum(lease.distance == Distance.WAN for lease in own)
        views: dict[str, HolderView | None] = {}
        suspects: set[str] = set()
        reader_job = self.registry.require(holding.worker).job

        def view_of(name: str) -> HolderView | None:
            """A holder's view, built the first time this plan meets it; None: it serves nothing now."""
            if name not in views:
                h = record.holdings.get(name)
                worker = self.registry.get(h.worker) if h is not None else None
                views[name] = None
                # Never another holding of the reader's own worker (its CPU archive, ``~cpu``): a read goes through
                # the data plane to a peer, and NIXL refuses an agent's own metadata.
                if worker is not None and h.state not in ("draining", "pending", "held") \
                        and h.worker != holding.worker and self.may_get_metadata(reader_job, worker) \
                        and not self.quarantine.excluded(key, name, holding.worker, reader_job, now):
                    # A ranged reader's partly read chunks are never served (the index leaves them out too).
                    chunks = h.chunks - h.unserved if h.chunks is not None and h.unserved else h.chunks
                    views[name] = HolderView(name, worker.location, chunks, book.reads_from(key, name),
                                             h.served_bytes, published=h.state == "active")
                    if self.quarantine.suspect(h.worker, now):
                        suspects.add(name)
            return views[name]

        def serving(names) -> list[HolderView]:
            return [v for n in names if (v := view_of(n)) is not None and n not in suspects]

        limit, salt = self.planner.max_partial_sources, reader_salt(holding.holder)
        ranked: dict[Distance, list[str]] = {}

        def in_order(tier: Distance, names_there: AbstractSet[str]) -> Iterator[str]:
            """``names_there`` (holders at ``tier`` from the reader) in the planner's order among equally near
            holders (``nearest_partial``), lazily: the place's holders are ranked once per plan, and each stretch
            walks that ranking only as far as it takes, not a sort of the place's holders per stretch."""
            if tier not in ranked:
                ranked[tier] = sorted(record.index.at_place(location, tier), key=lambda n: (holder_hash(n) ^ salt, n))
            return (n for n in ranked[tier] if n in names_there)

        def nearest(names) -> list[HolderView]:
            """The serving holders among ``names``, a place at a time from the reader's node outwards, until the
            planner's ``max_partial_sources`` nearest are surely among them (it picks those): a plan's work per
            chunk is bounded by a rack's holders, not the version's."""
            if limit is None or len(names) <= limit:
                return serving(names)
            found: list[HolderView] = []
            for tier, names_there in record.index.near_first(names, location):
                if tier < Distance.WAN and len(names_there) > limit - len(found):
                    # one distance: the planner's order among them, so views are built for the first few only
                    names_there = in_order(tier, names_there)
                for name in names_there:
                    v = view_of(name)
                    # counted as the planner keeps them: not the reader, only published ones for the naive baseline
                    if v is not None and name not in suspects and name != holding.holder \
                            and (self.planner.cooperative or v.published):
                        found.append(v)
                        if len(found) >= limit and tier < Distance.WAN:
                            return found
            return found

        pulling, wan = book.pulling(key), book.wan_pulling(key)
        def stretch(chunk: int) -> tuple[list[HolderView], int]:
            names, end = record.index.stretch(chunk)
            return nearest(names), end

        view = SwarmView(serving(record.index.complete), pulling, wan,
                         partial_holders=lambda chunk: nearest(record.index.holders_of(chunk)),
                         partial_stretch=stretch,
                         nearer_holders=lambda here, distance: serving(record.index.nearer(here, distance)))

        def everyone() -> SwarmView:
            """The candidates' holders, suspects too: a suspect may recover, so a chunk only it has is servable."""
            names = set(record.index.complete).union(*(record.index.holders_of(c) for c in needed))
            return SwarmView([v for n in sorted(names) if (v := view_of(n)) is not None], pulling, wan)

        cursor = record.index.cursor(holding.holder)
        stride = candidate_stride(want, run_chunks)
        index = record.index
        # Candidates for runs sit up to ``stride`` apart, and at every change of holders between (a nearer or
        # another source starts there): a plan then finds ``want`` runs, not the one that covers them all.
        skip_to = (lambda c: min(c + stride, index.stretch(c)[1])) if stride > 1 else None
        needed = cursor.candidates(holding.chunks, mine, candidates_for(want), skip_to)
        filling = record.index.filling()
        seeds = [s for s in record.seeds[location.dc] if s in record.holdings]
        request, record.seeds[location.dc] = reader_request(
            holding.holder, location, needed, want, seeds=seeds, filling=filling, own_inflight=own_inflight,
            own_wan_reads=own_wan, config=self.planner, run_chunks=run_chunks,
            needs=_needs(holding, len(record.chunks), mine), needs_until=_needs_until(holding, len(record.chunks), mine),
            held=len(holding.chunks))  # rule 5's first reads
        assignments = plan_chunks(request, view, self.planner)
        if len(assignments) < want:
            cursor.move_on()  # these candidates are busy or far: the next plan looks at the next ones
        return assignments, everyone, needed

    def lease(self, req: msg.Exchange, key: Key, record: VersionRecord, holding: Holding, location: Location,
              assignments, revoked: set[int], unservable_now, ids: Iterator[int], now: float) -> msg.ExchangeReply:
        """Books a lease for each assignment and builds the reply: a holder's data-plane metadata and addresses go
        only to a reader it now has a lease to serve, and only the addresses of the tensors those leases read;
        the metadata only once per generation. The reply is built from the hub's own checked state, every field
        given with its type, so it is constructed without validation (``model_construct``): the client validates
        it from the JSON."""
        replies, sources, tensors = [], {}, defaultdict(set)
        for a in assignments:
            end = a.chunk + a.count
            lease = Lease(next(ids), key, req.holder, location, a.source, a.chunk,
                          record.spans.nbytes(a.chunk, end), a.distance, now + self.lease_ttl_s, a.count)
            self.leases.book.add(lease)
            replies.append(msg.AssignmentMsg.model_construct(
                lease=lease.id, chunk=a.chunk, count=a.count, source=a.source, distance=int(a.distance),
                grant=self.grant(record, lease)))
            tensors[a.source].update(record.spans.tensors(a.chunk, end))
        for holder_name, needed_tensors in tensors.items():
            source = record.holdings[holder_name]
            worker = self.registry.require(source.worker)
            fresh = req.known_sources.get(holder_name) != source.generation
            sources[holder_name] = msg.SourceInfo.model_construct(
                holder=holder_name, worker=source.worker, generation=source.generation,
                agent_name=worker.agent_name, agent_metadata_b64=worker.agent_metadata_b64 if fresh else "",
                regions={t: source.regions[t] for t in sorted(needed_tensors)}, partial=source.state == "filling")
        return msg.ExchangeReply.model_construct(
            assignments=replies, sources=list(sources.values()), revoked=sorted(revoked), have=len(holding.chunks),
            total=len(record.chunks), unservable=[] if assignments else unservable_now())

    def grant(self, record: VersionRecord, lease: Lease) -> str:
        """The signed grant for exactly the bytes this lease reads, when its source's data plane checks one."""
        source = record.holdings[lease.source]
        key = self.registry.require(source.worker).grant_key
        if not key:
            return ""
        # A row shard's region starts at byte ``offset`` of its tensor (the fetcher's ``remote_address``).
        ranges = grants.run_ranges([
            [(source.regions[seg.tensor].addr + seg.offset - source.regions[seg.tensor].offset, seg.length)
             for seg in record.chunks[chunk].segments] for chunk in lease.chunks])
        return grants.sign(key, lease.id, grants.expiry_ms(self.lease_ttl_s), ranges)

    def settle(self, req: msg.Exchange, record: VersionRecord, holding: Holding,
               now: float) -> tuple[set[int], list[Lease]]:
        """Books the reader's finished and failed reads; returns the leases it must redo, and the leases whose
        reads landed whole (each freed a slot of its source and made the reader a source of its chunks)."""
        book = self.leases.book
        revoked, landed = set(), []
        past = self.leases.take_revoked(req.holder)
        for lease_id in req.completed:
            lease = book.get(lease_id)
            if lease is None and lease_id in holding.settled:
                continue  # booked by the first try of a repeated exchange
            if lease is None or lease.reader != req.holder:
                revoked.add(lease_id)  # revoked, or issued by a hub that has since restarted: read again
                past.discard(lease_id)
                continue
            book.pop(lease_id)
            holding.settled.add(lease_id)
            self._land(record, holding, lease, lease.chunks)
            landed.append(lease)
        for failure in req.failed:
            lease = book.get(failure.lease)
            if lease is None or lease.reader != req.holder:
                if failure.landed:
                    revoked.add(failure.lease)  # the run's landed chunks are not booked: read them again
                    past.discard(failure.lease)
                continue
            book.pop(failure.lease)
            if failure.landed:  # the part of a run that did land
                self._land(record, holding, lease, sorted(set(failure.landed) & set(lease.chunks)))
            source = record.holdings.get(lease.source)
            if source is not None and failure.corrupt:
                self._report_corrupt(req.worker, lease, record, source, now)
            if source is not None:
                self.quarantine.read_failed(source.worker, now)
                logger.warning("read of chunk %d from %s failed (%s); re-planning", lease.chunk, lease.source,
                               failure.reason[:200])
        # Leases revoked since the last exchange (deadline passed, or their source was dropped): the reader
        # abandons those reads if still in flight and the chunks are planned again.
        revoked |= past
        past.clear()
        return revoked, landed

    def wake_for(self, key: Key, record: VersionRecord, reporter: Holding,
                 landed: list[Lease]) -> tuple[Wake, int]:
        """Which parked readers of ``key`` the reads ``landed`` may give work to, in what order, and at most how
        many: each landed lease freed a slot of its source, and the reporter now serves those chunks with a
        source's ``max_inflight_per_source`` slots. A reader that lacks one of those chunks may read it from the
        reporter, the nearer the likelier (rules 1-2: it waits for a nearer reader's pull, then reads from it);
        one that lacks none may still use a freed slot of a source that holds every chunk; a ranged reader
        (``need``) always looks."""
        ranges = [(lease.chunk, lease.chunk + lease.count) for lease in landed]
        complete_freed = any((source := record.holdings.get(lease.source)) is not None and source.chunks is None
                             for lease in landed)
        here = self.registry.get(reporter.worker)
        far = int(Distance.WAN) + 1

        def rank(holder: str) -> int | None:
            h = record.holdings.get(holder)
            if h is None or h.chunks is None or h.need is not None:
                return 0
            if any(first_missing(h.chunks, start, end) < end for start, end in ranges):
                worker = self.registry.get(h.worker)
                return int(here.location.distance(worker.location)) if here and worker else 0
            return far if complete_freed else None
        return Wake(key, rank), len(landed) + self.planner.max_inflight_per_source

    def _land(self, record: VersionRecord, holding: Holding, lease: Lease, chunks) -> None:
        """Books chunks of ``lease`` as landed: the reader holds them (and serves the whole ones)."""
        holding.chunks.update(chunks)
        record.index.add(holding.holder, (c for c in chunks if c not in holding.unserved) if holding.unserved
                         else chunks)
        nbytes = lease.nbytes if len(chunks) == lease.count else sum(record.spans.nbytes(c, c + 1) for c in chunks)
        if is_delta_layout(lease.key[2]):
            self.delta_bytes[lease.key[0]] = self.delta_bytes.get(lease.key[0], 0) + nbytes
        source = record.holdings.get(lease.source)
        if source is not None:
            source.served_bytes += nbytes
            worker = self.registry.get(source.worker)
            if worker is not None:
                worker.bytes_served += nbytes
                worker.served_at_metadata += nbytes

    def _report_corrupt(self, reader: str, lease: Lease, record: VersionRecord, source: Holding,
                        now: float) -> None:
        """The reporter reads that chunk elsewhere and is never planned on that copy again; the copy is
        quarantined for everyone only on its own job's word, and never when it is the last complete vouched
        copy of a retained version (corruption.py)."""
        reader_job = self.registry.require(reader).job
        holder_worker = self.registry.get(source.worker)
        holder_job = holder_worker.job if holder_worker is not None else ""
        protected = lease.key[1] in self.retained(lease.key[0]) and last_vouched_copy(record, source,
                                                                                      self.quarantine, now)
        quarantined = self.quarantine.report_corrupt(lease.key, lease.source, source.worker, holder_job, reader,
                                                     reader_job, protected, now)
        outcome = f"quarantining that copy of {lease.key} for {self.quarantine.quarantine_s:.0f} s" if quarantined \
            else "that reader reads it elsewhere" if reader_job == holder_job else \
            f"job {reader_job!r} (not the copy's) reads it elsewhere"
        logger.error("reader %s found chunk %d from %s (worker %s) corrupt; %s%s", reader, lease.chunk,
                     lease.source, source.worker, outcome,
                     " (the last vouched copy of a retained version: reports alone never quarantine it)"
                     if protected else "")


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
