"""Where a worker can send others, attacked from outside: a token holder registers TCP-plane metadata naming
another port of this host (a stand-in service that records what reaches it), holds a copy of a published version,
and waits. A joiner must not connect there at registration (only holders that served good reads at the address
they registered from are named to joiners), and a reader planned on that copy must send it no request frame (the
holder speaks first, and the reader checks that it is the agent it meant). Real hub, real clients, real sockets."""

import socket
import threading
import time

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.ros.planes import tcp_wire
from tests.ros.outsiders import Outsider

TOKEN = "trust-peers-token"
CHUNK = 4096
WEIGHTS = {"w": torch.arange(16 * CHUNK // 4, dtype=torch.float32)}  # 16 chunks


class Service:
    """Another process's port on this host: it accepts, never speaks, and records every byte it is sent."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.received = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            reader = threading.Thread(target=self._drain, args=(conn,), daemon=True)
            self._threads.append(reader)
            reader.start()

    def _drain(self, conn):
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.received += len(data)

    def close(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.listener.close()


@pytest.fixture
def hub():
    server = th.start_hub(token=TOKEN, config=th.HubConfig(heartbeat_s=0.5, suspect_s=1.0, plane="tcp"))
    yield server
    server.stop()


def test_metadata_naming_another_port_gets_no_joiner_connection_and_no_request_frame(hub):
    service = Service()
    metadata = tcp_wire.encode_metadata("mallory-agent", "127.0.0.1", service.port)
    with th.connect(hub.url, "trainer", token=TOKEN, chunk_bytes=CHUNK, job_key="job-a") as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        mallory = Outsider(hub.url, TOKEN, "mallory", job_key="job-m", metadata=metadata)
        try:
            mallory.publish_copy(published)  # a newest holder, on a plane that checks grants
            assert sorted(trainer.versions("policy")[1]) == ["mallory", "trainer"]
            with th.connect(hub.url, "joiner", token=TOKEN, job_key="job-a", preconnect_peers=4):
                time.sleep(1.0)  # a pre-connect starts at once, in the background
                assert service.connections == 0, "a joiner connected where mallory's metadata pointed"
            for i in range(3):  # readers planned on mallory's copy read elsewhere after a re-plan
                with th.connect(hub.url, f"reader-{i}", token=TOKEN, job_key="job-a", window=8) as reader:
                    stats = reader.fetch("policy", 1, hold=False, timeout=60)
                    assert torch.equal(stats.buffers["w"], WEIGHTS["w"]) and "mallory" not in stats.sources
            assert service.connections >= 1, "no reader was planned on mallory's copy: the test proves nothing"
            assert service.received == 0, f"readers sent {service.received} bytes of request frames there"
        finally:
            mallory.close()
            service.close()
