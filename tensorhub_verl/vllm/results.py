"""What the update operations return: one type per operation, read by attribute everywhere.

    EngineHolder.begin_pull  -> PullStart      (one rank: which version, from which layout, started or not)
    EngineHolder.apply/update -> ApplyResult   (one rank: what it read, from whom, how long it stalled)
    EngineUpdater.update     -> UpdateResult   (one engine: its ranks' ApplyResults merged)
    AdapterHolder.update     -> AdapterUpdate  (one rank's LoRA adapter)
    EngineHolder.status, th_status -> HolderStatus (one rank: what it serves, its pull, or that it sleeps)

The per-rank results cross vLLM's ``collective_rpc``. Over a multiprocess executor they arrive as the same
objects (pickled); through ``AsyncLLM``'s msgpack channel a dataclass arrives as a plain dict unless vLLM's
insecure serialization is on. So a driver never reads a rank's answer by key: ``from_wire`` takes either
form and returns the typed result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tensorhub_verl import errors

_T = TypeVar("_T")


class _Wire:
    """``as_dict`` / ``from_wire`` for the result dataclasses below."""

    __slots__ = ()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls: type[_T], answer: Any) -> _T:
        """``answer`` as this type: the object itself, or the dict it became on its way through an RPC."""
        if isinstance(answer, cls):
            return answer
        if not isinstance(answer, Mapping):
            raise errors.InvalidRequest(f"expected a {cls.__name__} or its dict, got {type(answer).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in answer.items() if k in names})
        except TypeError as e:  # a required field is missing: the other side speaks another version
            raise errors.InvalidRequest(f"not a {cls.__name__}: {e}; got keys {sorted(answer)} (are both sides "
                                        f"of the RPC the same tensorhub_verl version?)") from e


@dataclass(slots=True, kw_only=True)
class PullStart(_Wire):
    """``begin_pull``'s answer. ``started`` is False when the rank already serves ``version`` (nothing to do)."""

    version: int
    source_layout: str
    started: bool


@dataclass(slots=True, kw_only=True)
class DeltaOutcome(_Wire):
    """What one rank's read of a version as a delta did (``ros.client.delta.DeltaStats`` as plain data)."""

    base_version: int
    used: bool
    """The delta was read and applied (some chunks perhaps re-read in full)."""
    delta_bytes: int = 0
    changed_fraction: float = 0.0
    fallback_chunks: int = 0
    """Chunks re-read in full after a failed check (every chunk when the delta was not used)."""
    fallback_bytes: int = 0
    full_chunks: int = 0
    """Chunks read in full beside the delta by design: a TP rank's slices cover their digest blocks in part."""
    full_bytes: int = 0
    reasons: list[str] = field(default_factory=list)
    """Why the delta was not used, or why chunks were re-read."""

    @classmethod
    def of(cls, stats: Any) -> DeltaOutcome:
        """From a ``FetchStats.delta`` (``DeltaStats``)."""
        return cls(base_version=stats.base_version, used=stats.used, delta_bytes=stats.delta_bytes,
                   changed_fraction=stats.changed_fraction, fallback_chunks=stats.fallback_chunks,
                   fallback_bytes=stats.fallback_bytes, full_chunks=stats.full_chunks, full_bytes=stats.full_bytes,
                   reasons=list(stats.reasons))


@dataclass(slots=True, kw_only=True)
class ApplyResult(_Wire):
    """What one rank's ``apply`` (or ``update``) did. ``applied`` False: it already served ``version``."""

    worker: str
    version: int
    applied: bool
    source_layout: str | None = None
    """The layout the version was read in: the engine's own (raw, from a peer) or ``hf``."""
    stall_s: float = 0.0
    """Seconds the engine could not generate (the apply; with staging ``none`` the pull too)."""
    pull_s: float = 0.0
    bytes: int = 0
    sources: dict[str, int] = field(default_factory=dict)
    """Bytes read from each worker."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per apply phase (unpublish_old_s, copy_in_s, release_staging_s, publish_s)."""
    preserved_bytes: int = 0
    """Bytes copied to CPU inside the stall because this rank held the last reliable copy of the old version."""
    peak_bucket_bytes: int = 0
    """Largest bucket held when the version went through the engine's loader (0: in place or raw)."""
    delta: DeltaOutcome | None = None
    """How a delta from the served version went (None: no delta was tried)."""
    wan_bytes: int = 0
    """Bytes read from workers in another datacenter than this rank's (0 without ``dc`` labels)."""
    dc: str | None = None
    """This rank's datacenter label."""

    @classmethod
    def from_wire(cls, answer: Any) -> ApplyResult:
        """As ``_Wire.from_wire``, with the nested delta outcome typed too."""
        result = super(ApplyResult, cls).from_wire(answer)
        if isinstance(result.delta, Mapping):
            result.delta = DeltaOutcome.from_wire(result.delta)
        return result


