"""Which partial holders serve each chunk of one version, and each filling reader's chunks still to read.

The planner needs, for the few chunks it considers for one reader, who holds each (row shards and readers
still filling; complete holders hold everything) and how rare it is. Rebuilding that from every holder's chunk
set on each exchange costs readers x chunks; here it is kept up to date as chunks land, and each reader's next
candidates come from a cursor over its chunks still to read, so one exchange looks at a bounded number of
chunks whatever the size of the version.

Who holds each chunk is a step function (``intervals.StepSets``): the set of partial holders on each stretch of
chunks where it does not change. A landed run costs the stretches it spans, not its chunks; one lookup answers a
chunk's holders and where the stretch with those same holders ends, so a plan whose candidates are mostly
consecutive chunks looks holders up once per stretch (``stretch``), not once per chunk.

Partial holders are also listed by place (datacenter, rack, node): a run is extended by asking only the holders
nearer to its reader than its source where each first holds a chunk of the run (``nearer``), by bisection in
their interval sets, not chunk by chunk.

A reader's cursor visits its chunks from a reader-specific offset (readers started together ask for different
chunks first and have something to trade). The planner ranks each batch of candidates rarest first; when a
batch yields fewer reads than asked for (its chunks are busy or held only far away), the cursor moves on to the
next batch, and comes back to the skipped chunks on its next lap.

No I/O and no lock: each ``VersionRecord`` of ``HubState`` owns one, called under the hub's lock.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left
from typing import AbstractSet, Callable, Iterable, Iterator, Protocol, Sequence

from tensorhub_verl.ros.hub.intervals import IntervalSet, StepSets
from tensorhub_verl.ros.wire.topology import Distance, Location

_EMPTY: frozenset[str] = frozenset()
_MIN_CANDIDATES = 64
_CANDIDATES_PER_READ = 8


def candidates_for(want: int) -> int:
    """How many of a reader's chunks still to read one plan ranks for ``want`` reads: bounded whatever the size
    of the version, and enough that busy chunks rarely leave a reader short."""
    return max(_MIN_CANDIDATES, _CANDIDATES_PER_READ * want)


def candidate_stride(want: int, run_chunks: int) -> int:
    """How far apart a plan's candidates may sit inside a stretch of chunks with the same holders, for ``want``
    runs of up to ``run_chunks``: the candidates then span the chunks that ``want`` whole runs would read. A run
    started at one candidate covers the candidates after it up to its end, so consecutive candidates (stride 1)
    gave a plan for runs one or two leases, whatever the window; 1 without runs."""
    return max(1, run_chunks * want // candidates_for(want))


class IndexedHolding(Protocol):
    """What the index reads of a hub holding (``hub.records.Holding``)."""

    holder: str
    state: str
    chunks: AbstractSet[int] | None
    need: AbstractSet[int] | None
    unserved: AbstractSet[int]


class NeedCursor:
    """A filling reader's chunks not yet landed, in its visiting order; landed ones are dropped lazily."""

    __slots__ = ("_order", "_pos", "_walked", "_stale")

    def __init__(self, reader: str, wanted: Sequence[int]):
        # The order is ``wanted`` (sorted, never changed in place: readers of a whole version share one list)
        # visited from a reader-specific start, wrapping around: the rotation is the position, not a copy.
        self._order = wanted if isinstance(wanted, list) else list(wanted)
        self._pos = zlib.crc32(reader.encode()) % len(wanted) if wanted else 0
        self._walked = 0
        self._stale = 0
        """Entries of ``_order`` seen landed: compacted away once they are half of it (O(1) per chunk, amortized)."""

    def candidates(self, have: AbstractSet[int], busy: AbstractSet[int], limit: int,
                   skip_to: Callable[[int], int] | None = None) -> list[int]:
        """Up to ``limit`` chunks not in ``have`` (landed) nor ``busy`` (this reader's reads in flight), from the
        cursor on, wrapping around once at most. ``skip_to(c)``: the next chunk worth offering after candidate
        ``c`` (the chunks between are passed over where the order visits them one after another); None: each."""
        if self._stale * 2 > len(self._order):
            self._compact(have)
        found: list[int] = []
        order, n = self._order, len(self._order)
        walked = 0
        runs = have.run_end if isinstance(have, IntervalSet) else None
        busy_runs = getattr(busy, "run_end", None)
        while walked < n and len(found) < limit:
            at = (self._pos + walked) % n
            chunk = order[at]
            if chunk in have:
                # A landed run: skip it whole where the order visits its chunks one after another.
                skip = _consecutive(order, at, min(runs(chunk) - chunk, n - at, n - walked)) if runs else 1
                walked += skip
                self._stale += skip
                continue
            if chunk in busy:  # a run this reader reads now: skipped whole too
                walked += _consecutive(order, at, min(busy_runs(chunk) - chunk, n - at, n - walked)) \
                    if busy_runs else 1
                continue
            found.append(chunk)
            nxt = skip_to(chunk) if skip_to is not None else chunk + 1
            walked += _consecutive(order, at, min(nxt - chunk, n - at, n - walked)) if nxt > chunk + 1 else 1
        self._walked = walked
        return found

    def move_on(self) -> None:
        """The last candidates gave fewer reads than asked for: start the next search after them."""
        if self._order:
            self._pos = (self._pos + self._walked) % len(self._order)

    def _compact(self, have: AbstractSet[int]) -> None:
        n = len(self._order)
        head = self._order[self._pos:] + self._order[:self._pos] if n else []
        self._order = _without(head, have) if isinstance(have, IntervalSet) else [c for c in head if c not in have]
        self._pos, self._stale = 0, 0


