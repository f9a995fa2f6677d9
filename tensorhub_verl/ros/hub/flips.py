"""The hub's part for the fleet flip: each model's latest replica reports and its commits. The decision is
``flip_rule.decide``; this part only keeps its inputs and outputs. No lock here: ``HubState`` calls it under its
lock, and drops a worker's report when the worker goes (elastic replicas: whoever reports now is the fleet).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorhub_verl.ros.hub.flip_rule import FlipDecision, FlipState, ReplicaReport, decide
from tensorhub_verl.ros.wire import messages as msg


@dataclass(slots=True)
class _ModelFlip:
    reports: dict[str, ReplicaReport] = field(default_factory=dict)
    state: FlipState = field(default_factory=FlipState)
    blocked: str = ""


class FlipBook:
    def __init__(self) -> None:
        self._models: dict[str, _ModelFlip] = {}

    def report(self, req: msg.FlipReport, fetchable: frozenset[int]) -> msg.FlipReply:
        """Books ``req`` as its worker's latest report, decides again, and answers that worker. ``fetchable``:
        the model's versions that some holder has now."""
        model = self._models.setdefault(req.model, _ModelFlip())
        model.reports[req.worker] = ReplicaReport(serving=req.serving, pull=req.pull, outcome=req.outcome)
        decision = decide(model.reports, model.state, req.min_replica_fraction, fetchable)
        model.state, model.blocked = decision.state, decision.blocked
        return _reply(decision, req.worker, fetchable)

    def forget(self, worker: str) -> None:
        """A worker that left or went silent no longer counts toward any quorum."""
        for model in self._models.values():
            model.reports.pop(worker, None)

    def status(self) -> dict[str, msg.FlipStatus]:
        return {name: msg.FlipStatus(
            committed=m.state.committed, previous=m.state.previous, failed=sorted(m.state.failed), blocked=m.blocked,
            replicas={w: msg.ReplicaFlipStatus(serving=r.serving, pull=r.pull, outcome=r.outcome)
                      for w, r in sorted(m.reports.items())}) for name, m in sorted(self._models.items())}


def _reply(decision: FlipDecision, worker: str, fetchable: frozenset[int]) -> msg.FlipReply:
    return msg.FlipReply(committed=decision.state.committed, previous=decision.state.previous,
                         flip_to=decision.flips.get(worker), wave=decision.wave(worker), blocked=decision.blocked,
                         failed=sorted(decision.state.failed), fetchable=sorted(fetchable))


__all__ = ["FlipBook"]
