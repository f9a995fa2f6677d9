"""Which partial holders serve each chunk of one version, and each filling reader's chunks still to read.

The planner needs, for the few chunks it considers for one reader, who holds each (row shards and readers
still filling; complete holders hold everything) and how rare it is. Rebuilding that from every holder's chunk
set on each exchange costs readers x chunks; here it is kept up to date as chunks land, and each reader's next
candidates come from a cursor over its chunks still to read, so one exchange looks at a bounded number of
chunks whatever the size of the version.

Chunks that land in runs of ``_BLOCK`` or more go into the holder's ``IntervalSet``, and the version's chunks
are cut in blocks of ``_BLOCK`` chunks, each listing the holders that hold all of it and those that hold a part
of it: a landed run of n chunks costs O(n / _BLOCK) set updates, not n. Chunks that land a few at a time (runs
off, or short runs) are filed per chunk as before: filed by block, scattered chunks would put every holder in
every block's partial list, and a lookup would bisect each of them. Who holds a chunk: its per-chunk holders,
its block's full holders, and those of the block's partial holders whose intervals hold it.

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
from typing import AbstractSet, Iterable, Protocol, Sequence

from tensorhub_verl.ros.intervals import IntervalSet
from tensorhub_verl.ros.topology import Distance, Location

_EMPTY: frozenset[str] = frozenset()
_BLOCK = 64
_MIN_CANDIDATES = 64
_CANDIDATES_PER_READ = 8


def candidates_for(want: int) -> int:
    """How many of a reader's chunks still to read one plan ranks for ``want`` reads: bounded whatever the size
    of the version, and enough that busy chunks rarely leave a reader short."""
    return max(_MIN_CANDIDATES, _CANDIDATES_PER_READ * want)


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
        start = zlib.crc32(reader.encode()) % len(wanted) if wanted else 0
        self._order = list(wanted[start:]) + list(wanted[:start])
        self._pos = 0
        self._walked = 0
        self._stale = 0
        """Entries of ``_order`` seen landed: compacted away once they are half of it (O(1) per chunk, amortized)."""

    def candidates(self, have: AbstractSet[int], busy: AbstractSet[int], limit: int) -> list[int]:
        """Up to ``limit`` chunks not in ``have`` (landed) nor ``busy`` (this reader's reads in flight), from the
        cursor on, wrapping around once at most."""
        if self._stale * 2 > len(self._order):
            self._compact(have)
        found: list[int] = []
        order, n = self._order, len(self._order)
        walked = 0
        runs = have.run_end if isinstance(have, IntervalSet) else None
        while walked < n and len(found) < limit:
            at = (self._pos + walked) % n
            chunk = order[at]
            if chunk in have:
                # A landed run: skip it whole where the order visits its chunks one after another.
                skip = _consecutive(order, at, min(runs(chunk) - chunk, n - at, n - walked)) if runs else 1
                walked += skip
                self._stale += skip
                continue
            walked += 1
            if chunk not in busy:
                found.append(chunk)
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
        self._holders: dict[int, set[str]] = {}
        """chunk -> partial holders (row shards, filling readers) that may serve it, filed a few at a time."""
        self._few: dict[str, list[int]] = {}
        """partial holder -> its chunks filed in ``_holders``."""
        self._held: dict[str, IntervalSet] = {}
        """partial holder -> its chunks filed by block (landed in long runs)."""
        self._full: dict[int, set[str]] = {}
        """block -> the partial holders holding every chunk of it."""
        self._part: dict[int, set[str]] = {}
        """block -> the partial holders holding some of its chunks, not all."""
        self._cursors: dict[str, NeedCursor] = {}
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
        added = chunks if isinstance(chunks, (range, IntervalSet)) else IntervalSet(chunks)
        few = None
        for start, end in _spans(added):
            if end - start >= _BLOCK:
                held = self._held.setdefault(holder, IntervalSet())
                held.add_range(start, end)
                self._refile(holder, held, range(start, end))
                continue
            few = self._few.setdefault(holder, []) if few is None else few
            few.extend(range(start, end))
            for chunk in range(start, end):
                self._holders.setdefault(chunk, set()).add(holder)

    def remove(self, holder: str, chunks: Iterable[int]) -> None:
        """``holder`` no longer serves ``chunks`` as a partial holder (it left, or now holds every chunk)."""
        gone = chunks if isinstance(chunks, (range, IntervalSet)) else IntervalSet(chunks)
        held = self._held.get(holder)
        if held is not None:
            for start, end in _spans(gone):
                held.remove_range(start, end)
            self._refile(holder, held, gone)
            if not held:
                del self._held[holder]
        few = self._few.get(holder)
        if few is not None:
            kept = []
            for chunk in few:
                if chunk not in gone:
                    kept.append(chunk)
                    continue
                holders = self._holders.get(chunk)
                if holders is not None:
                    holders.discard(holder)
                    if not holders:
                        del self._holders[chunk]
            if kept:
                self._few[holder] = kept
            else:
                del self._few[holder]

    def _refile(self, holder: str, held: IntervalSet, changed: range | IntervalSet) -> None:
        """Files ``holder`` under each block that ``changed`` touches: full, partial, or neither."""
        blocks = set()
        for start, end in _spans(changed):
            blocks.update(range(start // _BLOCK, (end - 1) // _BLOCK + 1))
        for block in blocks:
            start, end = block * _BLOCK, min((block + 1) * _BLOCK, self.total)
            full = held.run_end(start) >= end
            some = full or held.first_in(start, end) < end
            for table, member in ((self._full, full), (self._part, some and not full)):
                names = table.get(block)
                if member:
                    table.setdefault(block, set()).add(holder)
                elif names is not None:
                    names.discard(holder)
                    if not names:
                        del table[block]

    def holders_of(self, chunk: int) -> AbstractSet[str]:
        """The partial holders that may serve ``chunk`` (read it, do not keep it)."""
        few = self._holders.get(chunk, _EMPTY)
        if not self._held:
            return few
        block = chunk // _BLOCK
        full, part = self._full.get(block, _EMPTY), self._part.get(block)
        if part:
            held = self._held
            full = full | {h for h in part if held[h].holds(chunk)}
        return full | few if few and full else full or few

    def nearer(self, here: Location, distance: Distance) -> AbstractSet[str]:
        """The partial holders nearer to ``here`` than ``distance`` (entered with a location)."""
        if distance == Distance.SAME_NODE:
            return _EMPTY
        return self._places.get(places(here)[Distance.WAN - distance], _EMPTY)  # WAN: its dc; rack: its node

    def start_reader(self, reader: str, need: AbstractSet[int] | None) -> None:
        """A fetch begins: ``need`` its chunks (None: every chunk of the version)."""
        self._cursors[reader] = NeedCursor(reader, range(self.total) if need is None else sorted(need))

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


def _spans(chunks: range | IntervalSet) -> list[tuple[int, int]]:
    if isinstance(chunks, range):
        return [(chunks.start, chunks.stop)] if chunks else []
    return chunks.intervals()
