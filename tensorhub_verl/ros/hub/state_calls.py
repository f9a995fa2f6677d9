"""Runs the hub's state calls for its async routes on a small pool of state threads, off the event loop.

The event loop never takes the state's lock (``hub.app``'s rule): an async route (the fetch path, a long-poll, a
heartbeat that must clear a suspicion) hands each state call here and awaits it, so neither a long ``status()`` nor a drain stalls the loop,
and these calls never queue behind Starlette's pool, where drains and publishes may wait for seconds.
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


__all__ = ["STATE_THREADS", "StateCalls"]
