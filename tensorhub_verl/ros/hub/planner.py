"""Which holder serves which chunk of a read: a pure function of the swarm's state.

For every chunk the reader still needs, the planner looks at the holders that have it (complete
holders and readers that are still filling), and:

  1. prefers the nearest ones (node < rack < datacenter < WAN);
  2. waits instead of reaching farther when a reader nearer than every current holder is already
     pulling that chunk (it will be a nearer source in a moment: pipelined replication);
  3. waits when as many readers at that distance are pulling the chunk as there are holders of it
     there, so a chunk spreads through peers instead of everyone hitting its first holder;
  4. crosses the WAN only as one of its datacenter's seeds, and only for a chunk that is not already
     crossing into that datacenter: one WAN copy per chunk per datacenter. A seed holds at most
     ``wan_reads_per_seed`` WAN reads: it reads one at a time and keeps the others queued (see
     ``ClientConfig.wan_reads_posted``), so chunks cross one after another and each starts spreading
     through its datacenter as early as the WAN allows;
  5. a reader gets at most ``fair_share`` reads in flight from one source, when the hub sets it
     (readers filling at once share a holder's slots instead of the first one taking them all);
     a seed crossing the WAN is exempt. With ``first_complete_reads`` set, a reader that holds no chunk yet
     gets at most that many from one complete holder (``PlanRequest.complete_share``): the share counts the
     readers that have begun, so without it the first readers of a group that begins within milliseconds
     take every slot of the publisher (a window each) and the others wait for their peers' copies; with one
     each, every reader has a chunk of its own to trade when the first ones land;
  6. among the nearest holders with a free slot (fewer than ``max_inflight_per_source`` reads in flight,
     and within the reader's ``fair_share``) picks the least of the key (reads in flight, bytes of this
     version it has served, holder id): the fewest reads in flight first, then the least served, then the
     smallest id so that a plan is deterministic. (The naive baseline's key is (reads in flight, holder id).)
     A new read on a holder serving k reads gets 1/(k+1) of its link, and bytes served count only
     finished reads: ranking by bytes served first (as this rule once did) stacked reads up to the cap on the
     least-served holder while equally near holders had idle links. Simulated with the real planner:
     64 rollouts reading 64 chunks of 100 GB from a trainer of 64 nodes, each serving its shard, worst
     rollout 2.52 s instead of 2.78 s (the floor is 2.0 s); the lab workload (8 readers of 32 chunks
     from one trainer) is unchanged (3.62 vs 3.61 s), its trainer serving 1.09x the version instead
     of 1.03x.

A standby holder (a publisher's copy in a region fed by another region, ``messages.STANDBY_SUFFIX``) serves a chunk
only where no other holder as near has it: rules 3-6 leave it out otherwise, so a reader waits for a slot of the
relay or of its peers rather than reading from the publisher.

Chunks are visited starting at a reader-specific offset so that readers started together ask for
different chunks first and have something to trade.

A reader on a fast link asks for runs (``PlanRequest.run_chunks``): a chunk chosen by the rules above is
extended into a run of consecutive chunks read from the same source under one lease, while the next chunk is
needed by the reader, not already pulled by it nor taken by this plan, held by that source, and no nearer
holder or nearer reader pulling it exists (rules 1-2); a WAN run stops at a chunk already crossing into the
datacenter (rule 4). A run counts as one read in flight on its source (``max_inflight_per_source``, the fair
share and a seed's WAN reads count leases). Rule 3 applies to a run's first chunk only. With an index of the
swarm (``SwarmView.nearer_holders``, the hub's ``PullIndex`` and interval sets) a run's length is found by
bisection, where the next reason to stop is, instead of chunk by chunk: the same run either way.
"""

from __future__ import annotations

