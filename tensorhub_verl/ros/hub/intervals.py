"""Sets of chunk numbers kept as sorted intervals, so that a run of chunks costs one entry, not one per chunk.

A run lease covers up to 1,024 consecutive chunks and lands them all at once. The hub books it as one interval
wherever it once booked each chunk: a reader's holdings (``IntervalSet``), the chunks pulled by the readers of a
place (``Coverage``, which counts overlapping runs). Both answer "is chunk c in it" and "the first chunk in
[start, end) in it" by bisection, which is what extending a run needs: where the next reason to stop is.

Sorted Python lists with ``bisect`` (an insert moves the list's tail in C): the hub's sets hold tens of
intervals per reader, where a balanced tree would cost more per lookup than the moves it saves.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import MutableSet
from typing import AbstractSet, Iterable, Iterator


class IntervalSet(MutableSet[int]):
    """Non-negative integers as disjoint, non-adjacent intervals [start, end), sorted."""

    __slots__ = ("_starts", "_ends", "_size")

    def __init__(self, items: Iterable[int] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._size = 0
        self.update(items)

    @classmethod
    def _from_iterable(cls, items: Iterable[int]) -> "IntervalSet":
        return cls(items)

    def __contains__(self, x: object) -> bool:
        i = bisect_right(self._starts, x) - 1  # type: ignore[arg-type]
        return i >= 0 and x < self._ends[i]  # type: ignore[operator]

    def holds(self, x: int) -> bool:
        """``x in self`` for an int, without the ``in`` protocol's dispatch (the index asks it per candidate)."""
        i = bisect_right(self._starts, x) - 1
        return i >= 0 and x < self._ends[i]

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends):
            yield from range(start, end)

    def __repr__(self) -> str:
        return f"IntervalSet({list(zip(self._starts, self._ends))})"

    def intervals(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    def add(self, x: int) -> None:
        self.add_range(x, x + 1)

    def discard(self, x: int) -> None:
        self.remove_range(x, x + 1)

    def update(self, items: Iterable[int]) -> None:
        """Adds ``items``: a ``range`` (a run) as one interval, anything else run by run."""
        if isinstance(items, range) and items.step == 1:
            self.add_range(items.start, items.stop)
            return
        start = end = None
        for x in sorted(items):
            if end is not None and x <= end:
                end = max(end, x + 1)
                continue
            if start is not None:
                self.add_range(start, end)
            start, end = x, x + 1
        if start is not None:
            self.add_range(start, end)

    def add_range(self, start: int, end: int) -> None:
        """Adds [start, end), merging with the intervals it overlaps or touches."""
        if start >= end:
            return
        starts, ends = self._starts, self._ends
        i = bisect_left(ends, start)  # first interval ending at or after ``start``: it may touch
        j = bisect_right(starts, end)  # intervals [i, j) overlap or touch [start, end)
        if i < j:
            start, end = min(start, starts[i]), max(end, ends[j - 1])
            self._size -= sum(e - s for s, e in zip(starts[i:j], ends[i:j]))
        starts[i:j] = [start]
        ends[i:j] = [end]
        self._size += end - start

    def remove_range(self, start: int, end: int) -> None:
        if start >= end:
            return
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, start)  # first interval ending after ``start``
        j = bisect_left(starts, end)  # intervals [i, j) overlap [start, end)
        if i >= j:
            return
        kept_s, kept_e = [], []
        if starts[i] < start:
            kept_s.append(starts[i])
            kept_e.append(start)
        if ends[j - 1] > end:
            kept_s.append(end)
            kept_e.append(ends[j - 1])
        self._size -= sum(e - s for s, e in zip(starts[i:j], ends[i:j])) - sum(e - s for s, e in zip(kept_s, kept_e))
        starts[i:j] = kept_s
        ends[i:j] = kept_e

    def run_end(self, x: int) -> int:
        """The end of the interval holding ``x`` (``x`` itself when it is not held)."""
        i = bisect_right(self._starts, x) - 1
        return self._ends[i] if i >= 0 and x < self._ends[i] else x

    def first_in(self, start: int, end: int) -> int:
        """The first member in [start, end); ``end`` when there is none."""
        i = bisect_right(self._ends, start)  # first interval ending after ``start``
        if i == len(self._starts):
            return end
        return min(max(start, self._starts[i]), end)


