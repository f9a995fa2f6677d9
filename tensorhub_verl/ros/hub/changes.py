"""Wakes whoever waits for the hub's state to change: threads on the state's condition (a drain, an exchange that
waits for work), and coroutines parked on an event loop (``/v1/wait``, a parked exchange), which never take the
state lock.

Every change bumps ``seq``. A coroutine reads ``seq`` before it looks at the state, and ``wait_async`` returns at
once when it moved since: a change between the look and the wait is never missed. A coroutine may wait on one
model's changes only; a change that names no model wakes every waiter.
"""

from __future__ import annotations

import asyncio
import threading


class Changes:
    def __init__(self, lock: threading.RLock):
        self.condition = threading.Condition(lock)
        self._guard = threading.Lock()
        """Guards ``seq`` and the parked coroutines: taken on the event loop, so never held for long."""
        self.seq = 0
        self._parked: dict[int, tuple[str | None, asyncio.AbstractEventLoop, asyncio.Future]] = {}
        """id(future) -> (the model it waits on, None: any; its loop; the future to resolve)."""

    def notify(self, *models: str) -> None:
        """The state changed (for ``models``; none named: for all). The caller holds the state lock."""
        self.condition.notify_all()
        with self._guard:
            self.seq += 1
            woken = [self._parked.pop(i) for i, (model, _, _) in list(self._parked.items())
                     if not models or model is None or model in models]
        for _model, loop, future in woken:
            loop.call_soon_threadsafe(_wake, future)

    def notify_threads(self) -> None:
        """A change only threads wait for (a registration: it adds no holding, so no parked coroutine's answer
        changes). The caller holds the state lock."""
        self.condition.notify_all()

    def wait(self, timeout: float) -> None:
        """Waits on a thread for the next change, at most ``timeout`` seconds; the caller holds the state lock."""
        self.condition.wait(max(0.0, timeout))

    async def wait_async(self, seen: int, timeout: float, model: str | None = None) -> None:
        """Waits on the event loop, without the state lock, until a change after ``seen`` (for ``model``, or any)
        or ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._guard:
            if self.seq != seen:
                return
            self._parked[id(future)] = (model, loop, future)
        try:
            await asyncio.wait_for(future, max(0.0, timeout))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._guard:
                self._parked.pop(id(future), None)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