import functools
import heapq
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Mapping, Sequence

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.intervals import Coverage, first_held, first_missing
from tensorhub_verl.ros.wire.messages import STANDBY_SUFFIX
from tensorhub_verl.ros.wire.topology import Distance, Location


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    max_inflight_per_source: int = 8
    """Reads in flight that one source serves at once; more wait for a slot or go to another source."""
    seeds_per_dc: int = 1
    """Readers per datacenter that may pull across the WAN for one version."""
    wan_reads_per_seed: int = 3
    """WAN reads one seed holds at once: the one it is reading and the next two, queued on the reader so that
    the next starts the moment one lands, and the exchange that reports it and brings a new WAN lease has two
    chunks' WAN time, not one, to come back (with one, an answer slower than a chunk idled the WAN)."""
    first_complete_reads: int | None = None
    """Reads a reader that holds no chunk of the version yet may hold at once from one complete holder (rule 5;
    None: only the fair share). Off by default: in the network lab (8 readers of one trainer) 1 took the readers' wait for a first read from ~2 s to ~0.2 s summed, but their
    reads then shared links more and the total did not move."""
    cooperative: bool = True
    """False turns ROS into the naive baseline: only complete holders serve, and no reader waits for a
    nearer copy (rules 2-4 off). Benchmarks use it to compare on the same transport."""
    max_partial_sources: int | None = 8
    """Partial holders (readers still filling, row shards) a plan considers for one chunk: the nearest ones, ties
    broken in a reader-specific order so that readers spread over equally near holders (``nearest_partial``).
    Bounds a plan's work whatever the number of readers holding the chunk; rule 3 then lets at most this many
    readers at one distance pull a chunk at once. None: every partial holder."""

    def __post_init__(self) -> None:
        for name in ("max_inflight_per_source", "seeds_per_dc", "wan_reads_per_seed"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.first_complete_reads is not None and self.first_complete_reads < 1:
            raise ConfigError(f"first_complete_reads must be >= 1 or None, got {self.first_complete_reads}")
        if self.max_partial_sources is not None and self.max_partial_sources < 1:
            raise ConfigError(f"max_partial_sources must be >= 1 or None, got {self.max_partial_sources}")


@dataclass(frozen=True, slots=True)
class HolderView:
    holder: str
    location: Location
    chunks: frozenset[int] | None
    """Chunks it holds; None means all of them (a complete holder)."""
    inflight: int = 0
    served_bytes: int = 0
    published: bool = False
    """Holds ``chunks`` as a published row shard (an FSDP rank's rows); False with chunks: a reader still
    filling (pipelined replication)."""

    def has(self, chunk: int) -> bool:
        return self.chunks is None or chunk in self.chunks


@dataclass(frozen=True, slots=True)
class SwarmView:
    holders: Sequence[HolderView]
    pulling: "Mapping[int, Sequence[Location]] | PullCounts" = field(default_factory=dict)
    """chunk -> locations of the readers pulling it right now (the requesting reader excluded); or the hub's
    index of them per place (``lease_book.PullIndex``)."""
    wan_pulling: Mapping[str, AbstractSet[int] | Coverage] = field(default_factory=dict)
    """datacenter -> chunks crossing the WAN into it right now."""
    partial_holders: Callable[[int], Sequence[HolderView]] | None = None
    """chunk -> the partial holders (row shards, filling readers) that have it, from an index kept up to date
    (``chunk_index.ChunkIndex``); ``holders`` then need list only the complete holders. None: the partial
    holders are found by walking the chunks of every partial holder in ``holders``."""
    partial_stretch: Callable[[int], tuple[Sequence[HolderView], int]] | None = None
    """chunk -> (``partial_holders(chunk)``, the end of the stretch of chunks from it that have those same
    holders), from the same index: the candidates of a plan for runs are mostly consecutive chunks with the same
    holders, looked up once per stretch. None: ``partial_holders`` chunk by chunk."""
    nearer_holders: Callable[[Location, Distance], Sequence[HolderView]] | None = None
    """(reader's location, distance) -> every partial holder nearer to it than that: with it a run is extended by
    interval lookups (the holders' chunks, ``pulling`` and ``wan_pulling`` as interval sets answer "the first
    chunk in [a, b) held or pulled" by bisection). None: chunk by chunk."""


class PullCounts:
    """What the planner asks of an index of the chunks pulled now (``lease_book.PullIndex``)."""

    def distances(self, here: Location, chunk: int) -> Sequence[int]:
        """Readers pulling ``chunk``, counted by their distance from ``here`` (indexed by ``Distance``)."""
        raise NotImplementedError

    def pulled(self, chunk: int) -> bool:
        raise NotImplementedError

    def first_nearer(self, here: Location, distance: Distance, start: int, end: int) -> int:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class PlanRequest:
    reader: str
    location: Location
    needed: Sequence[int]
    """Chunks the reader lacks and is not pulling, in ascending order."""
    max_assignments: int
    may_cross_wan: bool = False
    """True for a seed of its datacenter."""
    own_inflight: Mapping[str, int] = field(default_factory=dict)
    """source -> this reader's reads in flight from it."""
    own_wan_reads: int = 0
    """This reader's reads crossing the WAN right now (posted or queued)."""
    fair_share: int | None = None
    """Most reads this reader may have in flight from one source (None: only the source's cap). With
    several readers filling at once it keeps the first one from taking all of a holder's slots."""
    complete_share: int | None = None
    """Most reads this reader may have in flight from one complete holder, below ``fair_share`` (None: the fair
    share alone); a seed crossing the WAN is exempt, as from the share."""
    run_chunks: int = 1
    """Most consecutive chunks one assignment may cover (a run, one lease)."""
    needs: Callable[[int], bool] | None = None
    """Whether the reader lacks a chunk and is not pulling it, for chunks past ``needed`` that a run may
    extend into (None: only the chunks in ``needed``)."""
    needs_until: Callable[[int, int], int] | None = None
    """The first chunk in [start, end) that ``needs`` refuses (``end`` when none): the same answer, by interval
    lookups (the hub's; None: ``needs`` asked chunk by chunk)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    chunk: int
    source: str
    distance: Distance
    count: int = 1
    """Chunks [chunk, chunk + count) from ``source``: a run."""


def reader_request(reader: str, location: Location, needed: Sequence[int], want: int, *, seeds: Sequence[str],
                   filling: int, own_inflight: Mapping[str, int], own_wan_reads: int, config: PlannerConfig,
                   fair_share: bool = True, run_chunks: int = 1, needs: Callable[[int], bool] | None = None,
                   needs_until: Callable[[int, int], int] | None = None,
                   held: int = 0) -> tuple[PlanRequest, list[str]]:
    """What the hub asks the planner for one reader, and its datacenter's ``seeds`` once it asked. The hub
    (``HubState._plan``) and the simulator (``sim.tensorhub``) both build their requests here.

    The first ``seeds_per_dc`` readers of a datacenter to ask become its seeds: the only ones that may cross
    the WAN (rule 4). ``filling``: readers of the version filling at once; with ``fair_share`` they share
    each source's ``max_inflight_per_source`` slots (rule 5); ``held``: chunks the reader holds (landed and
    reported), none yet caps its reads from a complete holder at ``first_complete_reads``."""
    seeds = list(seeds)
    if reader not in seeds and len(seeds) < config.seeds_per_dc:
        seeds.append(reader)
    share = max(1, config.max_inflight_per_source // max(1, filling)) if fair_share else None
    complete_share = config.first_complete_reads if held == 0 else None
    return PlanRequest(reader, location, needed, want, may_cross_wan=reader in seeds, own_inflight=own_inflight,
                       own_wan_reads=own_wan_reads, fair_share=share, complete_share=complete_share,
                       run_chunks=run_chunks, needs=needs, needs_until=needs_until), seeds


def plan_chunks(request: PlanRequest, view: SwarmView, config: PlannerConfig) -> list[Assignment]:
    inflight = _Inflight()
    own = Counter(request.own_inflight)
    holders = [h for h in view.holders if h.holder != request.reader]
    complete = [h for h in holders if h.chunks is None]
    order = _rotated(request.needed, request.reader)
    partial = _partial_holders(order, holders, view, request, config)
    wan_busy = _WanBusy(view.wan_pulling.get(request.location.dc))
    wan_room = config.wan_reads_per_seed - request.own_wan_reads if request.may_cross_wan else 0
    assignments: list[Assignment] = []
    runs = _Runs(request, view, partial, config) if request.run_chunks > 1 else None
    if config.cooperative:  # rarest first: the newest copies spread before chunks that many already hold
        order.sort(key=lambda c: len(partial.get(c, ())))  # complete holders have every chunk: no tie-breaker
    for chunk in order:
        if len(assignments) >= request.max_assignments:
            break
        if runs is not None and runs.took(chunk):
            continue  # read by a run this plan already made
        having = complete + partial.get(chunk, [])
        if not having:
            continue
        distance_of = {h.holder: request.location.distance(h.location) for h in having}
        nearest = min(distance_of.values())
        if not config.cooperative:
            best = min((h for h in having if distance_of[h.holder] == nearest),
                       key=lambda h: (inflight.of(h), h.holder))
            if inflight.of(best) < config.max_inflight_per_source:
                inflight.add(best)
                count = runs.extend(chunk, best, nearest, wan_busy) if runs is not None else 1
                assignments.append(Assignment(chunk, best.holder, nearest, count))
            continue
        pull_distances = _pull_distances(view.pulling, request.location, chunk)
        if any(pull_distances[:nearest]):
            continue  # rule 2
        nearest_holders = [h for h in having if distance_of[h.holder] == nearest]
        if any(h.holder.endswith(STANDBY_SUFFIX) for h in nearest_holders):  # only where nobody as near has it
            nearest_holders = [h for h in nearest_holders if not h.holder.endswith(STANDBY_SUFFIX)] or nearest_holders
        if pull_distances[nearest] >= len(nearest_holders):
            continue  # rule 3
        if nearest == Distance.WAN and (wan_room < 1 or wan_busy.has(chunk)):
            continue  # rule 4
        # Seeds are the only readers crossing the WAN, so they need no share: it would idle the WAN.
        share = None if nearest == Distance.WAN else request.fair_share
        cap = None if nearest == Distance.WAN else request.complete_share
        free = [h for h in nearest_holders if inflight.of(h) < config.max_inflight_per_source
                and (share is None or own[h.holder] < share)
                and (cap is None or h.chunks is not None or own[h.holder] < cap)]
        if not free:
            continue
        best = min(free, key=lambda h: (inflight.of(h), h.served_bytes, h.holder))  # rule 6
        inflight.add(best)
        own[best.holder] += 1
        count = runs.extend(chunk, best, nearest, wan_busy) if runs is not None else 1
        if nearest == Distance.WAN:
            wan_busy.add(chunk, chunk + count)
            wan_room -= 1
        assignments.append(Assignment(chunk, best.holder, nearest, count))
    return assignments


class _Runs:
    """Extends a planned chunk into a run of the chunks after it that the same source serves best."""

    __slots__ = ("_request", "_view", "_partial", "_config", "_needs", "_distance", "_taken")

    def __init__(self, request: PlanRequest, view: SwarmView, partial: dict[int, list[HolderView]],
                 config: PlannerConfig):
        self._request, self._view, self._partial, self._config = request, view, partial, config
        self._needs = request.needs or set(request.needed).__contains__
        self._distance: dict[str, Distance] = {}
        """holder -> its distance from the reader (a run meets the same few holders chunk after chunk)."""
        self._taken: list[tuple[int, int]] = []
        """The runs [start, end) this plan assigned (a run's chunks after its first are skipped when the plan
        reaches them)."""

    def took(self, chunk: int) -> bool:
        return any(start <= chunk < end for start, end in self._taken)

    def extend(self, chunk: int, source: HolderView, distance: Distance, wan_busy: "_WanBusy") -> int:
        """The run's length: ``chunk`` and the consecutive chunks after it that may join its lease."""
        if self._view.nearer_holders is not None:
            end = self._stop(chunk + 1, chunk + self._request.run_chunks, source, distance, wan_busy)
        else:
            end = chunk + 1
            while end < chunk + self._request.run_chunks and self._joins(end, source, distance, wan_busy):
                end += 1
        self._taken.append((chunk, end))
        return end - chunk

    def _joins(self, nxt: int, source: HolderView, distance: Distance, wan_busy: "_WanBusy") -> bool:
        """Whether chunk ``nxt`` may join the run (asked chunk by chunk)."""
        if self.took(nxt) or not self._needs(nxt) or not source.has(nxt):
            return False
        if distance == Distance.WAN and wan_busy.has(nxt):
            return False  # rule 4: crossing already
        # rules 1-2: a nearer copy serves it, or soon will
        return not (self._config.cooperative and distance > Distance.SAME_NODE and self._nearer(nxt, distance))

    def _stop(self, start: int, end: int, source: HolderView, distance: Distance, wan_busy: "_WanBusy") -> int:
        """The first chunk in [start, end) that may not join the run (``end`` when all may), by interval lookups:
        the earliest of each rule's first refusal is where ``_joins`` would first say no."""
        end = min((max(start, s) for s, e in self._taken if s < end and e > start), default=end)
        request = self._request
        end = request.needs_until(start, end) if request.needs_until is not None else \
            next((c for c in range(start, end) if not self._needs(c)), end)
        end = first_missing(source.chunks, start, end)
        if distance == Distance.WAN:
            end = wan_busy.first_in(start, end)  # rule 4
        if self._config.cooperative and distance > Distance.SAME_NODE and start < end:  # rules 1-2
            here = request.location
            pulling = self._view.pulling
            if isinstance(pulling, PullCounts):
                end = pulling.first_nearer(here, distance, start, end)
            else:
                end = next((c for c in range(start, end)
                            if any(here.distance(loc) < distance for loc in pulling.get(c, ()))), end)
            for h in self._view.nearer_holders(here, distance):
                if h.holder != request.reader and h.chunks is not None and start < end:
                    end = first_held(h.chunks, start, end)
        return max(start, end)

    def _nearer(self, chunk: int, distance: Distance) -> bool:
        """A partial holder other than the reader, or a reader pulling it, is nearer than ``distance`` (complete
        holders never are: the run's source is the nearest of them)."""
        here = self._request.location
        if any(_pull_distances(self._view.pulling, here, chunk)[:distance]):
            return True
        if chunk in self._partial or self._view.partial_holders is None:
            holders = self._partial.get(chunk, ())
        else:
            holders = self._view.partial_holders(chunk)
        known = self._distance
        for h in holders:
            d = known.get(h.holder)
            if d is None:
                d = known[h.holder] = here.distance(h.location)
            if d < distance and h.chunks is not None and h.holder != self._request.reader:
                return True
        return False


