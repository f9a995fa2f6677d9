"""Runs the hub's state calls for its async routes: on a small pool of state threads, off the event loop, or, for
the fetch path's short calls, on the loop itself when the state's lock is free.

The event loop never waits for the state's lock (``hub.app``'s rule): an async route (the fetch path, a long-poll, a
heartbeat that must clear a suspicion) hands each state call here and awaits it, so neither a long ``status()`` nor
a drain stalls the loop, and these calls never queue behind Starlette's pool, where drains and publishes may wait
for seconds.

``short`` is for calls that never wait inside (the fetch path's begin and exchange: bounded work under the lock, no
condition wait). It takes the lock without blocking and, when it gets it, runs the call right there on the loop:
no hand-off to a thread and back (a submit, a thread wake, a future chained to the loop), which under many readers
in flight costs about as much as the call. When another thread holds the lock, the call goes to a state thread as
any other, so the loop still never waits for the lock.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor

STATE_THREADS = 8
"""Threads that run the async routes' state calls: each call is short (a lock and O(1) to O(want) work)."""


class StateCalls:
    """``await off_loop(fn, *args)`` runs ``fn(*args)`` on a state thread. One pool per process, made on first use:
    the hubs of one process (tests start many) share it, and its idle threads end with the process."""

    _pool: ThreadPoolExecutor | None = None
    _made = threading.Lock()

    async def __call__(self, fn, *args):
        with self._made:
            if StateCalls._pool is None:
                StateCalls._pool = ThreadPoolExecutor(STATE_THREADS, thread_name_prefix="tensorhub-hub-state")
        return await asyncio.get_running_loop().run_in_executor(StateCalls._pool, functools.partial(fn, *args))

    async def short(self, lock: threading.RLock, fn, *args):
        """``fn(*args)``, which takes ``lock`` (re-entrant) and never waits while holding it: on the loop when
        ``lock`` is free now, else on a state thread."""
        if lock.acquire(blocking=False):
            try:
                return fn(*args)
            finally:
                lock.release()
        return await self(fn, *args)


class InlineCalls:
    """Runs every state call at once on the caller's loop: drivers of the routes in one process (tests, the
    in-process bench), where the state's calls run on one loop and no thread."""

    async def __call__(self, fn, *args):
        return fn(*args)

    async def short(self, lock: threading.RLock, fn, *args):
        return fn(*args)


__all__ = ["STATE_THREADS", "InlineCalls", "StateCalls"]
