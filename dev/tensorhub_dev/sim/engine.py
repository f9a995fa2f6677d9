"""Event-driven flow simulation: rates are max-min fair and recomputed at every arrival / completion.

Between two events every flow's rate is constant, so the next event is the earlier of the next
timer and the first flow to drain. Flows that drain within `_EPS_S` of each other complete in the
same event: symmetric schedules then cost one event per wave, not one per flow.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tensorhub_verl.errors import ConfigError, TensorHubError
from tensorhub_dev.sim.maxmin import max_min_rates
from tensorhub_dev.sim.topology import Cluster, Link

log = logging.getLogger("tensorhub_dev.sim")

_EPS_S = 1e-9


class SimulationStuck(TensorHubError, RuntimeError):
    """No flow is moving and no timer is pending, but the caller expected progress."""


@dataclass(slots=True)
class Flow:
    fid: int
    src: str
    dst: str
    path: tuple[Link, ...]
    size: float
    remaining: float
    started: float
    on_done: Callable[["Flow"], None] | None
    tag: object = None
    rate: float = 0.0


class FlowSim:
    """Clock, flows, timers. Callbacks may start flows and timers; they run in a deterministic order."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.now = 0.0
        self.flows: dict[int, Flow] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._dirty = True
        self.events = 0
        self.bytes_on: dict[Link, float] = {}
        """Bytes carried so far by each link (flows count when they complete)."""

    def start_flow(self, src: str, dst: str, nbytes: float, on_done: Callable[[Flow], None] | None = None,
                   tag: object = None, path: Sequence[Link] | None = None) -> Flow:
        if not nbytes > 0:
            raise ConfigError(f"flow {src}->{dst}: size must be > 0, got {nbytes}")
        self._seq += 1
        flow = Flow(self._seq, src, dst, tuple(path) if path else self.cluster.path(src, dst), float(nbytes),
                    float(nbytes), self.now, on_done, tag)
        self.flows[flow.fid] = flow
        self._dirty = True
        return flow

    def cancel_flow(self, flow: Flow) -> None:
        if self.flows.pop(flow.fid, None) is not None:
            self._dirty = True

    def at(self, t: float, callback: Callable[[], None]) -> None:
        if t < self.now:
            raise ConfigError(f"timer at {t} is in the past (now {self.now})")
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, callback))

    def _rerate(self) -> None:
        rates = max_min_rates({f.fid: f.path for f in self.flows.values()}, self.cluster.capacity)
        for f in self.flows.values():
            f.rate = rates[f.fid]
        self._dirty = False

    def run(self, until: Callable[[], bool] | None = None, max_time: float = math.inf) -> float:
        """Advance until `until()` holds, nothing is left to do, or `max_time`; returns the clock."""
        while until is None or not until():
            if self._dirty:
                self._rerate()
            finite = [f for f in self.flows.values() if not math.isinf(f.remaining)]
            t_flow = min((self.now + f.remaining / f.rate for f in finite), default=math.inf)
            t_timer = self._timers[0][0] if self._timers else math.inf
            t = min(t_flow, t_timer)
            if math.isinf(t):
                if until is not None:
                    raise SimulationStuck(f"nothing moves at t={self.now:.3f}s but the run is not done")
                break
            if t > max_time:
                self._advance(max_time)
                break
            self._advance(t)
            self.events += 1
            done = [f for f in finite if f.remaining <= f.rate * _EPS_S + 1e-6]
            for f in done:
                del self.flows[f.fid]
                for link in f.path:
                    self.bytes_on[link] = self.bytes_on.get(link, 0.0) + f.size
            if done:
                self._dirty = True
            for f in done:
                if f.on_done is not None:
                    f.on_done(f)
            while self._timers and self._timers[0][0] <= self.now + _EPS_S:
                _, _, cb = heapq.heappop(self._timers)
                cb()
        return self.now

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self.flows.values():
                if not math.isinf(f.remaining):
                    f.remaining -= f.rate * dt
        self.now = t
