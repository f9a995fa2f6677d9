"""Which weight version produced which output tokens of a request: the span bookkeeping (pure, no vLLM).

A request's tokens are labelled by ``WeightVersionSpan(version, start, end)``: output tokens ``start`` up to,
not including, ``end`` were sampled by weights ``version`` (Python slice bounds, the shape of vLLM 0.33's
``CompletionOutput.weight_versions``). A request that runs while an engine applies a new version reports two
spans; one that sees no apply reports one. ``version`` is None for the weights an engine started with before
its first recorded apply (nobody published them).

``VersionLedger`` is what an engine core keeps: the version it serves, each request's version at admission,
and for every apply the output position of each request in flight at that moment (read between two engine
steps, so the positions are exact). ``finish`` turns that record into the request's spans.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WeightVersionSpan:
    """Output tokens ``[start, end)`` of one request were sampled by weights ``version``."""

    version: int | None
    start: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.start <= self.end):
            raise ValueError(f"a span needs 0 <= start <= end, got start={self.start} end={self.end}")

    def as_list(self) -> list:
        return [self.version, self.start, self.end]


def spans_from_boundaries(first_version: int | None, boundaries: Sequence[tuple[int, int | None]],
                          n_tokens: int) -> list[WeightVersionSpan]:
    """The spans of a request admitted under ``first_version`` whose engine applied ``version`` when the
    request had ``position`` output tokens, for each ``(position, version)`` in ``boundaries`` (in apply order),
    and which ended with ``n_tokens`` output tokens. Versions that produced no token leave no span."""
    spans: list[WeightVersionSpan] = []
    version, start = first_version, 0
    for position, new_version in boundaries:
        position = min(max(position, start), n_tokens)
        if position > start:
            spans.append(WeightVersionSpan(version, start, position))
        version, start = new_version, position
    if n_tokens > start or not spans:
        spans.append(WeightVersionSpan(version, start, max(n_tokens, start)))
    return merge_adjacent(spans)


def merge_adjacent(spans: Iterable[WeightVersionSpan]) -> list[WeightVersionSpan]:
    """Joins touching spans of the same version and drops empty ones (keeping one if all are empty)."""
    out: list[WeightVersionSpan] = []
    spans = list(spans)
    for s in spans:
        if s.end == s.start:
            continue
        if out and out[-1].version == s.version and out[-1].end == s.start:
            out[-1] = WeightVersionSpan(s.version, out[-1].start, s.end)
        else:
            out.append(s)
    if not out and spans:
        out.append(spans[-1])
    return out


def concat(parts: Sequence[Sequence[WeightVersionSpan]], lengths: Sequence[int]) -> list[WeightVersionSpan]:
    """The spans of one response assembled from several engine requests (a partial rollout resumed after an
    abort): part ``i`` produced ``lengths[i]`` tokens, appended after the tokens of the parts before it."""
    if len(parts) != len(lengths):
        raise ValueError(f"{len(parts)} span lists for {len(lengths)} parts")
    out: list[WeightVersionSpan] = []
    offset = 0
    for spans, n in zip(parts, lengths):
        out += [WeightVersionSpan(s.version, offset + min(s.start, n), offset + min(s.end, n)) for s in spans]
        offset += n
    return merge_adjacent(out)


def label(spans: Sequence[WeightVersionSpan]) -> tuple[int | None, int | None]:
    """``(first, last)``: the first and the last version that produced tokens (verl's ``min_global_steps`` and
    ``max_global_steps``). For a response with no token, the version it was admitted under, twice."""
    produced = [s for s in spans if s.end > s.start] or list(spans[:1])
    if not produced:
        return None, None
    return produced[0].version, produced[-1].version


def to_wire(spans: Sequence[WeightVersionSpan]) -> list[list]:
    return [s.as_list() for s in spans]


def from_wire(value) -> list[WeightVersionSpan]:
    """Spans from ``to_wire``'s lists, a JSON string of them, or spans already (vLLM 0.33's objects too)."""
    if isinstance(value, str):
        value = json.loads(value)
    out = []
    for item in value or ():
        if isinstance(item, (list, tuple)):
            version, start, end = item
        else:
            version, start, end = item.version, item.start, item.end
        out.append(WeightVersionSpan(None if version is None else int(version), int(start), int(end)))
    return out


class VersionLedger:
    """An engine's record of applies and of the version each running request was admitted under.

    Thread-safe (the engine core's step loop and its RPC handling may be on different threads). ``finish`` forgets
    the request; requests that never finish through it (a bounded number) are forgotten oldest first.
    """

    def __init__(self, version: int | None = None, *, max_requests: int = 1 << 16) -> None:
        self._lock = threading.Lock()
        self.version = version
        """The version the engine serves now (None: its initial weights)."""
        self.applies = 0
        """Applies recorded so far."""
        self._requests: OrderedDict[str, tuple[int | None, list[tuple[int, int | None]]]] = OrderedDict()
        self._max = max_requests

        self.active = False
        """Recording: set by ``enable`` (an engine updated through TensorHub); until then nothing is kept."""

    def enable(self) -> None:
        self.active = True

    def admit(self, request_id: str) -> None:
        """A request entered the engine: its first tokens come from the version served now."""
        if not self.active:
            return
        with self._lock:
            self._requests[request_id] = (self.version, [])
            while len(self._requests) > self._max:
                self._requests.popitem(last=False)

    def apply(self, version: int, positions: Mapping[str, int]) -> None:
        """The engine now serves ``version``; ``positions``: output tokens each request in flight had then."""
        with self._lock:
            if version == self.version:
                return
            self.version = version
            self.applies += 1
            for request_id, position in positions.items():
                entry = self._requests.get(request_id)
                if entry is not None:
                    entry[1].append((int(position), version))

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished."""
        return len(self._requests)

    def finish_record(self, request_id: str) -> tuple[int | None, list[list]] | None:
        """``(first version, [[position, version], ...])`` of the request (None if the ledger never saw it),
        and forgets it: what ``spans_from_boundaries`` needs besides the request's output length."""
        with self._lock:
            entry = self._requests.pop(request_id, None)
        if entry is None:
            return None
        return entry[0], [list(b) for b in entry[1]]

    def finish(self, request_id: str, n_tokens: int) -> list[WeightVersionSpan] | None:
        """The request's spans (None if the ledger never saw it), and forgets it."""
        record = self.finish_record(request_id)
        if record is None:
            return None
        return spans_from_boundaries(record[0], [tuple(b) for b in record[1]], n_tokens)


__all__ = ["VersionLedger", "WeightVersionSpan", "concat", "from_wire", "label", "merge_adjacent",
           "spans_from_boundaries", "to_wire"]
