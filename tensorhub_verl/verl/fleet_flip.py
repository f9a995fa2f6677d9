"""The fleet flip (``tensorhub.flip_together``): replicas stage a version while generating, report it to the hub as
staged and checked, and flip to it together once the hub's rule (``ros/hub/flip_rule.py``) commits it.

```
 updater                     replica r (engine ranks)                 hub
   query (if one is behind) > th_flip_report (one replica, nothing staged) ─> answers: commit, versions held now
   stage ──────────────────> pull v (or the fleet's commit, if behind; if no holder has the commit any more, what
                             the other replicas serve, else v) ── chunks verified as they land
   report (all replicas) ──> th_flip_report(serving, pull, outcome) ──> books it, decides
   report again (all) ─────> th_flip_report ──────────────────────────> answers: flip_to, wave
   wave 1: catch-ups to the previous commit, pause-apply-resume each
   wave 2: flips to the commit, pause-apply-resume each (flip_batches: oldest first, one by one where flipping
           together could show three versions; none that a failed catch-up would make the third)
   the rest: drop their staged pull (keep serving)
   report after the flips ─────────────────────────────────────────────> status shows what each serves
```

The decision the updater acts on is the one given once every replica has reported, so a replica whose check fails
withdraws a version before anyone flips to it. Each replica reports how its pull ended (``pull_outcome``):
``check_failed`` when bytes were read and did not match the version's digests (``errors.DigestMismatch``: every
chunk carries its publisher's digest), and then no replica flips to that version, ever (the hub keeps the list);
``unavailable`` when the bytes were never read (no holder, a dead holder, a timeout: the other ``TransferFailed``
cases, ``VersionNotFound``, a rank with no pull), which says nothing about the version: that replica just does not
hold it, and the others may still commit it by quorum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from tensorhub_verl.verl.updater import ReplicaOutcome, Staged, TensorHubUpdater

logger = logging.getLogger("tensorhub_verl.verl.fleet_flip")


def stage_target(served: int | None, committed: int | None, newest: int, *,
                 fetchable: Collection[int] | None = None, others: Iterable[int | None] = (),
                 failed: Collection[int] = ()) -> int:
    """The version a replica stages: the fleet's commit while it serves an older one (or none), else the newest.

    A commit that no holder has any more (``fetchable``: the versions some holder has now; None: every version)
    cannot be pulled: a replica behind it then stages the newest version the other replicas serve (``others``) that
    is newer than its own (its peers hold it, and moving to it adds no version to what the fleet serves), else the
    newest. Never a version in ``failed`` (its check failed on some replica). Pure: no I/O."""
    behind = committed is not None and committed < newest and (served is None or served < committed)
    if not behind or fetchable is None or (committed in fetchable and committed not in failed):
        return committed if behind else newest
    ahead = [v for v in others if v is not None and v in fetchable and v not in failed
             and (served is None or v > served)]
    return max(ahead, default=newest)


def pull_outcome(check_failed: bool) -> str:
    """A failed pull's outcome for the hub (``messages.PullOutcome``): ``check_failed`` only when its bytes failed
    the version's digests."""
    return "check_failed" if check_failed else "unavailable"


def _report_fields(staged: Staged | None, served: int | None, target: int, error: BaseException | None) -> dict:
    """What a replica reports: what it serves, and the version it tried to stage with how that pull ended (every
    rank holds it staged and checked; a rank's bytes failed its digests; else it could not be read)."""
    from tensorhub_verl.errors import DigestMismatch

    if staged is None:  # the stage itself failed (set-up, a pull that did not finish in time)
        return {"serving": served, "pull": target, "outcome": pull_outcome(isinstance(error, DigestMismatch))}
    if staged.statuses is None:
        return {"serving": staged.version, "pull": None, "outcome": None}
    pulls = [s.pull for s in staged.statuses]
    failed = [p for p in pulls if p is None or p.state == "failed"]
    ready = not failed and all(p.state == "ready" and p.version == staged.version for p in pulls)
    outcome = (pull_outcome(any(p is not None and p.check_failed for p in failed)) if failed
               else "staged" if ready else "unavailable")
    return {"serving": served, "pull": staged.version, "outcome": outcome}