class _WanBusy:
    """The chunks crossing the WAN into the reader's datacenter: the view's, and the runs this plan adds."""

    __slots__ = ("_base", "_added")

    def __init__(self, base: AbstractSet[int] | Coverage | None):
        self._base = base if base is not None else frozenset()
        self._added: list[tuple[int, int]] = []

    def has(self, chunk: int) -> bool:
        base = self._base
        crossing = base.count(chunk) > 0 if isinstance(base, Coverage) else chunk in base
        return crossing or any(start <= chunk < end for start, end in self._added)

    def add(self, start: int, end: int) -> None:
        self._added.append((start, end))

    def first_in(self, start: int, end: int) -> int:
        end = first_held(self._base, start, end)
        return min((max(start, s) for s, e in self._added if s < end and e > start), default=end)


def _pull_distances(pulling, here: Location, chunk: int) -> Sequence[int]:
    """How many readers pull ``chunk`` now, by distance from ``here`` (indexed by ``Distance``)."""
    if isinstance(pulling, PullCounts):
        return pulling.distances(here, chunk)
    counts = [0, 0, 0, 0]
    for loc in pulling.get(chunk, ()):
        counts[here.distance(loc)] += 1
    return counts


class _Inflight:
    """Reads in flight per source: the view's count plus the reads this plan adds (a holder's view may come
    from ``SwarmView.partial_holders`` only, so no table of every holder is built up front)."""

    __slots__ = ("_added",)

    def __init__(self) -> None:
        self._added: Counter[str] = Counter()

    def of(self, h: HolderView) -> int:
        return h.inflight + self._added[h.holder]

    def add(self, h: HolderView) -> None:
        self._added[h.holder] += 1