def _without(order: list[int], have: IntervalSet) -> list[int]:
    """``order`` less the chunks in ``have``, a stretch at a time where ``order`` lists consecutive chunks (a
    landed run is one step, not one per chunk)."""
    kept: list[int] = []
    i, n = 0, len(order)
    while i < n:
        chunk = order[i]
        held = have.holds(chunk)
        end = have.run_end(chunk) if held else have.first_in(chunk, chunk + n - i)
        step = _consecutive(order, i, min(end - chunk, n - i))
        if not held:
            kept.extend(order[i:i + step])
        i += step
    return kept


def _consecutive(order: list[int], i: int, most: int) -> int:
    """How many entries of ``order`` from ``i`` on (1 to ``most``) are consecutive chunks, by bisection. ``order``
    is a sorted list rotated once (less what was compacted away), so "order[i + k] == order[i] + k" holds for a
    prefix of k and not after it: a gap only grows, and past the rotation every chunk is below ``order[i]``."""
    if most <= 1:
        return 1
    first = order[i]
    if order[i + most - 1] == first + most - 1:
        return most
    return bisect_left(range(most), True, key=lambda k: order[i + k] != first + k)


class ChunkIndex:
    def __init__(self, total: int):
        self.total = total
        self._steps = StepSets()
        """chunk -> the partial holders (row shards, filling readers) that may serve it, stretch by stretch."""
        self._cursors: dict[str, NeedCursor] = {}
        self._every: list[int] | None = None
        """Every chunk in order: the visiting order all readers of the whole version share (``NeedCursor``)."""
        self.complete: set[str] = set()
        """Holders of every chunk (in any state: the hub checks whether each may serve)."""
        self._places: dict[tuple[str, ...], set[str]] = {}
        """(dc,), (dc, rack), (dc, rack, node) -> the partial holders there."""
        self._place_of: dict[str, Location] = {}

    def enter(self, holding: IndexedHolding, location: Location | None = None) -> None:
        """A holding appears: its chunks serve (a ranged reader's partly read ones never do); a filling one reads.
        A partial holder's ``location`` lists it among the holders near a reader (``nearer``)."""
        if holding.chunks is None:
            self.complete.add(holding.holder)
        else:
            if location is not None:
                self._place_of[holding.holder] = location
                for place in places(location):
                    self._places.setdefault(place, set()).add(holding.holder)
            if holding.chunks:
                self.add(holding.holder, holding.chunks - holding.unserved if holding.unserved else holding.chunks)
        if holding.state == "filling":
            self.start_reader(holding.holder, holding.need)

    def leave(self, holding: IndexedHolding) -> None:
        """The holding serves no chunk as a partial holder any more (it left, or now holds every chunk)."""
        if holding.chunks:
            self.remove(holding.holder, holding.chunks)
        self.complete.discard(holding.holder)
        location = self._place_of.pop(holding.holder, None)
        if location is not None:
            for place in places(location):
                names = self._places[place]
                names.discard(holding.holder)
                if not names:
                    del self._places[place]
        self.end_reader(holding.holder)

    def add(self, holder: str, chunks: Iterable[int]) -> None:
        """``holder`` serves ``chunks`` as a partial holder (they landed, or it entered holding them)."""
        for start, end in _spans(chunks):
            self._steps.add(start, end, holder)

    def remove(self, holder: str, chunks: Iterable[int]) -> None:
        """``holder`` no longer serves ``chunks`` as a partial holder (it left, or now holds every chunk)."""
        for start, end in _spans(chunks):
            self._steps.remove(start, end, holder)

    def holders_of(self, chunk: int) -> AbstractSet[str]:
        """The partial holders that may serve ``chunk`` (read it, do not keep it)."""
        return self._steps.at(chunk)

    def stretch(self, chunk: int) -> tuple[AbstractSet[str], int]:
        """``holders_of(chunk)``, and the end of the stretch of chunks from ``chunk`` on that have exactly those
        partial holders (at most the version's end)."""
        holders, end = self._steps.step(chunk)
        return holders, self.total if end is None else min(end, self.total)

    def nearer(self, here: Location, distance: Distance) -> AbstractSet[str]:
        """The partial holders nearer to ``here`` than ``distance`` (entered with a location)."""
        if distance == Distance.SAME_NODE:
            return _EMPTY
        return self._places.get(places(here)[Distance.WAN - distance], _EMPTY)  # WAN: its dc; rack: its node

    def at_place(self, here: Location, distance: Distance) -> AbstractSet[str]:
        """The partial holders (entered with a location) on ``here``'s node (``SAME_NODE``), in its rack
        (``SAME_RACK``) or in its datacenter (``SAME_DC``): every name that ``near_first`` gives at that distance
        is among them."""
        return self._places.get(places(here)[Distance.SAME_DC - distance], _EMPTY)

    def near_first(self, names: AbstractSet[str], here: Location) -> Iterator[tuple[Distance, AbstractSet[str]]]:
        """``names`` (partial holders) split by distance from ``here``, nearest first, as (distance, names): those
        on its node, in the rest of its rack, in the rest of its datacenter, then the others at ``Distance.WAN``
        (other datacenters, and any entered with no location, whose distance is not known here). Set
        intersections: a part costs the smaller of the place's holders and ``names``; empty parts are left out."""
        seen: AbstractSet[str] = _EMPTY
        for distance, place in zip((Distance.SAME_NODE, Distance.SAME_RACK, Distance.SAME_DC), reversed(places(here))):
            there = names & self._places.get(place, _EMPTY)
            tier = there - seen if seen else there
            if tier:
                yield distance, tier
            seen = there
        rest = names - seen
        if rest:
            yield Distance.WAN, rest

    def start_reader(self, reader: str, need: AbstractSet[int] | None) -> None:
        """A fetch begins: ``need`` its chunks (None: every chunk of the version)."""
        if need is None and self._every is None:
            self._every = list(range(self.total))
        self._cursors[reader] = NeedCursor(reader, self._every if need is None else sorted(need))

    def end_reader(self, reader: str) -> None:
        self._cursors.pop(reader, None)

    def filling(self) -> int:
        """Readers filling now (each has a cursor from its begin to its end)."""
        return len(self._cursors)

    def cursor(self, reader: str) -> NeedCursor:
        """The reader's cursor; one with nothing to read once its fetch ended (an exchange that waited for work
        with the hub's lock released may find its fetch ended, or its worker dropped, meanwhile)."""
        return self._cursors.get(reader) or NeedCursor(reader, ())


def places(where: Location) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The datacenter, rack and node of ``where``, widest first (keys of the indexes kept per place)."""
    return (where.dc,), (where.dc, where.rack), (where.dc, where.rack, where.node)


def _spans(chunks: Iterable[int]) -> list[tuple[int, int]]:
    """``chunks`` as [start, end) stretches: a range or an IntervalSet as they are, anything else run by run."""
    if isinstance(chunks, range) and chunks.step == 1:
        return [(chunks.start, chunks.stop)] if chunks else []
    return (chunks if isinstance(chunks, IntervalSet) else IntervalSet(chunks)).intervals()
