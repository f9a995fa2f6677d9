"""Which parked readers a change wakes, on a real ``HubState`` through the hub's own exchange route
(``fetch_routes.exchange``: parking under the state lock, ``Changes``), its state calls run on the test's loop.

The trainer serves one read at a time (``max_inflight_per_source=1``), so readers that find its slot taken park.
A report of landed reads wakes only the parked readers it can serve, the nearest first, at most the slots it
freed; a reader parked for work nobody can give still wakes at its timeout, on an unpublish, on a source's
failure and when a holder completes the version."""

from __future__ import annotations

import asyncio
import threading

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub import fetch_routes
from tensorhub_verl.ros.hub.state_calls import InlineCalls
from tensorhub_verl.ros.hub.changes import Changes, ReaderPark, Wake
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_verl.ros.wire.convert import manifest_to_msg
from tests.ros.hub.parts import manifest

CHUNKS = 64
M = manifest("m", 1, CHUNKS)
KEY = ("m", 1, "hf")
WHO = {"model": "m", "version": 1, "layout": "hf"}


class Hub:
    """A hub whose trainer (node t) publishes ``M``; readers register on the nodes given."""

    def __init__(self, readers: dict[str, str]):
        self.state = HubState(HubConfig(lease_ttl_s=3600, worker_timeout_s=3600,
                                        planner=PlannerConfig(max_inflight_per_source=1)))
        self.creds = {name: self._register(name, node) for name, node in {"trainer": "t", **readers}.items()}
        self.state.publish(msg.Publish(worker="trainer", holder="trainer", regions=[msg.RegionMsg(addr=1 << 20)],
                                       manifest=manifest_to_msg(M).model_copy(
                                           update={"chunk_digests": ["0" * 16] * CHUNKS})))

    def _register(self, name: str, node: str) -> str:
        return self.state.register_worker(msg.RegisterWorker(
            worker=name, location=msg.LocationMsg(dc="dc0", rack="k0", node=node), agent_name=f"{name}-x",
            agent_metadata_b64="AAAA")).credential

    def begin(self, name: str, have=()) -> None:
        self.state.begin_fetch(msg.BeginFetch(worker=name, holder=name, digest=M.digest, have=list(have),
                                              regions=[msg.RegionMsg(addr=1 << 20)], **WHO))

    def exchange(self, name: str, completed=(), failed=(), wait_s: float = 0.0, want: int = 1,
                 run_chunks: int = 1024):
        return fetch_routes.exchange(self.state, InlineCalls(), msg.Exchange(
            worker=name, holder=name, completed=list(completed), failed=list(failed), want=want,
            run_chunks=run_chunks, wait_s=wait_s, **WHO), self.creds[name])

    async def park(self, *names: str) -> dict[str, asyncio.Task]:
        """Each reader's exchange waiting for work, once all are parked."""
        tasks = {n: asyncio.create_task(self.exchange(n, wait_s=10.0)) for n in names}
        for _ in range(100):
            await asyncio.sleep(0)
            if set(self.state.changes.parked_readers(KEY)) == set(names):
                return tasks
        raise AssertionError(f"not all of {names} parked: {self.state.changes.parked_readers(KEY)}")


async def _settle() -> None:
    for _ in range(20):  # wakes are scheduled on the loop: let the woken exchanges run
        await asyncio.sleep(0)


def test_a_report_wakes_only_the_readers_it_can_serve_nearest_first_and_no_more_than_its_slots():
    async def scenario():
        # a (node n0) takes the trainer's only slot for a run of 16 chunks; b and e (n0) and c (n1) lack them,
        # d already has them.
        hub = Hub({"a": "n0", "b": "n0", "c": "n1", "d": "n2", "e": "n0"})
        hub.begin("a")
        (lease,) = (await hub.exchange("a", want=1, run_chunks=16)).assignments
        assert lease.source == "trainer" and lease.count == 16
        for name in ("b", "c", "e"):
            hub.begin(name)
        hub.begin("d", have=range(lease.chunk, lease.chunk + lease.count))
        tasks = await hub.park("b", "c", "e", "d")
        woken = hub.state.changes.woken
        await hub.exchange("a", completed=[lease.lease], want=0)  # a serves 16 chunks; the trainer's slot is free
        await _settle()
        # Budget: the freed slot + a's one slot = 2, to a's node first: b and e, each served (one by a, one by
        # the trainer); c (another node) and d (it lacks none of a's chunks) are not woken.
        assert hub.state.changes.woken - woken == 2
        assert sorted(a.source for n in ("b", "e") for a in tasks[n].result().assignments) == ["a", "trainer"]
        assert not tasks["c"].done() and not tasks["d"].done()
        assert hub.state.changes.parked_readers(KEY) == ["c", "d"]
        for task in tasks.values():
            task.cancel()
    asyncio.run(scenario())


