"""Attacks from outside at the hub's edge: a real hub process (or a real embedded server where a TLS certificate
or a hub limit is needed), real sockets, real clients. An impostor that binds a dead hub's port, a keyless
holder of the shared token, an http:// URL to a TLS hub, a job key sent in clear, strangers' idle sockets, and
publishes that cost the hub before they are refused. Each was let through before the checks it tests existed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest
import torch
import trustme

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.bench.hub_proc import free_port
from tensorhub_verl.bench.publish_cost import piece_limit_publish, register
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.ros.wire.convert import manifest_to_msg

TOKEN = "trust-edge-token"
JOB = "the-trainers-own-job-key"
CHUNK = 4096
WEIGHTS = {"w": torch.arange(4 * CHUNK // 4, dtype=torch.float32)}


# ----------------------------------------------------------------------------------------- helpers
class _HubCli:
    """`tensorhub hub` as a child process, with the token in its environment; ``up`` once it accepts TCP."""

    def __init__(self, port: int, *args: str, open_files: int | None = None):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()  # a pipe nobody reads would block the hub's logging once full
        limit = None if open_files is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                           (open_files, open_files)))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tensorhub_verl.cli", "hub", "--port", str(port), *args],
            env={**os.environ, "TENSORHUB_TOKEN": TOKEN}, stdout=subprocess.DEVNULL, stderr=self._log,
            preexec_fn=limit)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.seek(0)
                raise errors.HubUnavailable(f"hub exited: {self._log.read().decode()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(0.3)  # listening; let it finish starting
                return
            time.sleep(0.1)
        self.stop()
        raise errors.HubUnavailable(f"hub on {self.url} did not start")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._log.close()

    stop = kill


class _Server:
    """A listening socket on a thread of its own: each accepted connection goes to ``_accepted``; ``close``
    stops and joins every thread it started."""

    def __init__(self, host: str, port: int):
        self._sock = socket.create_server((host, port))
        self.port = self._sock.getsockname()[1]
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Listener(_Server):
    """A process on an address that is no hub: records every byte that reaches it, answers each request head
    with a plausible reply (an impostor's best guess), or nothing (``answer=False``)."""

    def __init__(self, host: str, port: int, answer: bool = True):
        self.received = bytearray()
        self.connections = 0
        self._answer = answer
        super().__init__(host, port)

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1
        self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
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
                self.received += data
                if self._answer and b"\r\n\r\n" in data:
                    body = b'{"hub_instance": "impostor", "token": true, "proof": "00", "ok": true}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-tensorhub-instance: "
                                 b"impostor\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


class _Relay(_Server):
    """A TCP relay in front of a server that records what clients send through it (the server's own bytes
    are TLS here: this is where a plaintext token would be seen)."""

    def __init__(self, target_port: int):
        self.received = bytearray()
        self._target = target_port
        super().__init__("127.0.0.1", 0)

    def _accepted(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self._target), timeout=5)
        for a, b, record in ((client, server, True), (server, client, False)):
            self._spawn(self._pipe, a, b, record)

    def _pipe(self, a: socket.socket, b: socket.socket, record: bool) -> None:
        a.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = a.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if record:
                self.received += data
            with contextlib.suppress(OSError):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(errors.TensorHubError):
            if condition():
                return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