async def flip_fleet(updater: TensorHubUpdater, replicas: Sequence[Any], version: int,
                     published_digests: dict | None) -> tuple[list[ReplicaOutcome], dict[str, float]]:
    """Stages, reports, flips in waves; returns one outcome per replica and the flip's metrics."""
    from tensorhub_verl.verl.updater import ReplicaOutcome

    config = updater.config
    timeout = config.apply_timeout_s
    view = await _fleet_view(updater, replicas, version)
    committed = view["committed"] if view is not None else updater.flip_committed
    fetchable = view.get("fetchable") if view is not None else None
    failed = set(view["failed"]) if view is not None else set()

    targets = [stage_target(updater.served.get(r.replica_rank), committed, version, fetchable=fetchable,
                            failed=failed, others=[v for k, v in updater.served.items() if k != r.replica_rank])
               for r in replicas]

    async def stage(replica, target):
        try:
            return await updater._stage(replica, target), None
        except Exception as e:  # this replica cannot pull now; it reports that it does not hold the target
            return None, e

    staged = await asyncio.gather(*(stage(r, t) for r, t in zip(replicas, targets)))
    outcomes = [ReplicaOutcome(replica=r.replica_rank, error=e,
                               version=s.version if s is not None and s.statuses is None else None)
                for r, (s, e) in zip(replicas, staged)]
    fields = [_report_fields(s, updater.served.get(r.replica_rank), t, e)
              for r, t, (s, e) in zip(replicas, targets, staged)]

    async def report(i: int):
        try:
            engines = staged[i][0].engines if staged[i][0] is not None else updater._engines(replicas[i])
            return await engines.flip_report(**fields[i], min_replica_fraction=config.min_replica_fraction,
                                             timeout=timeout)
        except Exception as e:  # an unreachable replica counts as not reporting; it keeps serving
            outcomes[i].error = outcomes[i].error or e
            return None

    await asyncio.gather(*(report(i) for i in range(len(replicas))))
    answers = await asyncio.gather(*(report(i) for i in range(len(replicas))))

    async def flip(i: int) -> None:
        s, o = staged[i][0], outcomes[i]
        try:
            await updater._apply_staged(replicas[i], s, o, published_digests if s.version == version else None)
            fields[i] = {"serving": s.version, "pull": None, "outcome": None}
        except Exception as e:
            o.error = e

    decided_flips = [(i, a["wave"], a["flip_to"]) for i, a in enumerate(answers)
                     if a is not None and a["wave"] in (1, 2) and staged[i][0] is not None
                     and staged[i][0].statuses is not None and a["flip_to"] == staged[i][0].version]
    skipped: set[int] = set()
    serving_now = [f["serving"] for f in fields]
    for batch in flip_batches(decided_flips, serving_now):
        if not batch.safe:
            skipped.update(batch.replicas)
            logger.warning("fleet flip of v%d: replicas %s keep v%s; flipping them to v%d now would make the fleet "
                           "serve three versions (a catch-up before it failed)", version,
                           [replicas[i].replica_rank for i in batch.replicas], batch.old, batch.target)
            continue
        await asyncio.gather(*(flip(i) for i in batch.replicas))
        for i in batch.replicas:
            serving_now[i] = fields[i]["serving"]
    for i, (s, _) in enumerate(staged):  # the rest drop what they staged and keep serving
        a = answers[i]
        if s is not None and s.statuses is not None and (a is None or a["flip_to"] != s.version or i in skipped):
            try:
                await asyncio.to_thread(s.updater.call, "th_abort")
            except Exception as e:
                outcomes[i].error = outcomes[i].error or e
            if outcomes[i].error is None and fields[i]["outcome"] != "staged":
                outcomes[i].error = _pull_failed(replicas[i].replica_rank, s, fields[i]["outcome"])
            if fields[i]["outcome"] == "staged":  # dropped: it no longer holds it staged
                fields[i].update(pull=None, outcome=None)
    final = await asyncio.gather(*(report(i) for i in range(len(replicas))))
    decided = next((a for a in reversed(final) if a is not None), None) or next(
        (a for a in answers if a is not None), None)
    if decided is not None:
        updater.flip_committed = decided["committed"]
        if decided["blocked"]:
            logger.warning("fleet flip of v%d: %s", version, decided["blocked"])
    served = {v for v in (f["serving"] for f in fields) if v is not None}
    metrics = {"tensorhub/flip_replicas": float(sum(o.version is not None and o.error is None for o in outcomes)),
               "tensorhub/flip_blocked": float(bool(decided and decided["blocked"]) or bool(skipped)),
               "tensorhub/versions_served": float(len(served))}
    if decided is not None and decided["committed"] is not None:
        metrics["tensorhub/flip_committed"] = float(decided["committed"])
    return outcomes, metrics


