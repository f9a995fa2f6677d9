"""The hub's HTTP routes over a real server: a route that waits never stops the others."""

import threading

import tensorhub_verl as th
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.wire.convert import manifest_to_msg
from tests.waits import wait_until

CHUNK = 4096
M = Manifest("policy", 1, "hf", (TensorSpec("w", (4 * CHUNK,), "uint8", 4 * CHUNK),), CHUNK, "f1",
             ("0" * 16,) * 4)


def _worker(url: str, name: str) -> HubClient:
    hub = HubClient(url, request_timeout_s=30)
    hub.post(msg.REGISTER_PATH, msg.RegisterWorker(worker=name, location=msg.LocationMsg(), agent_name=f"{name}-agent",
                                                   agent_metadata_b64="bWV0YQ=="), msg.WorkerAck)
    return hub


def _begin(hub: HubClient, name: str) -> None:
    hub.post("/v1/fetch/begin", msg.BeginFetch(worker=name, holder=name, model="policy", version=1, layout="hf",
                                               digest=M.digest, regions=[msg.RegionMsg(addr=2000)]),
             msg.BeginFetchReply)


def _exchange(hub: HubClient, name: str, completed=(), want=0) -> msg.ExchangeReply:
    return hub.post("/v1/fetch/exchange", msg.Exchange(worker=name, holder=name, model="policy", version=1, layout="hf",
                                                       completed=list(completed), want=want), msg.ExchangeReply)


def _wait_until_draining(hub: HubClient, holder: str, timeout: float = 30.0) -> None:
    def draining() -> bool:
        holders = hub.get("/v1/status", msg.StatusReply).models["policy"][0].holders
        return any(h.holder == holder and h.state == "draining" for h in holders)

    wait_until(draining, timeout, f"{holder} did not start draining", poll_s=0.02)


def test_a_fetch_end_draining_its_holding_does_not_stop_the_reports_it_waits_for():
    server = th.start_hub()
    try:
        trainer, early, late = (_worker(server.url, n) for n in ("trainer", "early", "late"))
        trainer.post("/v1/publish", msg.Publish(worker="trainer", holder="trainer", manifest=manifest_to_msg(M),
                                                regions=[msg.RegionMsg(addr=1000)]), msg.OkReply)
        _begin(early, "early")
        first = _exchange(early, "early", want=1).assignments
        _exchange(early, "early", completed=[a.lease for a in first])
        _begin(late, "late")
        from_early = [a for a in _exchange(late, "late", want=4).assignments if a.source == "early"]
        assert from_early, "the late reader should read the chunk the early one holds (pipelined replication)"

        # "early" gives its holding up while "late" still reads from it: the end waits for that read to be reported.
        ended: dict = {}

        def end() -> None:
            ended["ack"] = early.post("/v1/fetch/end", msg.EndFetch(
                worker="early", holder="early", model="policy", version=1, layout="hf", ok=False, hold=False,
                wait_s=20.0), msg.EndFetchAck)

        ender = threading.Thread(target=end)
        ender.start()
        _wait_until_draining(late, "early")  # the end is parked in its drain
        _exchange(late, "late", completed=[a.lease for a in from_early])  # answered while the end waits
        ender.join(30)
        assert not ender.is_alive()
        # Drained, not given up: the end's wait (20 s) is shorter than a lease's life (30 s), so only the
        # late reader's report could bring the reads to zero. Had the parked end held that report up, its wait
        # would have run out first and it would answer drained=False with the read still counted.
        assert ended["ack"].drained and ended["ack"].inflight == 0
    finally:
        server.stop()


def test_parked_exchanges_hold_no_threads_that_registration_and_publish_need():
    """More readers than the hub's thread pool (40) wait for work (wait_s=10) while the only source is busy:
    a new worker registers and publishes while every one of them is still parked."""
    parked = 48
    server = th.start_hub(config=th.HubConfig(planner=th.PlannerConfig(max_inflight_per_source=1)))
    asked: set[str] = set()
    exchange = server.state.exchange

    def counting_exchange(req, *park):
        asked.add(req.worker)
        return exchange(req, *park)

    server.state.exchange = counting_exchange
    try:
        trainer, busy = _worker(server.url, "trainer"), _worker(server.url, "busy")
        trainer.post("/v1/publish", msg.Publish(worker="trainer", holder="trainer", manifest=manifest_to_msg(M),
                                                regions=[msg.RegionMsg(addr=1000)]), msg.OkReply)
        _begin(busy, "busy")
        assert _exchange(busy, "busy", want=1).assignments  # the source's one read slot, never reported
        readers = {f"r{i}": _worker(server.url, f"r{i}") for i in range(parked)}
        replies: dict[str, msg.ExchangeReply] = {}

        def wait_for_work(name: str) -> None:
            _begin(readers[name], name)
            replies[name] = readers[name].post("/v1/fetch/exchange", msg.Exchange(
                worker=name, holder=name, model="policy", version=1, layout="hf", want=1, wait_s=10.0),
                msg.ExchangeReply, timeout=40)

        threads = [threading.Thread(target=wait_for_work, args=(n,)) for n in readers]
        for t in threads:
            t.start()
        wait_until(lambda: len(asked - {"busy"}) >= parked, 30, "not every reader's exchange reached the hub",
                   poll_s=0.02)
        assert len(asked - {"busy"}) == parked, "not every reader's exchange reached the hub"
        newcomer = _worker(server.url, "newcomer")
        newcomer.post("/v1/publish", msg.Publish(worker="newcomer", holder="newcomer", manifest=manifest_to_msg(
            Manifest("other", 1, "hf", M.tensors, CHUNK, "f2", M.chunk_digests)), regions=[msg.RegionMsg(addr=3000)]),
            msg.OkReply)
        still_parked = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join(40)
        assert still_parked == parked, f"{parked - still_parked} parked exchanges ended before a registration and " \
                                       f"a publish were answered: they held the threads those needed"
        assert all(not r.assignments for r in replies.values()) and len(replies) == parked
    finally:
        server.stop()