# --------------------------------------------------------------------------- 2. the hub proves itself
def test_an_impostor_on_a_dead_hubs_port_gets_no_secret_and_the_workers_wait_for_the_real_hub():
    port = free_port()
    hub = _HubCli(port, "--worker-timeout", "30")
    trainer = th.connect(hub.url, "trainer", token=TOKEN, job_key=JOB, chunk_bytes=CHUNK, hub_retry_s=90)
    try:
        trainer.publish("policy", 1, WEIGHTS)
        credential = trainer._hub._credential
        assert credential
        hub.kill()
        with _Listener("127.0.0.1", port) as impostor:
            # Heartbeats every second, each a new connection to whatever holds the port: several of them.
            _wait_until(lambda: impostor.connections >= 3, 30, "the workers tried the impostor")
            # The real hub cannot listen while the impostor holds its port: it says so and how to fix it.
            blocked = subprocess.run([sys.executable, "-m", "tensorhub_verl.cli", "hub", "--port", str(port)],
                                     env={**os.environ, "TENSORHUB_TOKEN": TOKEN}, capture_output=True,
                                     text=True, timeout=60)
        assert impostor.connections > 0, "the workers never tried the impostor"
        for secret in (TOKEN, JOB, credential):
            assert secret.encode() not in impostor.received, "a secret reached the impostor"
        assert blocked.returncode == 1
        assert "HubAddressInUse" in blocked.stderr and f"127.0.0.1:{port}" in blocked.stderr
        assert "another port" in blocked.stderr
        hub = _HubCli(port, "--worker-timeout", "30")  # the real hub comes back: the worker re-registers with it
        _wait_until(lambda: trainer.versions("policy") == {1: ["trainer"]}, 60, "the trainer's holding is back")
    finally:
        trainer.close()
        hub.kill()


def test_a_client_stops_at_once_when_an_http_url_names_a_tls_hub_and_sends_no_token(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "hub.pem")
    cert.private_key_pem.write_to_path(tmp_path / "hub.key")
    hub = th.start_hub(token=TOKEN, tls_cert=tmp_path / "hub.pem", tls_key=tmp_path / "hub.key")
    relay = _Relay(hub.port)
    try:
        started = time.monotonic()
        with pytest.raises(errors.HubUnavailable) as refused:
            th.connect(f"http://127.0.0.1:{relay.port}", "plain", token=TOKEN, job_key=JOB, hub_retry_s=30)
        assert time.monotonic() - started < 10, "the client kept retrying a TLS hub over plain HTTP"
        assert isinstance(refused.value, errors.PlainHttpToTls) and "https://" in str(refused.value)
        assert TOKEN.encode() not in relay.received and JOB.encode() not in relay.received
    finally:
        relay.close()
        hub.stop()


# ------------------------------------------------------------------------------- 1. safe by default
def test_a_keyless_token_holder_is_refused_registration_metadata_leases_and_publishes():
    port = free_port()
    hub = _HubCli(port)
    try:
        with th.connect(hub.url, "trainer", token=TOKEN, job_key=JOB, chunk_bytes=CHUNK) as trainer:
            published = trainer.publish("policy", 1, WEIGHTS)
            with pytest.raises(errors.Unauthorized, match="without a job key.*allow-keyless") as refused:
                th.connect(hub.url, "mallory", token=TOKEN, chunk_bytes=CHUNK, hub_retry_s=5)
            assert type(refused.value).__name__ == "JobKeyRequired"
            raw = HubClient(hub.url, TOKEN, request_timeout_s=10, retry_s=2)
            with pytest.raises(errors.Unauthorized, match="without a job key"):
                raw.post(msg.REGISTER_PATH, msg.RegisterWorker(
                    worker="mallory", location=msg.LocationMsg(), agent_name="m", agent_metadata_b64="bWV0YQ=="),
                    msg.WorkerAck)
            # Without a registration there is no credential: no lease (and no holder's metadata), no publish.
            with pytest.raises((errors.UnknownWorker, errors.NotOwner)):
                raw.post("/v1/fetch/begin", msg.BeginFetch(
                    worker="mallory", holder="mallory", model="policy", version=1, layout="hf",
                    digest=published.digest, regions=[msg.RegionMsg(addr=1 << 20)]), msg.BeginFetchReply)
            with pytest.raises((errors.UnknownWorker, errors.NotOwner)):
                raw.post("/v1/publish", msg.Publish(
                    worker="mallory", holder="mallory",
                    manifest=manifest_to_msg(dataclasses.replace(published, version=2**62)),
                    regions=[msg.RegionMsg(addr=1 << 20)]), msg.OkReply)
            assert trainer.latest("policy") == 1
            assert list(trainer.status()["workers"]) == ["trainer"]
    finally:
        hub.kill()


