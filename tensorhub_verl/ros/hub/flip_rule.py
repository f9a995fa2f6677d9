"""The fleet flip's rule: which staged version the rollout replicas of a model flip to, and when. Pure: no I/O,
no clock, no lock; ``flips.py`` keeps its state in the hub.

Each replica reports what it serves and how its last staged pull ended: ``staged`` (it holds that version staged
and checked, every chunk's digest verified as it landed), ``check_failed`` (bytes were read and did not match the
version's digests: a corrupt or wrong version) or ``unavailable`` (the bytes were never read: no holder, a dead
holder, a timeout). Only a failed check says anything about the version; an unavailable pull only means that this
replica does not hold it staged. The rule keeps two committed versions per model, ``committed`` and the
one before it (``previous``), and a replica flips only to one of those two. A newer version is committed when

- no replica reported a failed check of it (an unavailable pull does not count; a failed check anywhere blocks the version everywhere, for good; a commit
  that a later report finds failed is withdrawn, so a driver flips its replicas only on the answers it gets once
  every replica has reported);
- a quorum holds it: at least ``min_fraction`` of the reporting replicas (elastic: whoever reports now) hold it
  staged or serve it;
- the fleet serves at most ``MAX_SERVED`` versions at every instant: the versions served once the replicas that
  hold ``committed`` staged have caught up to it, plus the new one, are at most two.

- a commit stays reachable: once no replica serves it or holds it staged and no holder has it any more (the trainer
  dropped it, ``keep_versions``), it is withdrawn and the commit falls back to ``previous`` when that is reachable,
  else to the newest version a replica serves: a replica behind then catches up to what its peers serve (they
  hold it) instead of pulling a version nobody can serve. ``fetchable`` is the hub's list of versions with a
  holder; without it every commit counts as reachable.

Flips happen in two waves: first every replica that catches up to ``previous`` (the commit before), then the
flips to ``committed``. A replica behind stages the fleet's commit, not the newest version, so one straggler
costs one more pull, never a third version served.

    replica    serving  staged         decision (committed C -> D, previous C)
    r0         C        D              wave 2: C -> D
    r1         C        D              wave 2: C -> D
    r2         P        C (catch-up)   wave 1: P -> C
    served at each instant: {C, P} -> {C} -> {C, D} -> {D, C}: never three

The hub's state is soft: after a restart the rule starts with no commit and no failed list, and rebuilds both from
the next round of reports (an older staged version the fleet already serves may then be committed first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_SERVED = 2
"""Most versions of one model the fleet serves at any instant."""


STAGED, CHECK_FAILED, UNAVAILABLE = "staged", "check_failed", "unavailable"
"""How a replica's pull ended (``messages.PullOutcome``)."""
OUTCOMES = (STAGED, CHECK_FAILED, UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """What one replica told the hub: the version it serves (None: none yet), and the version of its last staged
    pull (None: none) with how it ended (``outcome``)."""

    serving: int | None = None
    pull: int | None = None
    outcome: str | None = None

    def __post_init__(self) -> None:
        if (self.pull is None) != (self.outcome is None) or (self.outcome is not None
                                                             and self.outcome not in OUTCOMES):
            raise ValueError(f"a pull and its outcome (one of {OUTCOMES}) go together, got pull={self.pull}, "
                             f"outcome={self.outcome!r}")

    @property
    def staged(self) -> int | None:
        """The version it holds staged and checked."""
        return self.pull if self.outcome == STAGED else None

    @property
    def check_failed(self) -> int | None:
        """The version whose check failed on it."""
        return self.pull if self.outcome == CHECK_FAILED else None


@dataclass(frozen=True, slots=True)
class FlipState:
    """A model's commits: the version replicas flip to, the one before it, and every version that failed."""

    committed: int | None = None
    previous: int | None = None
    failed: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class FlipDecision:
    state: FlipState
    flips: dict[str, int] = field(default_factory=dict)
    """replica -> the version it flips to now (always ``state.committed`` or ``state.previous``)."""
    blocked: str = ""
    """Why the newest staged version is not committed (empty: nothing newer is waiting)."""

    def wave(self, replica: str) -> int | None:
        """1: a catch-up to ``previous``, flipped first; 2: a flip to ``committed``; None: no flip."""
        target = self.flips.get(replica)
        if target is None:
            return None
        return 2 if target == self.state.committed else 1


def quorum(min_fraction: float, replicas: int) -> int:
    """Replicas that must hold a version before it is committed (at least one)."""
    return max(1, math.ceil(min_fraction * replicas - 1e-9))


def _flip_target(report: ReplicaReport, allowed: set[int], failed: frozenset[int]) -> int | None:
    s = report.staged
    if s is None or s not in allowed or s in failed:
        return None
    if report.serving is not None and report.serving >= s:
        return None
    return s


def _reachable(version: int, reports: Mapping[str, ReplicaReport], fetchable: frozenset[int] | None) -> bool:
    """Whether a replica can still get ``version``: one serves it or holds it staged, or some holder has it."""
    return fetchable is None or version in fetchable or any(version in (r.serving, r.staged)
                                                             for r in reports.values())


def decide(reports: Mapping[str, ReplicaReport], state: FlipState, min_fraction: float,
           fetchable: frozenset[int] | None = None) -> FlipDecision:
    """The new commits and each replica's flip, given every live replica's latest report and the versions some
    holder has now (``fetchable``; None: all of them)."""
    failed = state.failed | {r.check_failed for r in reports.values() if r.check_failed is not None}
    committed, previous = state.committed, state.previous
    # A commit whose check failed on a replica after the quorum formed is withdrawn: replicas flip only on the
    # decision made once every replica reported, so no replica has flipped to it through this rule.
    if previous in failed or (previous is not None and not _reachable(previous, reports, fetchable)):
        previous = None
    if committed in failed:
        committed, previous = previous, None
    if committed is not None and not _reachable(committed, reports, fetchable):
        # Nobody serves it, stages it or can serve it: replicas fall back to what the fleet serves.
        served = [r.serving for r in reports.values() if r.serving is not None and r.serving not in failed]
        committed, previous = previous if previous is not None else max(served, default=None), None
    # What the fleet serves once every replica that holds ``committed`` staged has flipped to it.
    after_catch_up = set()
    for report in reports.values():
        target = _flip_target(report, {committed} if committed is not None else set(), failed)
        served = target if target is not None else report.serving
        if served is not None:
            after_catch_up.add(served)
    candidates = sorted({r.staged for r in reports.values() if r.staged is not None and r.staged not in failed
                         and (committed is None or r.staged > committed)}, reverse=True)
    need = quorum(min_fraction, len(reports))
    blocked = ""
    for cand in candidates:  # the newest that passes is committed; an older one may pass where a newer waits
        holders = sorted(w for w, r in reports.items() if cand in (r.staged, r.serving))
        served = after_catch_up | {cand}
        if len(holders) < need:
            reason = (f"v{cand} is held by {len(holders)} of {len(reports)} replicas; "
                      f"{need} needed (min_replica_fraction={min_fraction})")
        elif len(served) > MAX_SERVED:
            reason = (f"v{cand} would make the fleet serve {sorted(served)}: more than {MAX_SERVED} versions; it "
                      f"waits until the replicas behind catch up")
        else:
            committed, previous = cand, committed
            break
        blocked = blocked or reason
    if not blocked:
        newer_failed = sorted(v for v in failed if committed is None or v > committed)
        if newer_failed and not candidates:
            blocked = f"v{newer_failed[-1]} failed its check on a replica: no replica flips to it"
    new = FlipState(committed=committed, previous=previous, failed=frozenset(failed))
    allowed = {v for v in (committed, previous) if v is not None}
    flips = {w: t for w, r in reports.items() if (t := _flip_target(r, allowed, new.failed)) is not None}
    return FlipDecision(state=new, flips=flips, blocked=blocked)


__all__ = ["CHECK_FAILED", "MAX_SERVED", "OUTCOMES", "STAGED", "UNAVAILABLE", "FlipDecision", "FlipState",
           "ReplicaReport", "decide", "quorum"]