def test_a_reader_parked_for_work_nobody_can_give_wakes_on_its_timeout():
    async def scenario():
        hub = Hub({"a": "n0", "b": "n1"})
        hub.begin("a")
        assert (await hub.exchange("a", want=8)).assignments
        hub.begin("b")
        reply = await hub.exchange("b", wait_s=0.05)
        assert not reply.assignments and reply.have == 0
        assert hub.state.changes.parked_readers(KEY) == []  # it left the queue
    asyncio.run(scenario())


def test_a_parked_reader_wakes_on_a_source_failure_and_on_unpublish():
    async def scenario():
        hub = Hub({"a": "n0", "b": "n1"})
        hub.begin("a")
        (lease,) = (await hub.exchange("a", want=8)).assignments
        hub.begin("b")

        # a source's failure: a's read from the trainer failed; every parked reader looks again (b then finds
        # the trainer suspect and parks again)
        tasks = await hub.park("b")
        woken = hub.state.changes.woken
        await hub.exchange("a", failed=[msg.FailedRead(lease=lease.lease, reason="peer reset")], want=0)
        await _settle()
        assert hub.state.changes.woken - woken == 1
        assert hub.state.changes.parked_readers(KEY) == ["b"] and not tasks["b"].done()

        # an unpublish: the only source leaves; b wakes, looks again, and waits on (a holder may come)
        hub.state.unpublish(msg.Unpublish(worker="trainer", holder="trainer", wait_s=0.0, **WHO))
        await _settle()
        assert hub.state.changes.woken - woken == 2
        assert hub.state.changes.parked_readers(KEY) == ["b"]
        tasks["b"].cancel()
    asyncio.run(scenario())


def test_changes_wakes_by_rank_within_the_budget_and_a_wake_it_cannot_use_is_handed_on():
    async def scenario():
        lock = threading.RLock()
        changes = Changes(lock)
        loop = asyncio.get_running_loop()
        parks = {}
        for name in ("p", "q", "r", "s"):
            parks[name] = ReaderPark(loop)
            changes.park_reader(parks[name], "k", name, "m")
        ranks = {"p": None, "q": 2, "r": 1, "s": 2}
        wake = Wake("k", ranks.get)
        with lock:
            changes.wake_readers(wake, 2)
        await _settle()
        assert [n for n, p in parks.items() if p.future.done()] == ["q", "r"]  # r first, then q (older than s)
        assert parks["r"].future.result() is wake
        changes.pass_on(wake)  # q found nothing: s, the only other one it may serve, looks instead
        await _settle()
        assert parks["s"].future.done() and not parks["p"].future.done()
        changes.pass_on(wake)  # nobody left that it may serve: p (rank None) stays parked
        await _settle()
        assert not parks["p"].future.done() and changes.parked_readers("k") == ["p"]
        assert await changes.wait_parked(parks["p"], 0.01) == (False, None)
        assert changes.parked_readers("k") == []
    asyncio.run(scenario())


def test_a_cancelled_parked_exchange_leaves_the_queue():
    async def scenario():
        hub = Hub({"a": "n0", "b": "n1"})
        hub.begin("a")
        assert (await hub.exchange("a", want=8)).assignments
        hub.begin("b")
        tasks = await hub.park("b")
        tasks["b"].cancel()  # the client went away
        await _settle()
        assert hub.state.changes.parked_readers(KEY) == []
    asyncio.run(scenario())