def _partial_holders(order: Sequence[int], holders: Sequence[HolderView], view: SwarmView, request: PlanRequest,
                     config: PlannerConfig) -> dict[int, list[HolderView]]:
    """chunk -> its partial holders other than the reader (only published ones for the naive baseline), at most
    ``config.max_partial_sources`` of them, the nearest (``nearest_partial``)."""
    partial: dict[int, list[HolderView]] = defaultdict(list)
    reader, limit, ranks = request.reader, config.max_partial_sources, {}

    def keep(found):
        kept = [h for h in found if h.holder != reader and h.chunks is not None
                and (config.cooperative or h.published)]
        return kept if limit is None or len(kept) <= limit else nearest_partial(kept, request.location, reader,
                                                                                limit, ranks)
    if view.partial_stretch is not None:  # from the index, once per stretch of the same holders
        start = end = 0
        kept: list[HolderView] = []
        for chunk in order:
            if not start <= chunk < end:
                found, end = view.partial_stretch(chunk)
                start, kept = chunk, keep(found)
            partial[chunk] = kept  # one list for the stretch: the plan never changes it
        return partial
    if view.partial_holders is not None:  # from the index: only the chunks considered
        for chunk in order:
            partial[chunk] = keep(view.partial_holders(chunk))
        return partial
    for h in holders:
        if config.cooperative or h.published:  # the naive baseline reads only from published holders
            for chunk in h.chunks or ():
                partial[chunk].append(h)
    if limit is not None:
        for chunk, found in partial.items():
            partial[chunk] = keep(found)
    return partial


