"""The hub's live leases, indexed by every question that planning, settling and draining ask of them.

A lease is one read of one chunk, or of a run of consecutive chunks, from one holding. The hub asks, for one
version: how many reads each source serves now, which readers pull each chunk (and from where), which chunks
cross the WAN into each datacenter, and which leases (and chunks) one reader holds; and, for all versions,
which leases are past their deadline. Each answer is kept up to date as leases come and go, so that none of
them walks every lease of the hub: the cost of one exchange does not grow with the leases (nor the chunks) of
the version. A run lease is booked as one interval wherever a lease of one chunk is (``intervals.py``): its
cost does not grow with the run's length.

No I/O and no lock: ``HubState`` owns one and calls it under its lock.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Iterator, Mapping

from tensorhub_verl.ros.hub.chunk_index import places
from tensorhub_verl.ros.hub.intervals import Coverage
from tensorhub_verl.ros.hub.planner import PullCounts
from tensorhub_verl.ros.wire.topology import Distance, Location

Key = tuple[str, int, str]  # (model, version, layout)
_NO_RUNS: dict[int, tuple[int, int]] = {}
_NOBODY = (0, 0, 0, 0)


@dataclass(slots=True)
class Lease:
    id: int
    key: Key
    reader: str
    reader_location: Location
    source: str
    chunk: int
    nbytes: int
    distance: Distance
    deadline: float
    count: int = 1
    """Chunks [chunk, chunk + count): a run, one read in flight on its source."""

    @property
    def chunks(self) -> range:
        return range(self.chunk, self.chunk + self.count)


class PullIndex(PullCounts):
    """The chunks of one version that readers pull now, counted per place: every reader, per datacenter, per
    rack, per node. The planner asks how far each pulling reader is from one chunk (rules 2-3) and, to extend a
    run, the first chunk a reader nearer than its source pulls: both by bisection, whatever the runs' lengths."""

    __slots__ = ("_all", "_places", "leases")

    def __init__(self) -> None:
        self._all = Coverage()
        self._places: dict[tuple[str, ...], Coverage] = {}
        self.leases = 0

    def add(self, start: int, end: int, where: Location, delta: int = 1) -> None:
        self._all.add(start, end, delta)
        for place in places(where):
            coverage = self._places.setdefault(place, Coverage())
            coverage.add(start, end, delta)
            if not coverage:
                del self._places[place]
        self.leases += delta

    def distances(self, here: Location, chunk: int) -> tuple[int, int, int, int]:
        """How many readers pull ``chunk``, by their distance from ``here`` (indexed by ``Distance``)."""
        total = self._all.count(chunk)
        if not total:
            return _NOBODY
        dc_place, rack_place, node_place = places(here)
        dc = self._count(dc_place, chunk)
        rack = self._count(rack_place, chunk) if dc else 0  # a place inside one nobody there pulls from counts 0
        node = self._count(node_place, chunk) if rack else 0
        return node, rack - node, dc - rack, total - dc

    def pulled(self, chunk: int) -> bool:
        return self._all.count(chunk) > 0

    def first_nearer(self, here: Location, distance: Distance, start: int, end: int) -> int:
        """The first chunk in [start, end) that a reader nearer to ``here`` than ``distance`` pulls; ``end`` if none."""
        if distance == Distance.SAME_NODE:
            return end
        coverage = self._places.get(places(here)[Distance.WAN - distance])  # WAN: same dc; ...; rack: same node
        return end if coverage is None else coverage.first_in(start, end)

    def chunks(self) -> set[int]:
        """Every chunk pulled now (for tests: O(chunks pulled))."""
        return self._all.covered()

    def _count(self, place: tuple[str, ...], chunk: int) -> int:
        coverage = self._places.get(place)
        return 0 if coverage is None else coverage.count(chunk)


class ReaderRuns(AbstractSet[int]):
    """The chunks one reader's leases of one version read, as their runs (a reader holds at most its window of
    leases, so a walk of them is short). A live view: read it, do not keep it."""

    __slots__ = ("_runs",)

    def __init__(self, runs: Mapping[int, tuple[int, int]]):
        self._runs = runs

    def __contains__(self, chunk: object) -> bool:
        for start, end in self._runs.values():
            if start <= chunk < end:  # type: ignore[operator]
                return True
        return False

    def __iter__(self) -> Iterator[int]:
        return iter({c for start, end in self._runs.values() for c in range(start, end)})

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def first_in(self, start: int, end: int) -> int:
        """The first chunk in [start, end) these leases read; ``end`` when none."""
        return min((max(start, s) for s, e in self._runs.values() if s < end and e > start), default=end)

    def run_end(self, chunk: int) -> int:
        """The end of a lease's run that reads ``chunk`` (``chunk`` itself when none does)."""
        return max((e for s, e in self._runs.values() if s <= chunk < e), default=chunk)