@dataclass(slots=True)
class UpdateResult(_Wire):
    """What one engine-wide update did. ``stall_s`` is the longest rank's apply (generation paused)."""

    version: int
    applied: bool
    stall_s: float = 0.0
    pull_s: float = 0.0
    seconds: float = 0.0
    bytes: int = 0
    rank_bytes: list[int] = field(default_factory=list)
    """Bytes each rank read, in rank order (at TP>1 each rank reads only its own slices)."""
    peak_bucket_bytes: int = 0
    """Largest bucket any rank held when the version went through the engine's loader (0: in place or raw)."""
    sources: dict[str, int] = field(default_factory=dict)
    source_layouts: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    """Slowest rank's seconds per apply phase (unpublish_old_s, copy_in_s, release_staging_s, publish_s)."""
    preserved_bytes: int = 0
    """Bytes the ranks copied to CPU inside the apply because they held the last reliable copy of the version
    they stopped serving (0 while the trainer or a peer still holds it)."""
    delta_ranks: int = 0
    """Ranks that applied the version as a delta."""
    delta_bytes: int = 0
    """Bytes of delta forms the ranks read (part of ``bytes``)."""
    changed_fraction: float = 0.0
    """Largest fraction of elements a rank's delta changed."""
    delta_fallbacks: int = 0
    """Chunks the ranks re-read in full after a delta's failed check, or read in full because a delta they tried
    could not be used."""
    delta_full_bytes: int = 0
    """Bytes the ranks read in full beside a delta by design (``DeltaOutcome.full_bytes``; part of ``bytes``)."""
    delta_fallback_bytes: int = 0
    """Bytes the ranks read in full after a delta's failed check, or because a delta they tried could not be used
    (``DeltaOutcome.fallback_bytes``; part of ``bytes``)."""
    delta_reasons: list[str] = field(default_factory=list)
    wan_bytes: dict[str, int] = field(default_factory=dict)
    """Datacenter -> bytes its ranks read from workers in other datacenters."""

    @classmethod
    def of_ranks(cls, ranks: list[ApplyResult], seconds: float) -> UpdateResult:
        """One engine's update out of its ranks' applies (rank order)."""
        res = cls(version=ranks[0].version, applied=any(r.applied for r in ranks),
                  stall_s=max(r.stall_s for r in ranks), pull_s=max(r.pull_s for r in ranks), seconds=seconds,
                  bytes=sum(r.bytes for r in ranks), rank_bytes=[r.bytes for r in ranks],
                  peak_bucket_bytes=max(r.peak_bucket_bytes for r in ranks),
                  source_layouts=[r.source_layout for r in ranks if r.source_layout is not None],
                  preserved_bytes=sum(r.preserved_bytes for r in ranks))
        for r in ranks:
            if r.delta is not None:
                d = DeltaOutcome.from_wire(r.delta)
                res.delta_ranks += d.used
                res.delta_bytes += d.delta_bytes
                res.changed_fraction = max(res.changed_fraction, d.changed_fraction)
                res.delta_fallbacks += d.fallback_chunks
                res.delta_full_bytes += d.full_bytes
                res.delta_fallback_bytes += d.fallback_bytes
                res.delta_reasons += d.reasons
            if r.wan_bytes and r.dc is not None:
                res.wan_bytes[r.dc] = res.wan_bytes.get(r.dc, 0) + r.wan_bytes
            for k, x in r.phases.items():
                res.phases[k] = max(res.phases.get(k, 0.0), x)
            add_sources(res.sources, r.sources)
        return res


@dataclass(slots=True, kw_only=True)
class AdapterUpdate(_Wire):
    """What one rank's LoRA adapter update did."""

    version: int
    applied: bool
    bytes: int = 0
    seconds: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class PullStatus(_Wire):
    """The running or last pull of one rank."""

    version: int
    state: str
    """``pull.PullState``'s value: pulling, ready or failed."""
    source_layout: str
    error: str | None = None
    """``repr`` of why it failed."""
    check_failed: bool = False
    """A failed pull read bytes that do not match the version's digests (``errors.DigestMismatch``): the
    version's check failed. False on a failed pull: the version could not be read (no holder, a dead holder, a
    timeout)."""


@dataclass(slots=True, kw_only=True)
class SleepStatus(_Wire):
    """What a sleeping rank held when it went to sleep (``sleep.Asleep``)."""

    served: int | None
    level: int
    weights_kept: bool


@dataclass(slots=True, kw_only=True)
class HolderStatus(_Wire):
    """One rank's state (``th_status``): the version its parameters serve, its pull, or that it sleeps."""

    worker: str | None
    """None while the engine sleeps (no client)."""
    served: int | None
    broken: bool = False
    """A failed update left the parameters holding no whole version (``EngineStateLost``)."""
    layout: str | None = None
    staging: str | None = None
    extra_bytes: int = 0
    """Bytes held besides the parameters (staging and scratch)."""
    pinned_staging: bool = False
    publishing: bool = False
    """A publication of the parameters off the stall is still running."""
    pull: PullStatus | None = None
    asleep: SleepStatus | None = None

    @property
    def pulling(self) -> bool:
        return self.pull is not None and self.pull.state == "pulling"

    @classmethod
    def from_wire(cls, answer: Any) -> HolderStatus:
        """As ``_Wire.from_wire``, with the nested pull and sleep statuses typed too."""
        status = super(HolderStatus, cls).from_wire(answer)
        if isinstance(status.pull, Mapping):
            status.pull = PullStatus.from_wire(status.pull)
        if isinstance(status.asleep, Mapping):
            status.asleep = SleepStatus.from_wire(status.asleep)
        return status


def add_sources(total: dict[str, int], more: Mapping[str, int]) -> None:
    """Adds ``more``'s bytes per worker into ``total``."""
    for worker, n in more.items():
        total[worker] = total.get(worker, 0) + n


__all__ = ["AdapterUpdate", "ApplyResult", "DeltaOutcome", "HolderStatus", "PullStart", "PullStatus", "SleepStatus", "UpdateResult",
           "add_sources"]
