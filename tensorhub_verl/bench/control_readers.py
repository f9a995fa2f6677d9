"""One load process of `tensorhub bench control`: many synthetic readers of one version, on one event loop.

A synthetic reader speaks the real protocol (register, /v1/fetch/begin, /v1/fetch/exchange until every chunk is
booked, /v1/fetch/end holding the version) but moves no bytes: each assigned read "lands" at once, or after
``1 / rate`` seconds per chunk when a per-reader rate is set (reads of one reader land one after another, as
they would on one NIC). It reports as the real fetcher does: the landed leases go with the next exchange, which
asks for a full window, each lease a run of up to ``run_chunks`` chunks (``Exchange.run_chunks``). A reader
with nothing in flight asks with a 0.2 s wait, as the fetcher does: its landed reads go with that exchange,
which the hub parks until it has work for the reader.

With several hub shards (``bench control --shards K``) a reader registers with the shards the job lists for it
(``reader_shards``) and fetches their shares of the version at once (one begin, exchanges and end per shard): every
shard when the version is split by chunks, as a sharded client does; one when the readers are split.

With relays (``bench control --relay-fanout``), as ``RegionalClient`` does: a reader of a region the driver marks
``fed`` first long-polls its hub (``/v1/wait``) until the version's relay marker is visible there; a reader that
completed the version, among the first two of its region (``regions.relays_from_here``), registers with each child
region's hub that has no relay marker yet and publishes its copy there as ``<reader>~relay``, then the marker.

Protocol with the driver (``bench.control``): stdin gets one JSON job; the process registers its readers and
prints ``ready``; it starts the fetches when it reads ``go``; its last stdout line is its JSON result.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
import time

import httpx

from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER, HOLDER_SEPARATOR, RELAY_SUFFIX, STANDBY_SUFFIX
from tensorhub_verl.ros.wire.regions import complete_holders, relay_layout, relay_wanted, relays_from_here

_IDLE_WAIT_S = 0.2


async def _register(http: httpx.AsyncClient, worker: str, location: dict, grants: bool) -> str:
    body = {"worker": worker, "location": location, "agent_name": f"{worker}-agent", "agent_metadata_b64": "AAAA"}
    if grants:
        body["grant_key_b64"] = base64.b64encode(os.urandom(32)).decode()
        body["plane"] = "tcp"
    reply = await http.post("/v1/workers/register", json=body)
    reply.raise_for_status()
    return reply.json()["credential"]


class _Reader:
    def __init__(self, name: str, shards: list[dict], credentials: list[str], job: dict, stop_at: float):
        self.name = name
        self.shards = shards
        self.headers = [{CREDENTIAL_HEADER: credential} for credential in credentials]
        self.job = job
        self.stop_at = stop_at
        self.exchanges = 0
        self.assigned = 0
        """Chunk reads assigned (a run lease counts its chunks)."""
        self.leases = 0
        self.from_peers = 0
        """Chunk reads assigned to another reader (not the trainer): the swarm spreading."""
        self.from_trainer = 0
        self.from_relays = 0
        """Chunk reads assigned to another region's reader's relay copy (a part of ``from_peers``)."""
        self.relays = 0
        self.relay_polls = 0
        self.waits: list[float] = []
        """Seconds per exchange that got work (the begin's, and those that parked until some came)."""
        self.idle_waits = 0
        self.done = False
        self.seconds = 0.0

    async def run(self, https: list[httpx.AsyncClient], every: list[httpx.AsyncClient]) -> None:
        started = time.perf_counter()
        done = await asyncio.gather(*(self._share(http, headers, shard) for http, headers, shard
                                      in zip(https, self.headers, self.shards)))
        self.seconds = time.perf_counter() - started
        self.done = all(done)
        if self.done and len(self.shards) == 1 and self.shards[0].get("children"):
            await self._relay(https[0], self.headers[0], [every[i] for i in self.shards[0]["children"]])

    async def _holders(self, http: httpx.AsyncClient, headers: dict, layout: str) -> list[str]:
        """The active, complete holders of the version in a hub, as ``RegionalClient`` finds them."""
        reply = await http.get("/v1/status", headers=headers)
        reply.raise_for_status()
        return complete_holders(reply.json(), self.job["model"], 1, layout)

    async def _versions(self, http: httpx.AsyncClient, headers: dict, layout: str) -> dict[int, list[str]]:
        reply = await http.get("/v1/versions", headers=headers, params={"model": self.job["model"], "layout": layout})
        reply.raise_for_status()
        return {int(v): holders for v, holders in reply.json()["versions"].items()}

    async def _await_relay(self, http: httpx.AsyncClient, headers: dict, layout: str) -> bool:
        """Long-polls the hub until the relay marker of the version is visible (``RegionalClient._await_relay``)."""
        while time.perf_counter() < self.stop_at:
            self.relay_polls += 1
            reply = await http.get("/v1/wait", headers=headers, params={
                "model": self.job["model"], "newer_than": 0, "layout": relay_layout(layout),
                "timeout": max(0.1, min(10.0, self.stop_at - time.perf_counter()))})
            reply.raise_for_status()
            if reply.json()["version"] is not None:
                return True
        return False

    async def _relay(self, home: httpx.AsyncClient, headers: dict, children: list[httpx.AsyncClient]) -> None:
        """As ``RegionalClient._relay``, with its rules (``regions.relays_from_here``, ``regions.relay_wanted``):
        the copy as ``<reader>~relay`` and the relay marker, in each child region where the version is visible and
        no marker is yet. The requests are the client's (``Client.relay``, ``Client.publish``) without bytes."""
        shard = self.shards[0]
        if not relays_from_here(self.name, await self._holders(home, headers, shard["layout"])):
            return
        marker_layout = relay_layout(shard["layout"])
        for http in children:
            credential = await _register(http, self.name, self.job["location_of"][self.name], self.job["grants"])
            child = {CREDENTIAL_HEADER: credential}
            if not relay_wanted(1, await self._versions(http, child, shard["layout"]),
                                await self._versions(http, child, marker_layout)):
                continue
            for holder, manifest in ((self.name + RELAY_SUFFIX, shard["manifest"]),
                                     (self.name, shard["marker_manifest"])):
                reply = await http.post("/v1/publish", headers=child, json={
                    "worker": self.name, "holder": holder, "regions": [{"addr": 1 << 20}], "manifest": manifest})
                reply.raise_for_status()
            self.relays += 1

    async def _share(self, http: httpx.AsyncClient, headers: dict, shard: dict) -> bool:
        """One shard's share of the version, begin to end; False when the point's time ran out first."""
        job = self.job
        who = {"worker": self.name, "holder": self.name, "model": job["model"], "version": 1,
               "layout": shard["layout"]}
        window = job["window"]
        if shard.get("fed") and not await self._await_relay(http, headers, shard["layout"]):
            return False
        started = time.perf_counter()
        sent = time.perf_counter()
        reply = await http.post("/v1/fetch/begin", headers=headers, json=who | {
            "digest": shard["digest"], "regions": [{"addr": 1 << 20}], "want": window,
            "run_chunks": job["run_chunks"]})
        reply.raise_for_status()
        self.waits.append(time.perf_counter() - sent)
        self.exchanges += 1
        body = reply.json()["first"]
        while True:
            leases = [a["lease"] for a in body["assignments"]]
            chunks = sum(a["count"] for a in body["assignments"])
            self.assigned += chunks
            self.leases += len(leases)
            for a in body["assignments"]:
                trainer = a["source"].split(HOLDER_SEPARATOR)[0] == "trainer"
                self.from_trainer += a["count"] if trainer else 0
                self.from_peers += 0 if trainer else a["count"]
                self.from_relays += a["count"] if a["source"].endswith(RELAY_SUFFIX) else 0
            if body["have"] == body["total"] and not leases:
                break
            if leases and job["rate"]:
                await asyncio.sleep(chunks / job["rate"])
            if time.perf_counter() > self.stop_at:
                return False
            sent = time.perf_counter()
            reply = await http.post("/v1/fetch/exchange", headers=headers, json=who | {
                "completed": leases, "want": window, "run_chunks": job["run_chunks"], "wait_s": _IDLE_WAIT_S})
            reply.raise_for_status()
            self.exchanges += 1
            body = reply.json()
            if body["assignments"]:
                self.waits.append(time.perf_counter() - sent)
            else:
                self.idle_waits += 1
            if body["revoked"]:
                raise RuntimeError(f"{self.name}: leases revoked {body['revoked'][:4]}: the bench outran lease_ttl")
        reply = await http.post("/v1/fetch/end", headers=headers, json=who | {
            "ok": True, "hold": True, "seconds": time.perf_counter() - started, "wait_s": 5.0})
        reply.raise_for_status()
        return True


async def _main(job: dict) -> dict:
    limits = httpx.Limits(max_connections=job["connections"], max_keepalive_connections=job["connections"])
    async with contextlib.AsyncExitStack() as stack:
        https = [await stack.enter_async_context(httpx.AsyncClient(base_url=shard["url"], timeout=120,
                                                                   limits=limits)) for shard in job["shards"]]
        names, mine = job["readers"], job["reader_shards"]
        creds = await asyncio.gather(*(asyncio.gather(*(_register(https[i], n, loc, job["grants"]) for i in own))
                                       for n, loc, own in zip(names, job["locations"], mine)))
        print("ready", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise RuntimeError(f"expected 'go' from the driver, got {line!r}")
        stop_at = time.perf_counter() + job["max_seconds"]
        readers = [_Reader(n, [job["shards"][i] for i in own], c, job, stop_at)
                   for n, own, c in zip(names, mine, creds)]
        await asyncio.gather(*(r.run([https[i] for i in own], https) for r, own in zip(readers, mine)))
    waits = [w for r in readers for w in r.waits]
    return {"readers": len(readers), "done": sum(r.done for r in readers),
            "exchanges": sum(r.exchanges for r in readers), "idle_waits": sum(r.idle_waits for r in readers),
            "reads": sum(r.assigned for r in readers), "leases": sum(r.leases for r in readers),
            "from_peers": sum(r.from_peers for r in readers),
            "from_trainer": sum(r.from_trainer for r in readers), "from_relays": sum(r.from_relays for r in readers),
            "relays": sum(r.relays for r in readers), "relay_polls": sum(r.relay_polls for r in readers),
            "max_wait_s": max(waits, default=0.0),
            "waits": sorted(waits)[:: max(1, len(waits) // 2000)],
            "reader_seconds": [r.seconds for r in readers if r.done]}


def main() -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    job = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(_main(job))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
