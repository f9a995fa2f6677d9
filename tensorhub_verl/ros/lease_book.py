"""The hub's live leases, indexed by every question that planning, settling and draining ask of them.

A lease is one read of one chunk, or of a run of consecutive chunks, from one holding. The hub asks, for one
version: how many reads each source serves now, which readers pull each chunk (and from where), which chunks
cross the WAN into each datacenter, and which leases (and chunks) one reader holds; and, for all versions,
which leases are past their deadline. Each answer is kept up to date as leases come and go, so that none of
them walks every lease of the hub: the cost of one exchange does not grow with the leases (nor the chunks) of
the version. A run lease enters each of its chunks (as pulled, and as its reader's): O(run) per lease.

No I/O and no lock: ``HubState`` owns one and calls it under its lock.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Iterator, Mapping, Sequence

from tensorhub_verl.ros.topology import Distance, Location

Key = tuple[str, int, str]  # (model, version, layout)
_NONE: frozenset[int] = frozenset()


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
    nbytes_of: tuple[int, ...] = ()
    """A run's bytes per chunk (``nbytes`` is their sum); empty for a lease of one chunk."""

    @property
    def chunks(self) -> range:
        return range(self.chunk, self.chunk + self.count)

    def bytes_of(self, chunk: int) -> int:
        return self.nbytes_of[chunk - self.chunk] if self.nbytes_of else self.nbytes


class _Pulling(Mapping[int, Sequence[Location]]):
    """chunk -> locations of the readers pulling it, as the planner reads ``SwarmView.pulling`` (a live view)."""

    def __init__(self, by_chunk: dict[int, dict[int, Location]]):
        self._by_chunk = by_chunk

    def __getitem__(self, chunk: int) -> Sequence[Location]:
        return list(self._by_chunk[chunk].values())

    def get(self, chunk: int, default=None):
        """Without the list ``[]`` builds: a run's extension asks this for every chunk it adds."""
        pulling = self._by_chunk.get(chunk)
        return default if pulling is None else pulling.values()

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_chunk)

    def __len__(self) -> int:
        return len(self._by_chunk)


class LeaseBook:
    def __init__(self) -> None:
        self._by_id: dict[int, Lease] = {}
        self._deadlines: list[tuple[float, int]] = []
        """(deadline, lease id) heap; ids of leases already gone are skipped when they surface."""
        self._by_reader: dict[str, dict[int, Lease]] = {}
        self._reader_chunks: dict[tuple[str, Key], Counter[int]] = {}
        """(reader, version) -> the chunks its leases read (a run's every chunk), with their leases' count."""
        self._by_source: Counter[tuple[Key, str]] = Counter()
        self._pulling: dict[Key, dict[int, dict[int, Location]]] = {}
        """version -> chunk -> lease id -> the reader's location."""
        self._wan: dict[Key, dict[str, Counter[int]]] = {}
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
        self._reader_chunks.setdefault((lease.reader, lease.key), Counter()).update(lease.chunks)
        self._by_source[(lease.key, lease.source)] += 1
        pulling = self._pulling.setdefault(lease.key, {})
        for chunk in lease.chunks:
            pulling.setdefault(chunk, {})[lease.id] = lease.reader_location
        if lease.distance == Distance.WAN:
            crossing = self._wan.setdefault(lease.key, {}).setdefault(lease.reader_location.dc, Counter())
            crossing.update(lease.chunks)

    def pop(self, lease_id: int) -> Lease | None:
        lease = self._by_id.pop(lease_id, None)
        if lease is None:
            return None
        mine = self._by_reader[lease.reader]
        del mine[lease_id]
        if not mine:
            del self._by_reader[lease.reader]
        reading = self._reader_chunks[(lease.reader, lease.key)]
        for chunk in lease.chunks:
            reading[chunk] -= 1
            if not reading[chunk]:
                del reading[chunk]
        if not reading:
            del self._reader_chunks[(lease.reader, lease.key)]
        source = (lease.key, lease.source)
        self._by_source[source] -= 1
        if not self._by_source[source]:
            del self._by_source[source]
        chunks = self._pulling[lease.key]
        for chunk in lease.chunks:
            del chunks[chunk][lease_id]
            if not chunks[chunk]:
                del chunks[chunk]
        if not chunks:
            del self._pulling[lease.key]
        if lease.distance == Distance.WAN:
            dcs = self._wan[lease.key]
            crossing = dcs[lease.reader_location.dc]
            for chunk in lease.chunks:
                crossing[chunk] -= 1
                if not crossing[chunk]:
                    del crossing[chunk]
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

    def of_reader(self, reader: str, key: Key | None = None) -> list[Lease]:
        """The reader's leases (of one version when ``key`` is given): at most its window."""
        leases = self._by_reader.get(reader, {}).values()
        return list(leases) if key is None else [lease for lease in leases if lease.key == key]

    def chunks_of(self, reader: str, key: Key) -> AbstractSet[int]:
        """The chunks the reader's leases of version ``key`` read (a live view: read it, do not keep it)."""
        reading = self._reader_chunks.get((reader, key))
        return _NONE if reading is None else reading.keys()

    def reads_from(self, key: Key, source: str) -> int:
        """Reads in flight from ``source``'s holding of version ``key`` (a run counts as one)."""
        return self._by_source.get((key, source), 0)

    def pulling(self, key: Key) -> Mapping[int, Sequence[Location]]:
        return _Pulling(self._pulling.get(key, {}))

    def wan_pulling(self, key: Key) -> Mapping[str, Counter[int]]:
        """datacenter -> chunks crossing the WAN into it now (a live view: read it, do not keep it)."""
        return self._wan.get(key, {})
