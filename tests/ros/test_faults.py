"""Holders that die mid-read, and a hub that restarts mid-fetch."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros.client import Client, ClientConfig

from tests.ros.roles import GatedTransport, digest, holder, make_weights

CHUNK = 256 << 10


def test_a_holder_killed_mid_read_costs_only_a_re_plan(hub, roles):
    first = roles(holder, hub.url, "h1", 4, 4.0, CHUNK).result(120)
    roles(holder, hub.url, "h2", 4, 4.0, CHUNK).result(120)

    def kill_h1(n):
        if n == 3:  # reads 1 and 2 already went out, to h1 and h2 in turn
            os.kill(first["pid"], signal.SIGKILL)

    transport = GatedTransport("reader-agent", on_read=kill_h1)
    client = Client(hub.url, "reader", config=ClientConfig(read_timeout_s=3.0, window=4), transport=transport)
    manifest = client.manifest("policy", 1)
    stats = client.fetch("policy", 1)
    assert digest(stats.buffers) == digest(make_weights(4, 4.0))
    assert stats.failed_reads >= 1
    assert stats.bytes == manifest.nbytes  # every chunk landed once: only the lost reads were redone
    assert stats.sources.get("h2", 0) > 0
    client.close()


def test_a_fetch_fails_cleanly_when_its_only_holder_dies(hub, roles):
    only = roles(holder, hub.url, "h1", 4, 4.0, CHUNK).result(120)
    transport = GatedTransport("reader-agent",
                               on_read=lambda n: n == 2 and os.kill(only["pid"], signal.SIGKILL))
    client = Client(hub.url, "reader", config=ClientConfig(read_timeout_s=2.0, window=2, fetch_timeout_s=60),
                    transport=transport)
    started = time.monotonic()
    with pytest.raises(TransferFailed, match="no holder"):
        client.fetch("policy", 1)
    # It waited for the holder to prove dead (heartbeat timeout), not for the whole fetch timeout.
    assert time.monotonic() - started < 45
    assert all("reader" not in holders for holders in client.versions("policy").values())
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_hub_process(port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "tensorhub_verl.cli", "hub", "--port", str(port),
                                "--worker-timeout", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("hub process did not start")


def test_a_hub_restart_mid_fetch_loses_nothing(roles):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    hub_process = _start_hub_process(port)
    try:
        published = roles(holder, url, "trainer", 6, 4.0, CHUNK).result(120)
        gated = GatedTransport("reader-agent", hold_after=3)
        client = Client(url, "reader", config=ClientConfig(window=1, hub_retry_s=60), transport=gated)
        result = {}
        fetch = threading.Thread(target=lambda: result.update(stats=client.fetch("policy", 1)), daemon=True)
        fetch.start()
        assert gated.holding.wait(60)
        hub_process.kill()
        hub_process.wait(10)
        hub_process = _start_hub_process(port)  # a new instance: it knows nothing
        gated.start_gate.set()
        fetch.join(120)
        assert "stats" in result, "the fetch did not survive the hub restart"
        assert digest(result["stats"].buffers) == published["digest"]
        assert sorted(client.versions("policy")[1]) == ["reader", "trainer"]  # both re-registered
        client.close()
    finally:
        hub_process.kill()
        hub_process.wait(10)
