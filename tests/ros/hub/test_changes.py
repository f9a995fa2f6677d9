"""The change notifier alone: a parked coroutine wakes on a change of its model, not another's, and never misses
a change that came between its look and its wait."""

import asyncio
import threading

from tensorhub_verl.ros.hub.changes import Changes


def test_a_parked_coroutine_wakes_on_its_models_change_only():
    lock = threading.RLock()
    changes = Changes(lock)

    async def scenario():
        seen = changes.seq
        waiter = asyncio.ensure_future(changes.wait_async(seen, 30.0, "m"))
        await asyncio.sleep(0)
        other = threading.Thread(target=lambda: _notify(lock, changes, "other"))
        other.start()
        other.join(10.0)
        for _ in range(3):  # a wake-up is scheduled on the loop: let it run, if there is one
            await asyncio.sleep(0)
        assert not waiter.done(), "a change of another model woke the waiter"
        threading.Thread(target=lambda: _notify(lock, changes, "m")).start()
        await asyncio.wait_for(waiter, timeout=10.0)

    asyncio.run(scenario())
    assert changes.seq == 2


def test_a_change_before_the_wait_returns_at_once():
    lock = threading.RLock()
    changes = Changes(lock)
    seen = changes.seq
    _notify(lock, changes, "m")
    asyncio.run(asyncio.wait_for(changes.wait_async(seen, 30.0, "m"), timeout=10.0))


def test_the_wait_ends_at_its_timeout_without_a_change():
    changes = Changes(threading.RLock())
    asyncio.run(asyncio.wait_for(changes.wait_async(changes.seq, 0.01, "m"), timeout=10.0))
    assert changes.seq == 0


def test_a_thread_waiting_on_the_condition_is_woken():
    lock = threading.RLock()
    changes = Changes(lock)
    woke = threading.Event()

    def waiter():
        with lock:
            ready.set()
            changes.wait(30.0)
        woke.set()

    ready = threading.Event()
    thread = threading.Thread(target=waiter)
    thread.start()
    assert ready.wait(10.0)
    _notify(lock, changes)
    assert woke.wait(10.0)
    thread.join(10.0)


def _notify(lock, changes, *models):
    with lock:
        changes.notify(*models)