def nearest_partial(found: Sequence[HolderView], here: Location, reader: str, limit: int,
                    ranks: dict[str, tuple[int, int, str]] | None = None) -> list[HolderView]:
    """The ``limit`` holders of ``found`` nearest to ``here``; among equally near ones, those first in an order
    that depends on the reader (a hash of reader and holder), so that the readers of a rack spread over its
    holders instead of all taking the same few. Deterministic: the same choice whatever the order of ``found``.
    ``ranks``: a cache of each holder's rank for this reader (a plan meets the same holders chunk after chunk)."""
    ranks = {} if ranks is None else ranks
    salt = reader_salt(reader)

    def rank(h: HolderView) -> tuple[int, int, str]:
        r = ranks.get(h.holder)
        if r is None:
            r = ranks[h.holder] = (here.distance(h.location), holder_hash(h.holder) ^ salt, h.holder)
        return r
    return heapq.nsmallest(limit, found, key=rank)


@functools.lru_cache(maxsize=1 << 16)
def holder_hash(holder: str) -> int:
    """A holder's place in the reader-specific order of equally near holders (``nearest_partial``): XORed with
    ``reader_salt(reader)``, so the hub ranks a place's holders for a reader without hashing pairs."""
    return zlib.crc32(holder.encode())


def reader_salt(reader: str) -> int:
    return holder_hash("reader:" + reader)


def unservable(needed: Sequence[int], view: SwarmView, reader: str) -> list[int]:
    """Chunks no holder has and no reader is pulling: the read cannot complete."""
    pulling = view.pulling
    pulled = pulling.pulled if isinstance(pulling, PullCounts) else lambda c: bool(pulling.get(c))
    return [c for c in needed if not pulled(c) and not any(h.holder != reader and h.has(c) for h in view.holders)]


def _rotated(needed: Sequence[int], reader: str) -> list[int]:
    if not needed:
        return []
    start = zlib.crc32(reader.encode()) % len(needed)
    return list(needed[start:]) + list(needed[:start])
