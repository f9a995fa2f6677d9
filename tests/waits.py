"""The suite's one wait for a condition: poll it until it holds, fail the test with what did not happen.
(Processes that must end: ``tensorhub_dev.testing.leftovers.wait_gone``.)"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float, what: str, poll_s: float = 0.05) -> None:
    """Polls ``condition`` until it holds; fails the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(poll_s)


__all__ = ["wait_until"]