async def _fleet_view(updater: TensorHubUpdater, replicas: Sequence[Any], version: int) -> dict | None:
    """The hub's current answer (commit, failed versions, the versions some holder has now), asked only when a
    replica is behind the last commit known: the trainer may have just dropped it (``keep_versions``). One replica
    that is set up reports what it serves, nothing staged (what it reported after the last flip); None: no replica
    answered, or none is behind."""
    committed = updater.flip_committed
    if committed is None or not any(stage_target(updater.served.get(r.replica_rank), committed, version) == committed
                                    for r in replicas):
        return None
    for replica in replicas:
        if updater._set_up.get(replica.replica_rank) is None:
            continue
        try:
            return await updater._engines(replica).flip_report(
                serving=updater.served.get(replica.replica_rank), pull=None, outcome=None,
                min_replica_fraction=updater.config.min_replica_fraction, timeout=updater.config.apply_timeout_s)
        except Exception as e:  # another replica may answer; without an answer the last commit known is used
            logger.warning("replica %d did not answer the fleet flip's query: %s", replica.replica_rank, e)
    return None


@dataclass(frozen=True, slots=True)
class FlipBatch:
    """Replicas flipped together from ``old`` to ``target`` (``safe`` False: they must not flip now)."""

    replicas: tuple[int, ...]
    old: int | None
    target: int
    safe: bool


def flip_batches(flips: Sequence[tuple[int, int, int]], serving: list[int | None]) -> Iterator[FlipBatch]:
    """Orders the hub's decided flips ``(replica index, wave, target)`` so the fleet never serves more than
    ``MAX_SERVED`` versions at an instant, even when a flip before fails. ``serving[i]``: what replica ``i`` serves
    now; read again before each batch, so the caller updates it as flips succeed.

    Wave by wave (catch-ups first), oldest served version first. Replicas of one (old, target) pair flip together
    when every instant of their flips keeps the fleet within the bound (what is served now plus ``target``); else
    one by one, each only if what the others serve plus ``target`` is within it; a flip that would break it is
    yielded unsafe (the hub's decision assumed a catch-up that did not happen). A pure planner: no I/O."""
    from tensorhub_verl.ros.hub.flip_rule import MAX_SERVED

    def key(f):
        old = serving[f[0]]
        return f[1], -1 if old is None else old, f[2]

    groups: dict[tuple, list[int]] = {}
    for f in sorted(flips, key=key):
        groups.setdefault((f[1], serving[f[0]], f[2]), []).append(f[0])
    for (_wave, old, target), members in groups.items():
        now = {v for v in serving if v is not None}
        if len(now | {target}) <= MAX_SERVED:
            yield FlipBatch(tuple(members), old, target, True)
            continue
        for i in members:
            others = {v for j, v in enumerate(serving) if j != i and v is not None}
            yield FlipBatch((i,), old, target, len(others | {target}) <= MAX_SERVED)


def _pull_failed(replica: int, staged: Staged, outcome: str) -> BaseException:
    from tensorhub_verl.errors import DigestMismatch, TransferFailed

    errors = [s.pull.error for s in staged.statuses if s.pull is not None and s.pull.error]
    if outcome == "check_failed":
        return DigestMismatch(f"replica {replica}: v{staged.version} failed its check ({errors[:1]}); no replica "
                              f"flips to it and this one keeps serving its version")
    return TransferFailed(f"replica {replica}: v{staged.version} could not be read ({errors[:1]}); this replica "
                          f"keeps serving its version, the others may still flip to it")


__all__ = ["FlipBatch", "flip_batches", "flip_fleet", "pull_outcome", "stage_target"]
