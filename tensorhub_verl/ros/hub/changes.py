"""Wakes whoever waits for the hub's state to change: threads on the state's condition (a drain, an exchange that
waits for work), coroutines parked on an event loop (``/v1/wait``), which never take the state lock, and readers
parked for work (an exchange with ``wait_s``: ``ReaderPark``).

Every change of holdings bumps ``seq``. A coroutine reads ``seq`` before it looks at the state, and ``wait_async``
returns at once when it moved since: a change between the look and the wait is never missed. A coroutine may wait
on one model's changes only; a change that names no model wakes every waiter.

A reader waiting for work parks under the state lock, in the same critical section as the plan that found none
(``park_reader``), so no change can come between its look and its wait. A change of holdings, a failure, a
quarantine's end or an overdue lease (``notify``) wakes every parked reader of the model. A report of landed
reads wakes only the few that it can give work to (``wake_readers``): those the caller ranks as able to use what
the report freed, the best ranked (the nearest) first, at most as many as the slots it freed. A reader woken so that still finds
no work hands its wake on to the next such reader (``pass_on``), so a freed slot is not left idle while a reader
that could use it sleeps. Every parked reader also wakes at its own timeout.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable


@dataclass(eq=False)
class Wake:
    """One report's wake: which parked readers of ``key`` it may serve and in what order (``rank(holder)``: None,
    it cannot; else the lower, the sooner), and whom it woke."""
    key: Hashable
    rank: Callable[[str], int | None]
    tried: set[str] = field(default_factory=set)


class ReaderPark:
    """A reader's place in the queue of readers waiting for work, made on its event loop. Resolves to the ``Wake``
    that woke it (None: a broad change)."""

    __slots__ = ("loop", "future", "key", "holder", "model", "parked")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.future = loop, loop.create_future()
        self.key: Hashable = None
        self.holder, self.model = "", ""
        self.parked = False
        """Set under the state lock when the exchange parked it: the route then awaits ``Changes.wait_parked``."""


class Changes:
    def __init__(self, lock: threading.RLock):
        self.condition = threading.Condition(lock)
        self._guard = threading.Lock()
        """Guards ``seq``, the parked coroutines and readers: taken on the event loop, so never held for long."""
        self.seq = 0
        self._parked: dict[int, tuple[str | None, asyncio.AbstractEventLoop, asyncio.Future]] = {}
        """id(future) -> (the model it waits on, None: any; its loop; the future to resolve)."""
        self._readers: dict[Hashable, dict[str, ReaderPark]] = {}
        """key -> holder -> its park, in the order they parked (the oldest is woken first)."""
        self.woken = 0
        """Parked readers woken so far (every cause): ``status`` and the benchmarks count wakes."""
        self.closed = False
        """The hub is stopping: parked coroutines are woken and park no more (``close``)."""

    def notify(self, *models: str) -> None:
        """The state changed (for ``models``; none named: for all): wakes every waiter of them. The caller holds
        the state lock."""
        self.condition.notify_all()
        with self._guard:
            self.seq += 1
            woken = [self._parked.pop(i) for i, (model, _, _) in list(self._parked.items())
                     if not models or model is None or model in models]
            parks = [p for key in list(self._readers) for p in self._take_all(key, models)]
        for _model, loop, future in woken:
            loop.call_soon_threadsafe(_wake, future, None)
        self._resolve(parks, None)

    def close(self) -> None:
        """The hub is stopping: wakes every parked coroutine (a long-poll then answers at once instead of holding
        the stop until its own timeout), and none parks again."""
        with self._guard:
            self.closed = True
            woken = list(self._parked.values())
            self._parked.clear()
        for _model, loop, future in woken:
            loop.call_soon_threadsafe(_wake, future, None)

    def notify_threads(self) -> None:
        """A change only threads wait for (a registration: it adds no holding, so no parked coroutine's answer
        changes). The caller holds the state lock."""
        self.condition.notify_all()

    def park_reader(self, park: ReaderPark, key: Hashable, holder: str, model: str) -> None:
        """Queues ``holder``'s exchange for ``key`` until a change may give it work. The caller holds the state
        lock and has just found no work for it."""
        park.key, park.holder, park.model, park.parked = key, holder, model, True
        with self._guard:
            self._readers.setdefault(key, {})[holder] = park

    def wake_readers(self, wake: Wake, budget: int) -> None:
        """A report for ``wake.key`` landed: wakes up to ``budget`` parked readers that ``wake.rank`` admits, the
        best ranked first (threads on the condition all wake). The caller holds the state lock."""
        self.condition.notify_all()
        self._resolve(self._take(wake, budget), wake)

    def pass_on(self, wake: Wake) -> None:
        """A reader that ``wake`` woke found no work: the next parked reader it may serve looks instead. The caller
        holds the state lock."""
        self._resolve(self._take(wake, 1), wake)

    async def wait_parked(self, park: ReaderPark, timeout: float) -> tuple[bool, Wake | None]:
        """Awaits ``park``'s wake for at most ``timeout`` seconds; (woken, the report's wake or None). A reader
        that times out (or whose request is cancelled) leaves the queue, so no wake is spent on it."""
        try:
            return True, await asyncio.wait_for(asyncio.shield(park.future), max(0.0, timeout))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._guard:
                queue = self._readers.get(park.key)
                if queue is not None and queue.get(park.holder) is park:
                    del queue[park.holder]
                    if not queue:
                        del self._readers[park.key]
        if park.future.done():  # woken as the timeout fired: the wake is not lost
            return True, park.future.result()
        return False, None

    def parked_readers(self, key: Hashable) -> list[str]:
        """The holders parked for ``key``, oldest first."""
        with self._guard:
            return list(self._readers.get(key, ()))

    def wait(self, timeout: float) -> None:
        """Waits on a thread for the next change, at most ``timeout`` seconds; the caller holds the state lock."""
        self.condition.wait(max(0.0, timeout))

    async def wait_async(self, seen: int, timeout: float, model: str | None = None) -> None:
        """Waits on the event loop, without the state lock, until a change after ``seen`` (for ``model``, or any)
        or ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._guard:
            if self.seq != seen or self.closed:
                return
            self._parked[id(future)] = (model, loop, future)
        try:
            await asyncio.wait_for(future, max(0.0, timeout))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._guard:
                self._parked.pop(id(future), None)

    def _take_all(self, key: Hashable, models: tuple[str, ...]) -> list[ReaderPark]:
        """Under ``_guard``: every reader parked for ``key``, when it is of one of ``models`` (none: any)."""
        queue = self._readers.get(key)
        if not queue or (models and next(iter(queue.values())).model not in models):
            return []
        del self._readers[key]
        return list(queue.values())

    def _take(self, wake: Wake, budget: int) -> list[ReaderPark]:
        """Up to ``budget`` readers parked for ``wake.key`` that it has not woken and that it can serve, the best
        ranked first, then the oldest. ``rank`` runs under the state lock (the caller's), outside ``_guard``."""
        with self._guard:
            queue = list(self._readers.get(wake.key, {}).values())
        ranked = sorted((rank, age, park) for age, park in enumerate(queue)
                        if park.holder not in wake.tried and (rank := wake.rank(park.holder)) is not None)
        taken = []
        with self._guard:
            current = self._readers.get(wake.key, {})
            for _rank, _age, park in ranked:
                if len(taken) >= budget:
                    break
                if current.get(park.holder) is not park:
                    continue  # its timeout fired meanwhile
                del current[park.holder]
                wake.tried.add(park.holder)
                taken.append(park)
            if not current:
                self._readers.pop(wake.key, None)
        return taken

    def _resolve(self, parks: list[ReaderPark], wake: Wake | None) -> None:
        self.woken += len(parks)
        for park in parks:
            park.loop.call_soon_threadsafe(_wake, park.future, wake)


def _wake(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