def test_a_hub_told_to_allow_keyless_workers_admits_them_as_one_job():
    port = free_port()
    hub = _HubCli(port, "--allow-keyless")
    try:
        with th.connect(hub.url, "trainer", token=TOKEN, chunk_bytes=CHUNK) as trainer, \
                th.connect(hub.url, "reader", token=TOKEN, chunk_bytes=CHUNK) as reader:
            trainer.publish("policy", 1, WEIGHTS)
            assert torch.equal(reader.fetch("policy", 1).buffers["w"], WEIGHTS["w"])
    finally:
        hub.kill()


def _outward_address() -> str | None:
    """An address of this host that is not loopback (no packet is sent to find it)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address = s.getsockname()[0]
        return None if address.startswith("127.") else address
    return None


def test_a_job_key_never_crosses_plain_http_off_loopback():
    address = _outward_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    port = free_port()
    with _Listener(address, port) as listener:
        with pytest.raises(errors.ConfigError, match="refusing to send the job key in clear"):
            th.connect(f"http://{address}:{port}", "trainer", job_key=JOB, hub_retry_s=2, request_timeout_s=2)
        time.sleep(0.5)
    assert JOB.encode() not in listener.received and listener.connections == 0


# ------------------------------------------------------------------------- 6. bounded cost before work
def test_strangers_idle_sockets_do_not_lock_a_new_worker_out():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this process may open only {hard} files; the attack needs 1,100 sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400) if hard == resource.RLIM_INFINITY else hard, hard))
    port = free_port()
    hub = _HubCli(port, open_files=1024)
    idle: list[socket.socket] = []
    try:
        for _ in range(1100):  # no request head, no token: each only costs the hub a descriptor
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))  # the kernel completes it (or retries its SYN) meanwhile
            idle.append(s)
        time.sleep(4.0)
        assert sum(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in idle) >= 1000
        with th.connect(hub.url, "trainer", token=TOKEN, job_key=JOB, chunk_bytes=CHUNK, hub_retry_s=5,
                        request_timeout_s=5) as trainer:
            trainer.publish("policy", 1, WEIGHTS)
            assert trainer.latest("policy") == 1
        assert hub.process.poll() is None
    finally:
        for s in idle:
            s.close()
        hub.kill()


def test_a_row_shard_publish_with_a_wrong_chunk_count_is_refused_before_any_per_rank_work():
    port = free_port()
    hub = _HubCli(port)
    try:
        owner = register(hub.url, "trainer", job_key=JOB, token=TOKEN)
        req = piece_limit_publish("trainer", version=1)  # 32 tensors x 65,536 row shards: one chunk per rank
        small = req.model_copy(update={"manifest": req.manifest.model_copy(update={"chunk_digests": ["0" * 16]})})
        assert len(small.model_dump_json()) < 8192  # a few KiB on the wire
        before = _cpu_seconds(hub.process.pid)
        for _ in range(3):
            with pytest.raises(errors.InvalidRequest, match="1 chunk digests for 65536 chunks"):
                owner.post("/v1/publish", small, msg.OkReply)
        spent = _cpu_seconds(hub.process.pid) - before
        assert spent < 1.5, f"three refused publishes cost the hub {spent:.2f} s of CPU"
    finally:
        hub.kill()


def test_pending_pieces_are_budgeted_per_job_not_per_worker_id():
    hub = th.start_hub(token=TOKEN, config=th.HubConfig(limits=HubLimits(max_pending_pieces_per_worker=64)))
    try:
        accepted, refused = 0, None
        for i in range(5):  # fresh worker ids of one job, each with one pending shard group of 64 pieces
            worker = f"trainer-{i}"
            client = register(hub.url, worker, job_key=JOB, token=TOKEN)
            try:
                client.post("/v1/publish", piece_limit_publish(worker, version=i + 1, pieces=64), msg.OkReply)
                accepted += 1
            except errors.OverBudget as e:
                refused = str(e)
                break
        assert accepted == 2 and refused is not None and "per job" in refused
        other = register(hub.url, "other-trainer", job_key="another-job", token=TOKEN)
        other.post("/v1/publish", piece_limit_publish("other-trainer", model="other", pieces=64), msg.OkReply)
    finally:
        hub.stop()
