"""How long the hub itself could not hear heartbeats: silence it must not blame on its workers.

Heartbeats are answered on the hub's event loop. When the hub is starved of CPU (an oversubscribed host,
a stop signal, a long GC pause) the loop stops turning: heartbeats sit unread in socket buffers while the
sweeper thread, which may still get CPU, sees them as missing and drops live workers with their holdings.

A probe on the event loop calls ``tick()`` every ``tick_s``. A tick that comes late by more than
``tolerance_s`` means the loop was stalled for that excess; ``stalled()`` is the total so far, including a
stall still in progress (no tick for a while), so a sweep that runs before the loop recovers is covered.
The hub measures a worker's silence in its own awake time: wall-clock silence minus the stall accrued
since the worker was last heard. A stalled hub drops silent workers later, never sooner; a dead worker
is still dropped after ``worker_timeout_s`` of the hub's awake time.

Without a probe (``tick`` never called: a HubState used on its own) nothing is ever credited.
"""

from __future__ import annotations

import threading
from typing import Callable

TICK_S = 0.1
"""How often the event-loop probe ticks."""
TOLERANCE_S = 0.1
"""Lateness a tick may have before it counts as a stall: scheduling jitter is not a stall."""


class StallMeter:
    def __init__(self, clock: Callable[[], float], tick_s: float = TICK_S, tolerance_s: float = TOLERANCE_S):
        self._clock = clock
        self.tick_s = tick_s
        self.tolerance_s = tolerance_s
        self._lock = threading.Lock()  # tick() runs on the loop, stalled() in the sweeper and the routes
        self._last_tick: float | None = None
        self._total = 0.0

    def tick(self) -> None:
        """Called by the event-loop probe every ``tick_s``."""
        with self._lock:
            now = self._clock()
            self._total += self._excess(now)
            self._last_tick = now

    def stalled(self) -> float:
        """Seconds the loop has been stalled since the probe started, the stall in progress included."""
        with self._lock:
            return self._total + self._excess(self._clock())

    def _excess(self, now: float) -> float:
        if self._last_tick is None:
            return 0.0
        late = now - self._last_tick - self.tick_s
        return late if late > self.tolerance_s else 0.0
