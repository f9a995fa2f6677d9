"""`tensorhub bench hub`: load on the hub alone (no data plane): heartbeats/s and exchange latency.

A hub process, and one asyncio load process standing in for ``--workers`` workers, each heartbeating every
``--heartbeat-s`` as clients do, all along. On top, a few closed loops measure how many more heartbeats/s
the hub answers: once on an empty hub, once with ``--models`` x ``--versions`` published while ``--readers``
workers run fetches (begin, exchanges, end) and ``--waiters`` long-polls stay parked on /v1/wait -- side by
side, so the ratio shows whether a heartbeat's cost grows with what the hub holds. Reports paced heartbeat
latency p50/p99 and the longest gap, exchange p50/p99, whether the hub dropped any live worker, and the hub
process's CPU per heartbeat answered on the empty hub (paced and closed-loop together).
On a small shared machine the load process competes with the hub for the same cores. Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import logging
import random
import sys
import time

import httpx
import psutil

from tensorhub_verl.bench.control import cpu_seconds
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.ros.wire.manifest import TensorSpec, layout_digest
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER

_CHUNK = 4096
_PUBLISHERS = 4
"""Concurrent publishes while the versions are set up (a trainer publishes one version per step, not 16 at once)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench hub", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--readers", type=int, default=16, help="workers that also fetch, during the load")
    parser.add_argument("--waiters", type=int, default=40, help="parked /v1/wait long-polls during the load")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each heartbeat phase")
    parser.add_argument("--worker-timeout", type=float, default=10.0)
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="each worker's heartbeat period")
    parser.add_argument("--streams", type=int, default=8, help="closed loops measuring heartbeat capacity")
    parser.add_argument("--connections", type=int, default=64,
                        help="HTTP connections the load process shares among its workers (httpx slows down "
                             "with hundreds of pooled connections: the load process, not the hub, becomes the limit)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    hub = HubProcess(args=("--worker-timeout", str(args.worker_timeout), "--keep-versions", str(args.versions)),
                     stderr_path=os.environ.get("HUB_LOG")).start()
    try:
        report = asyncio.run(_run(hub.url, psutil.Process(hub.pid), args))
    finally:
        hub.stop()
    if not args.json:
        for key, value in report.items():
            print(f"{key:>28}: {value}")
    print(json.dumps(report))
    return 0 if report["dropped_workers"] == 0 else 1


async def _run(url: str, hub: psutil.Process, args) -> dict:
    limits = httpx.Limits(max_connections=args.connections, max_keepalive_connections=args.connections)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http, \
            httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=args.waiters + 1)) as idle:
        await _wait_up(http)
        names = [f"w{i}" for i in range(args.workers)]
        creds = dict(zip(names, await asyncio.gather(*(_register(http, w) for w in names))))
        done = asyncio.Event()
        answered = [0]
        """Heartbeats answered so far, paced and closed-loop: the hub's CPU per heartbeat on the empty hub."""
        paced = asyncio.create_task(_heartbeats(http, creds, done, args.heartbeat_s, answered))  # as clients do
        beats0, cpu0, started = answered[0], cpu_seconds(hub), time.perf_counter()
        empty = await _capacity(http, creds, args.seconds / 2, args.streams, answered)
        empty_cpu, empty_beats = cpu_seconds(hub) - cpu0, answered[0] - beats0
        empty_share = empty_cpu / (time.perf_counter() - started)
        started = time.perf_counter()
        await _publish_all(http, creds, names, args.models, args.versions)
        publish_s = time.perf_counter() - started
        stop = asyncio.Event()
        waits = [asyncio.create_task(_park(idle, f"idle{i}", stop)) for i in range(args.waiters)]
        exchanges: list[float] = []
        readers = [asyncio.create_task(_read_loop(http, f"w{i}", creds[f"w{i}"], args, exchanges, stop))
                   for i in range(min(args.readers, args.workers))]
        await asyncio.sleep(args.seconds / 2)
        loaded = await _capacity(http, creds, args.seconds / 2, args.streams, answered)
        stop.set()
        for task in waits:  # parked: no need to wait out their poll
            task.cancel()
        await asyncio.gather(*readers, *waits, return_exceptions=True)
        done.set()
        paced = await paced
        status = (await http.get("/v1/status")).json()
    dropped = sorted(set(names) - set(status["workers"]))
    return {
        "bench": "hub", "workers": args.workers, "models": args.models, "versions": args.versions,
        "published_versions": sum(len(v) for v in status["models"].values()), "publish_s": round(publish_s, 2),
        "heartbeat_capacity_per_s_empty": round(empty["rate"], 1),
        "heartbeat_capacity_per_s_loaded": round(loaded["rate"], 1),
        "capacity_ratio_loaded_vs_empty": round(loaded["rate"] / empty["rate"], 3) if empty["rate"] else None,
        "hub_cpu_per_heartbeat_ms_empty": round(1000 * empty_cpu / empty_beats, 4) if empty_beats else None,
        "hub_cpu_share_empty": round(empty_share, 3),
        "paced_heartbeats_per_s": round(paced["rate"], 1),
        "heartbeat_p50_ms": _ms(paced["latency"], 50), "heartbeat_p99_ms": _ms(paced["latency"], 99),
        "exchanges": len(exchanges), "exchange_p50_ms": _ms(exchanges, 50), "exchange_p99_ms": _ms(exchanges, 99),
        "parked_waits": args.waiters, "dropped_workers": len(dropped),
        "max_heartbeat_gap_s": round(paced["gap"], 3), "worker_timeout_s": args.worker_timeout,
    }


