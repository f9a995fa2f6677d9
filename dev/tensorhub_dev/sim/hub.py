"""The hub as a modeled resource: `cores` servers taking requests first come, first served.

A request (`HubRequest`) is served in two steps when a server takes it: ``book`` (the reports it carries:
leases that ended), then ``serve``, which plans and returns how long the hub works on it; its ``answer``
runs when that time is up, and only then may the reader act on it. Requests that a free hub (every cost 0)
takes in the same instant are served as one batch, all their reports booked before any of them plans: what
the planner-ideal simulation does when it books every landing of an event before its plan pass.

                 submit                      server free               service time up
    reader  ----------------->  FIFO queue  ------------>  book, serve  --------------->  answer -> reader
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from tensorhub_dev.sim.engine import FlowSim

log = logging.getLogger("tensorhub_dev.sim")


@dataclass(slots=True)
class HubRequest:
    kind: str
    """begin, exchange (plans reads), more (the next leases of reads already planned), report, end."""
    serve: Callable[[], float]
    """Runs when a server takes the request; returns the hub's service time in seconds."""
    book: Callable[[], None] | None = None
    answer: Callable[[], None] | None = None
    queued_at: float = 0.0


class HubQueue:
    """FIFO over `cores` servers (unbounded when `free`), with the figures an update's report needs."""

    def __init__(self, sim: FlowSim, cores: int, free: bool):
        self.sim, self.cores, self.free = sim, cores, free
        self._queue: deque[HubRequest] = deque()
        self._busy = 0
        self._dispatch_pending = False
        self.busy_s = 0.0
        """Hub seconds of work taken on so far (summed over cores), requests still in service included."""
        self._done_s = 0.0
        """...of which finished: what the hub's utilisation counts."""
        self.requests: Counter[str] = Counter()
        self.leases = 0
        self.wait_total_s = 0.0
        self.wait_max_s = 0.0

    def submit(self, request: HubRequest) -> None:
        request.queued_at = self.sim.now
        self._queue.append(request)
        self._kick()

    def _kick(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            self.sim.at(self.sim.now, self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        batch: list[HubRequest] = []
        while self._queue and (self.free or self._busy < self.cores):
            request = self._queue.popleft()
            self._busy += 1
            wait = self.sim.now - request.queued_at
            self.wait_total_s += wait
            self.wait_max_s = max(self.wait_max_s, wait)
            self.requests[request.kind] += 1
            batch.append(request)
        for request in batch:
            if request.book is not None:
                request.book()
        for request in batch:
            service = request.serve()
            self.busy_s += service
            if service <= 0:
                self._finish(request, service)
            else:
                self.sim.at(self.sim.now + service, lambda r=request, s=service: self._finish(r, s))

    def _finish(self, request: HubRequest, service: float) -> None:
        self._busy -= 1
        self._done_s += service
        if request.answer is not None:
            request.answer()
        if self._queue:
            self._kick()

    def report(self, elapsed_s: float) -> dict:
        """The hub's figures for an update that took ``elapsed_s`` of simulated time."""
        n = sum(self.requests.values())  # taken by a server; a request still queued is not counted
        return {"busy_s": self.busy_s, "cores": self.cores,
                "utilisation": self._done_s / (self.cores * elapsed_s) if elapsed_s > 0 else 0.0,
                "requests": dict(self.requests), "leases": self.leases,
                "wait_mean_s": self.wait_total_s / n if n else 0.0, "wait_max_s": self.wait_max_s}