class Coverage:
    """How many intervals cover each integer (intervals may overlap): a step function kept as sorted breakpoints,
    value ``_counts[i]`` on [``_points[i]``, ``_points[i + 1]``), 0 before the first and after the last."""

    __slots__ = ("_points", "_counts")

    def __init__(self) -> None:
        self._points: list[int] = []
        self._counts: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._points)

    def __repr__(self) -> str:
        return f"Coverage({list(zip(self._points, self._counts))})"

    def add(self, start: int, end: int, delta: int = 1) -> None:
        """``delta`` more (or, negative, fewer) intervals cover [start, end)."""
        if start >= end:
            return
        points, counts = self._points, self._counts
        i = bisect_left(points, start)
        if i == len(points) or points[i] != start:  # a breakpoint at ``start``
            points.insert(i, start)
            counts.insert(i, counts[i - 1] if i else 0)
        j = bisect_left(points, end, i)
        if j == len(points) or points[j] != end:  # and one at ``end``
            points.insert(j, end)
            counts.insert(j, counts[j - 1])
        for k in range(i, j):
            counts[k] += delta
        # Drop the breakpoints that no longer change the count (``end``'s first: ``start``'s is before it).
        if j < len(points) and counts[j - 1] == counts[j]:
            del points[j]
            del counts[j]
        if (counts[i - 1] if i else 0) == counts[i]:
            del points[i]
            del counts[i]

    def remove(self, start: int, end: int) -> None:
        self.add(start, end, -1)

    def count(self, x: int) -> int:
        i = bisect_right(self._points, x) - 1
        return self._counts[i] if i >= 0 else 0

    def first_in(self, start: int, end: int) -> int:
        """The first integer in [start, end) that an interval covers; ``end`` when none does."""
        points = self._points
        i = bisect_right(points, start) - 1
        if i >= 0 and self._counts[i]:
            return start
        # Neighbouring steps differ, so the step after an uncovered one is covered (the last one never is).
        return min(points[i + 1], end) if i + 1 < len(points) else end

    def covered(self) -> set[int]:
        """Every covered integer (for tests and small views: O(covered))."""
        out: set[int] = set()
        for k, (point, count) in enumerate(zip(self._points, self._counts)):
            if count:
                out.update(range(point, self._points[k + 1]))
        return out

class StepSets:
    """A set of names for each integer (who holds each chunk), kept as a step function: sorted breakpoints, the set
    ``_sets[i]`` on [``_points[i]``, ``_points[i + 1]``), empty before the first and from the last on. Adding a
    name over a run costs the steps it spans, not its integers, and ``step(x)`` answers x's set and where the
    step ends: every integer up to there has exactly that set. Neighbouring steps with equal sets are merged."""

    __slots__ = ("_points", "_sets")

    def __init__(self) -> None:
        self._points: list[int] = []
        self._sets: list[set[str]] = []

    def __bool__(self) -> bool:
        return bool(self._points)

    def add(self, start: int, end: int, name: str) -> None:
        """``name`` holds [start, end) too."""
        if start < end:
            i, j = self._cut(start), self._cut(end)
            for k in range(i, j):
                self._sets[k].add(name)
            self._merge(i, j)

    def remove(self, start: int, end: int, name: str) -> None:
        """``name`` holds nothing in [start, end) any more."""
        if start < end:
            i, j = self._cut(start), self._cut(end)
            for k in range(i, j):
                self._sets[k].discard(name)
            self._merge(i, j)

    def at(self, x: int) -> AbstractSet[str]:
        """The names holding ``x`` (the live set: read it, do not keep it)."""
        i = bisect_right(self._points, x) - 1
        return self._sets[i] if i >= 0 else _NOBODY

    def step(self, x: int) -> tuple[AbstractSet[str], int | None]:
        """``at(x)``, and the end of its step (None: no end, nobody holds anything from ``x`` on)."""
        points = self._points
        i = bisect_right(points, x) - 1
        end = points[i + 1] if i + 1 < len(points) else None
        return (self._sets[i] if i >= 0 else _NOBODY), end

    def _cut(self, x: int) -> int:
        """The index of a breakpoint at ``x``, made (with the set of the step it splits) when there is none."""
        points = self._points
        i = bisect_left(points, x)
        if i == len(points) or points[i] != x:
            points.insert(i, x)
            self._sets.insert(i, set(self._sets[i - 1]) if i else set())
        return i

    def _merge(self, i: int, j: int) -> None:
        """Drops the breakpoints i..j whose step has the set of the step before (highest first: an index below
        stays valid); the first step's set is never empty, nor is the last's anything but empty."""
        points, sets = self._points, self._sets
        for k in range(min(j, len(points) - 1), max(i, 1) - 1, -1):
            before, here = sets[k - 1], sets[k]
            if len(before) == len(here) and before == here:
                del points[k]
                del sets[k]
        if points and not sets[0]:
            del points[0]
            del sets[0]


_NOBODY: frozenset[str] = frozenset()


def first_held(chunks: AbstractSet[int] | None, start: int, end: int) -> int:
    """The first chunk in [start, end) that ``chunks`` holds (None: every chunk); ``end`` when none."""
    if chunks is None:
        return start if start < end else end
    if isinstance(chunks, (IntervalSet, Coverage)):
        return chunks.first_in(start, end)
    return next((c for c in range(start, end) if c in chunks), end)


def first_missing(chunks: AbstractSet[int] | None, start: int, end: int) -> int:
    """The first chunk in [start, end) that ``chunks`` lacks (None: every chunk held); ``end`` when none."""
    if chunks is None:
        return end
    if isinstance(chunks, IntervalSet):
        return min(chunks.run_end(start), end)
    return next((c for c in range(start, end) if c not in chunks), end)