async def _wait_up(http: httpx.AsyncClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the hub did not start")
        await asyncio.sleep(0.1)


async def _register(http: httpx.AsyncClient, worker: str) -> str:
    reply = await http.post("/v1/workers/register", json={
        "worker": worker, "location": {"node": worker}, "agent_name": f"{worker}-agent", "agent_metadata_b64": "AAAA"})
    reply.raise_for_status()
    return reply.json()["credential"]


async def _capacity(http: httpx.AsyncClient, creds: dict[str, str], seconds: float, streams: int,
                    answered: list[int]) -> dict:
    """``streams`` closed loops cycling through the workers, each heartbeat sent when the last answered, on
    top of the workers' paced heartbeats: the extra heartbeats/s the hub still answers (a few streams:
    hundreds of concurrent httpx requests would make this Python load process, not the hub, the limit)."""
    latency: list[float] = []
    names = list(creds)
    deadline = time.perf_counter() + seconds
    if streams == 0:  # no capacity probe: only the paced load
        await asyncio.sleep(seconds)
        return {"rate": 0.0, "latency": latency}

    async def stream(offset: int) -> None:
        i = offset
        while time.perf_counter() < deadline:
            worker = names[i % len(names)]
            i += streams
            sent = time.perf_counter()
            reply = await http.post("/v1/workers/heartbeat", params={"worker": worker},
                                    headers={CREDENTIAL_HEADER: creds[worker]})
            if reply.status_code != 404:  # a dropped worker is counted at the end
                reply.raise_for_status()
                latency.append(time.perf_counter() - sent)
                answered[0] += 1

    started = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    return {"rate": len(latency) / (time.perf_counter() - started), "latency": latency}


async def _heartbeats(http: httpx.AsyncClient, creds: dict[str, str], done: asyncio.Event, period_s: float,
                      answered: list[int]) -> dict:
    """Every worker heartbeats every ``period_s``, as clients do, spread over the period, until ``done``:
    latency and the longest gap between two answered heartbeats of one worker (it must stay well under the
    hub's worker timeout)."""
    latency: list[float] = []
    gaps: list[float] = []

    async def beat(worker: str, credential: str, phase: float) -> None:
        await asyncio.sleep(phase)
        last = time.perf_counter()
        while not done.is_set():
            sent = time.perf_counter()
            reply = await http.post("/v1/workers/heartbeat", params={"worker": worker},
                                    headers={CREDENTIAL_HEADER: credential})
            if reply.status_code == 404:  # the hub dropped this worker: counted at the end, not retried
                return
            reply.raise_for_status()
            answered[0] += 1
            now = time.perf_counter()
            latency.append(now - sent)
            gaps.append(now - last)
            last = now
            try:
                await asyncio.wait_for(done.wait(), max(0.0, period_s - (now - sent)))
            except asyncio.TimeoutError:
                pass

    started = time.perf_counter()
    await asyncio.gather(*(beat(w, c, i * period_s / len(creds)) for i, (w, c) in enumerate(creds.items())))
    return {"rate": len(latency) / (time.perf_counter() - started), "latency": latency, "gap": max(gaps, default=0)}


async def _publish_all(http, creds, names, models: int, versions: int) -> None:
    queue = [(m, v) for m in range(models) for v in range(1, versions + 1)]

    async def worker_loop(offset: int) -> None:
        for m, v in queue[offset::_PUBLISHERS]:
            owner = names[(m * versions + v) % len(names)]
            reply = await http.post("/v1/publish", headers={CREDENTIAL_HEADER: creds[owner]}, json={
                "worker": owner, "holder": owner, "regions": [{"addr": 4096}], "manifest": {
                    "model": f"model{m}", "version": v, "layout": "hf", "chunk_bytes": _CHUNK,
                    "tensors": [{"name": "w", "shape": [_CHUNK], "dtype": "uint8", "nbytes": _CHUNK}],
                    "chunk_digests": ["0" * 16]}})  # the hub stores digests; only readers check them
            if reply.status_code != 404:  # its owner was dropped: the version is missing from the count
                reply.raise_for_status()

    await asyncio.gather(*(worker_loop(i) for i in range(_PUBLISHERS)))


async def _park(http: httpx.AsyncClient, model: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await http.get("/v1/wait", params={"model": model, "timeout": 5}, timeout=30)


async def _read_loop(http, worker: str, credential: str, args, exchanges: list[float], stop: asyncio.Event) -> None:
    """Fetches random versions: begin, exchange until the one chunk is booked, end (without holding)."""
    headers = {CREDENTIAL_HEADER: credential}
    rng = random.Random(worker)
    while not stop.is_set():
        key = {"model": f"model{rng.randrange(args.models)}", "version": rng.randint(1, args.versions),
               "layout": "hf"}
        found = await http.get("/v1/manifest", params=key | {"version": str(key["version"])})
        if found.status_code != 200:
            continue
        manifest = found.json()
        digest = layout_digest("hf", [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"])
                                      for t in manifest["tensors"]], manifest["chunk_bytes"])
        who = {"worker": worker, "holder": worker} | key
        begun = await http.post("/v1/fetch/begin", headers=headers,
                                json=who | {"digest": digest, "regions": [{"addr": 8192}]})
        if begun.status_code != 200:
            continue
        completed: list[int] = []
        for _ in range(20):
            sent = time.perf_counter()
            reply = await http.post("/v1/fetch/exchange", headers=headers, json=who | {"completed": completed, "want": 4})
            exchanges.append(time.perf_counter() - sent)
            body = reply.json()
            if reply.status_code != 200 or body["have"] == body["total"]:
                break
            completed = [a["lease"] for a in body["assignments"]]
        await http.post("/v1/fetch/end", headers=headers, json=who | {"ok": True, "hold": False, "wait_s": 1.0})


def _ms(samples: list[float], pct: int) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))], 2)


if __name__ == "__main__":
    sys.exit(main())
