"""One back-off for the client's retry loops: a delay that starts at ``first_s`` and doubles up to ``max_s``,
with optional jitter, and an optional deadline that no sleep may cross."""

from __future__ import annotations

import random
import time


class Backoff:
    def __init__(self, first_s: float = 0.05, max_s: float = 1.0, deadline: float | None = None):
        if not 0 < first_s <= max_s:
            raise ValueError(f"Backoff needs 0 < first_s <= max_s, got first_s={first_s}, max_s={max_s}")
        self.delay = first_s
        self.max_s = max_s
        self.deadline = deadline
        """A ``time.monotonic()`` time: ``fits`` is False once the next sleep would end past it."""

    def fits(self) -> bool:
        """Whether the next sleep ends before the deadline (always, without one)."""
        return self.deadline is None or time.monotonic() + self.delay <= self.deadline

    def sleep(self, jitter: float = 0.0) -> None:
        """Sleeps the current delay (longer by up to ``jitter`` of it, at random), then doubles it up to ``max_s``."""
        time.sleep(self.delay * (1 + random.random() * jitter) if jitter else self.delay)
        self.delay = min(self.delay * 2, self.max_s)
