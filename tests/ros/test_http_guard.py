"""Attacks on the hub's HTTP server from a stranger without the token, over raw sockets: none may cost the
hub a socket for long, memory for a huge head, or lock registered workers out (``http_guard.py``)."""

import socket
import time

import pytest

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.http_guard import ConnectionLimits
from tensorhub_verl.ros.client.hub_client import HubClient

TOKEN = "the-token"


@pytest.fixture
def guarded_hub():
    server = th.start_hub(token=TOKEN, connection_limits=ConnectionLimits(
        max_head_bytes=8 << 10, head_timeout_s=1.0, max_per_peer=6))
    yield server
    server.stop()


def _connect(server) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the hub sends until it closes the connection (a recv timeout fails the test)."""
    received = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return received
        received += data


def test_a_connection_that_sends_nothing_or_dribbles_its_head_is_closed(guarded_hub):
    silent = _connect(guarded_hub)
    dribbling = _connect(guarded_hub)
    dribbling.sendall(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    for byte in b"Host: x\r\nX-Slow: " + b"a" * 40:  # 0.1 s a byte: longer than the 1 s head deadline
        try:
            dribbling.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break  # closed by the hub mid-head
        time.sleep(0.1)
    assert _read_until_closed(silent) == b"", "a connection that never sent a byte must be closed, unanswered"
    assert _read_until_closed(dribbling) == b""
    assert time.monotonic() - started < 9, "closed by the head deadline, not by the test's own recv timeout"


def test_a_huge_request_head_is_refused_before_it_is_buffered(guarded_hub):
    sock = _connect(guarded_hub)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    try:
        for _ in range(64):  # 1 MiB of one header line, far over the 8 KiB limit
            sock.sendall(b"a" * (16 << 10))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the hub closed the connection while we were still sending: what it should do
    try:
        reply = _read_until_closed(sock)
    except ConnectionResetError:
        reply = b""
    assert reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply[:200]


def test_one_peer_cannot_hold_every_socket_and_workers_still_get_in(guarded_hub):
    held = [_connect(guarded_hub) for _ in range(6)]
    extra = _connect(guarded_hub)
    assert _read_until_closed(extra).startswith(b"HTTP/1.1 503"), "a peer over its connection cap is refused"
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the hub notices the closed sockets on its next loop turn
        client = HubClient(guarded_hub.url, TOKEN, retry_s=1.0)
        try:
            assert client.get("/healthz")["ok"]
            break
        except Exception:
            time.sleep(0.05)
        finally:
            client.close()
    else:
        raise AssertionError("a worker could not reach the hub after the idle sockets closed")
    worker = th.connect(guarded_hub.url, worker="after-the-flood", token=TOKEN, job_key="the-job")
    worker.close()


def test_connection_limits_are_checked():
    with pytest.raises(ConfigError, match="max_per_peer"):
        ConnectionLimits(max_per_peer=0)
    with pytest.raises(ConfigError, match="head_timeout_s"):
        ConnectionLimits(head_timeout_s=0)


def test_a_large_body_sent_with_its_head_in_one_packet_is_not_taken_for_a_large_head(guarded_hub):
    """The head limit counts the head only: a publish of a large manifest arrives with its head in one packet."""
    open_hub = th.start_hub()  # no token: the body reaches validation
    try:
        sock = _connect(open_hub)
        body = b'{"worker": "' + b"w" * (256 << 10) + b'"}'
        sock.sendall(b"POST /v1/publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = sock.recv(65536)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 422"), answer[:200]  # validated and refused, not 431
    finally:
        open_hub.stop()
