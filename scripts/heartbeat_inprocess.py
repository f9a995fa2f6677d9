"""The hub's CPU for one heartbeat through its ASGI app, with no HTTP server or client around it.

    PYTHONPATH=. python scripts/heartbeat_inprocess.py [HEARTBEATS]

One registered worker; HEARTBEATS (default 2,000) POSTs of /v1/workers/heartbeat go through the hub's whole ASGI
stack (token gate, body limit, instance stamp, the routes) on one event loop, each awaited before the next. Prints
the process CPU per heartbeat: the hub's own share of a heartbeat, which ``bench hub``'s closed loops (their
httpx client shares the machine's cores) cannot isolate (docs/security-and-reliability.md).
"""

from __future__ import annotations

import asyncio
import sys
import time

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.app import create_app
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER


async def _beats(count: int) -> None:
    state = HubState()
    credential = state.register_worker(msg.RegisterWorker(
        worker="w", location=msg.LocationMsg(), agent_name="w-agent", agent_metadata_b64="AAAA")).credential
    app = create_app(state, token="t0ken")
    scope = {"type": "http", "method": "POST", "path": "/v1/workers/heartbeat", "query_string": b"worker=w",
             "raw_path": b"/v1/workers/heartbeat", "root_path": "", "scheme": "http", "http_version": "1.1",
             "server": ("hub", 80), "client": ("worker", 1), "asgi": {"version": "3.0"},
             "headers": [(b"authorization", b"Bearer t0ken"), (CREDENTIAL_HEADER.lower().encode(), credential.encode()),
                         (b"content-length", b"0")]}
    statuses: list[int] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.process_time()
    for _ in range(count):
        await app(dict(scope), receive, send)
    cpu = time.process_time() - started
    if set(statuses) != {200}:
        raise SystemExit(f"heartbeats were refused: statuses {sorted(set(statuses))}")
    print(f"{count} heartbeats through the hub's ASGI app: {1e6 * cpu / count:.0f} us of CPU each")


if __name__ == "__main__":
    asyncio.run(_beats(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