class LeaseBook:
    def __init__(self) -> None:
        self._by_id: dict[int, Lease] = {}
        self._deadlines: list[tuple[float, int]] = []
        """(deadline, lease id) heap; ids of leases already gone are skipped when they surface."""
        self._by_reader: dict[str, dict[int, Lease]] = {}
        self._reader_runs: dict[tuple[str, Key], dict[int, tuple[int, int]]] = {}
        """(reader, version) -> lease id -> the chunks [start, end) it reads."""
        self._by_source: Counter[tuple[Key, str]] = Counter()
        self._pulling: dict[Key, PullIndex] = {}
        self._wan: dict[Key, dict[str, Coverage]] = {}
        """version -> datacenter -> chunks crossing the WAN into it (a count per chunk)."""

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, lease_id: int) -> Lease | None:
        return self._by_id.get(lease_id)

    def all(self) -> list[Lease]:
        return list(self._by_id.values())

    def add(self, lease: Lease) -> None:
        self._by_id[lease.id] = lease
        heapq.heappush(self._deadlines, (lease.deadline, lease.id))
        self._by_reader.setdefault(lease.reader, {})[lease.id] = lease
        end = lease.chunk + lease.count
        self._reader_runs.setdefault((lease.reader, lease.key), {})[lease.id] = (lease.chunk, end)
        self._by_source[(lease.key, lease.source)] += 1
        self._pulling.setdefault(lease.key, PullIndex()).add(lease.chunk, end, lease.reader_location)
        if lease.distance == Distance.WAN:
            crossing = self._wan.setdefault(lease.key, {}).setdefault(lease.reader_location.dc, Coverage())
            crossing.add(lease.chunk, end)

    def pop(self, lease_id: int) -> Lease | None:
        lease = self._by_id.pop(lease_id, None)
        if lease is None:
            return None
        mine = self._by_reader[lease.reader]
        del mine[lease_id]
        if not mine:
            del self._by_reader[lease.reader]
        end = lease.chunk + lease.count
        reading = self._reader_runs[(lease.reader, lease.key)]
        del reading[lease_id]
        if not reading:
            del self._reader_runs[(lease.reader, lease.key)]
        source = (lease.key, lease.source)
        self._by_source[source] -= 1
        if not self._by_source[source]:
            del self._by_source[source]
        pulling = self._pulling[lease.key]
        pulling.add(lease.chunk, end, lease.reader_location, -1)
        if not pulling.leases:
            del self._pulling[lease.key]
        if lease.distance == Distance.WAN:
            dcs = self._wan[lease.key]
            crossing = dcs[lease.reader_location.dc]
            crossing.remove(lease.chunk, end)
            if not crossing:
                del dcs[lease.reader_location.dc]
                if not dcs:
                    del self._wan[lease.key]
        if len(self._deadlines) > 2 * len(self._by_id) + 64:  # drop the heap's entries of leases long gone
            self._deadlines = [(d, i) for d, i in self._deadlines if i in self._by_id]
            heapq.heapify(self._deadlines)
        return lease

    def overdue(self, now: float) -> list[Lease]:
        """Removes and returns the leases whose deadline passed (O(their number), not O(all leases))."""
        gone = []
        while self._deadlines and self._deadlines[0][0] < now:
            _, lease_id = heapq.heappop(self._deadlines)
            lease = self.pop(lease_id)
            if lease is not None:
                gone.append(lease)
        return gone

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease (None: no lease). Drops the heap's entries of leases already
        gone from its top, so a waiter never wakes for a lease that no longer exists."""
        while self._deadlines and self._deadlines[0][1] not in self._by_id:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def of_reader(self, reader: str, key: Key | None = None) -> list[Lease]:
        """The reader's leases (of one version when ``key`` is given): at most its window."""
        leases = self._by_reader.get(reader, {}).values()
        return list(leases) if key is None else [lease for lease in leases if lease.key == key]

    def chunks_of(self, reader: str, key: Key) -> ReaderRuns:
        """The chunks the reader's leases of version ``key`` read (a live view: read it, do not keep it)."""
        return ReaderRuns(self._reader_runs.get((reader, key), _NO_RUNS))

    def reads_from(self, key: Key, source: str) -> int:
        """Reads in flight from ``source``'s holding of version ``key`` (a run counts as one)."""
        return self._by_source.get((key, source), 0)

    def pulling(self, key: Key) -> PullIndex:
        """The chunks of version ``key`` pulled now, per place (a live view: read it, do not keep it)."""
        return self._pulling.get(key) or PullIndex()

    def wan_pulling(self, key: Key) -> Mapping[str, Coverage]:
        """datacenter -> chunks crossing the WAN into it now (a live view: read it, do not keep it)."""
        return self._wan.get(key, {})
