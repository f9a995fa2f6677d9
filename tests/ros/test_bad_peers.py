"""Dead, frozen and lying peers cost a reader a re-plan, never a raw data-plane exception or a read timeout."""

import os
import signal

import pytest

import tensorhub_verl as th
from tensorhub_dev.bench.soak_roles import impostor
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes import factory
from tensorhub_verl.ros.planes.base import ReadState
from tensorhub_verl.ros.planes.nixl import NixlPlane

from tests.ros.roles import GatedPlane, digest, holder, make_weights

CHUNK = 256 << 10


def test_peers_with_unusable_metadata_cost_a_re_plan(hub, roles):
    published = roles(holder, hub.url, "trainer", 5, 4.0, CHUNK).result(120)
    impostor(hub.url, "garbage", os.urandom(300))  # NIXL: nixlMismatchError
    other = NixlPlane("someone-else")
    try:
        impostor(hub.url, "liar", other.metadata())  # metadata of another agent
        client = Client(hub.url, "reader", config=ClientConfig.from_fields(window=4, fetch_timeout_s=60))
        assert sorted(client.versions("policy")[1]) == ["garbage", "liar", "trainer"]
        stats = client.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"]
        assert set(stats.sources) == {"trainer"}
        assert stats.failed_reads >= 1  # the impostors were tried, failed fast, and were planned around
        client.close()
    finally:
        other.close()


@pytest.fixture
def quick_hub():
    server = th.start_hub(config=th.HubConfig(worker_timeout_s=3.0, heartbeat_s=0.5, suspect_s=2.0, plane="tcp"))
    yield server
    server.stop()


def test_a_frozen_holder_costs_about_one_heartbeat_timeout_not_a_read_timeout(quick_hub, roles, monkeypatch):
    # Over TCP a read needs the holder's CPU, so a frozen holder hangs it (shared memory reads a stopped
    # process's memory without it). Holders and reader inherit this.
    monkeypatch.setenv("UCX_TLS", "tcp")
    hub = quick_hub
    frozen = roles(holder, hub.url, "h1", 7, 4.0, CHUNK).result(120)
    roles(holder, hub.url, "h2", 7, 4.0, CHUNK).result(120)
    stopped = []

    def freeze_h1(n):
        if n == 3:
            os.kill(frozen["pid"], signal.SIGSTOP)
            stopped.append(True)

    # The hub's plane, which the holders took (TCP streams), so that the reader can read from them.
    transport = GatedPlane("reader-agent", on_read=freeze_h1,
                           inner=factory.create(ClientConfig().plane, "reader", hub.url, 30.0,
                                                 hub_plane=hub.state.plane))
    # A read timeout far beyond the fetch timeout, and no straggler cut-off (a frozen holder looks like one:
    # test_a_straggler_holder_...): only the hub's verdict on h1 can save this fetch.
    client = Client(hub.url, "reader", plane=transport,
                    config=ClientConfig.from_fields(window=4, read_timeout_s=600, fetch_timeout_s=90,
                                                    straggler_factor=0))
    try:
        stats = client.fetch("policy", 1)
        assert stopped
        assert digest(stats.buffers) == digest(make_weights(7, 4.0))
        assert stats.cancelled_reads >= 1, "no read was cancelled when the hub dropped the frozen holder"
        assert "h1" not in client.versions("policy")[1]
    finally:
        os.kill(frozen["pid"], signal.SIGKILL)
        client.close()


class _NeverFrom(GatedPlane):
    """Reads from agents whose name starts with ``prefix`` never finish: a holder far slower than its peers."""

    def __init__(self, name: str, prefix: str):
        super().__init__(name)
        self.prefix = prefix
        self.stuck: list[object] = []

    def _start_read(self, peer, copies, grant, wake):
        handle = super()._start_read(peer, copies, grant, wake)
        if peer.startswith(self.prefix):
            self.stuck.append(handle)
        return handle

    def poll(self, handle):
        return ReadState.IN_PROGRESS if any(handle is h for h in self.stuck) else super().poll(handle)


def test_a_straggler_holder_costs_a_re_plan_not_a_read_timeout(hub, roles):
    published = roles(holder, hub.url, "trainer", 11, 4.0, CHUNK).result(120)
    roles(holder, hub.url, "slow", 11, 4.0, CHUNK).result(120)  # the same bytes, on a hopeless link
    transport = _NeverFrom("reader-agent", prefix="slow-")
    # A read timeout beyond the fetch timeout: only abandoning the straggler's reads can finish this fetch.
    client = Client(hub.url, "reader", plane=transport,
                    config=ClientConfig.from_fields(window=4, read_timeout_s=600, fetch_timeout_s=90))
    try:
        stats = client.fetch("policy", 1)
        assert transport.stuck, "the straggler was never asked for a chunk"
        assert digest(stats.buffers) == published["digest"]
        assert set(stats.sources) == {"trainer"} and stats.failed_reads >= 1
    finally:
        client.close()
