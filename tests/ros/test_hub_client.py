"""HubClient's recovery after a hub restart, driven by threads against a real (embedded) hub."""

import ipaddress
import socket
import threading

import pytest

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError, NotOwner, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient


def test_a_call_that_meets_unknown_worker_during_a_recovery_waits_for_it_and_retries(hub):
    """The heartbeat thread is re-registering after a restart when another thread's call is refused with
    UnknownWorker: that call must wait for the recovery and succeed, and the recovery must run once."""
    started, release = threading.Event(), threading.Event()
    recoveries = []

    def reregister():
        recoveries.append(threading.get_ident())
        started.set()
        assert release.wait(30)
        client.post("/v1/workers/register", msg.RegisterWorker(
            worker="w1", location=msg.LocationMsg(), agent_name="a", agent_metadata_b64="AA=="))

    client = HubClient(hub.url, on_new_instance=reregister, retry_s=30)
    heartbeat = threading.Thread(target=client._recover)  # as _check_instance does on a new instance
    heartbeat.start()
    assert started.wait(30)
    caller, result = _heartbeat_in_thread(client, UnknownWorker)
    assert caller.is_alive(), "the call should wait for the recovery in progress, not fail or skip it"
    release.set()
    caller.join(30)
    heartbeat.join(30)
    assert "error" not in result and "ack" in result
    assert len(recoveries) == 1
    client.close()


def test_a_call_refused_while_the_new_credential_is_still_on_its_way_waits_for_it(hub):
    """After a hub restart the recovery's registration lands at the hub (which issues a new credential) but its
    reply is slow: a call sent meanwhile with the old credential is refused NotOwner, and must be repeated
    with the new credential once that reply arrived, not fail."""
    register = msg.RegisterWorker(worker="w1", location=msg.LocationMsg(), agent_name="a", agent_metadata_b64="AA==")
    reply_held, release = threading.Event(), threading.Event()
    client = HubClient(hub.url, on_new_instance=lambda: client.post(msg.REGISTER_PATH, register), retry_s=30)
    client.post(msg.REGISTER_PATH, register)
    old_credential = client._credential
    # A restarted hub registers an id it does not know afresh, with a new credential: here the hub forgets
    # the worker, and the recovery's registration reply is held back after the hub answered it.
    urlopen = client._http.urlopen

    def slow_register_reply(method, url, **kwargs):
        response = urlopen(method, url, **kwargs)
        if url == msg.REGISTER_PATH and threading.current_thread() is not threading.main_thread():
            reply_held.set()
            assert release.wait(30)
        return response

    client._http.urlopen = slow_register_reply
    _forget_worker(hub, "w1")
    recovery = threading.Thread(target=client._recover)
    recovery.start()
    assert reply_held.wait(30), "the recovery's registration never reached the hub"
    caller, result = _heartbeat_in_thread(client, NotOwner)
    assert caller.is_alive(), "the refused call should wait for the re-registration under way, not fail"
    release.set()
    caller.join(30)
    recovery.join(30)
    assert "error" not in result and "ack" in result
    assert client._credential != old_credential
    client.close()


def _heartbeat_in_thread(client: HubClient, race_error: type[Exception]) -> tuple[threading.Thread, dict]:
    """Starts worker w1's heartbeat call on a thread and gives it half a second: the thread and what it got
    (``ack``, or ``error`` when it failed with ``race_error``, what the race used to give)."""
    result = {}

    def heartbeat():
        try:
            result["ack"] = client.post("/v1/workers/heartbeat", params={"worker": "w1"})
        except race_error as e:
            result["error"] = e

    caller = threading.Thread(target=heartbeat)
    caller.start()
    caller.join(0.5)
    return caller, result


def _forget_worker(hub, worker: str) -> None:
    """The hub forgets ``worker`` as a restarted hub would, so its next registration gets a new credential."""
    with hub.state._lock:
        hub.state.registry.remove(worker)


def test_a_token_is_never_sent_in_clear_to_another_host():
    """A relay on another host's address (here: this host's outward address) listens as a hub would: a client
    with a token and an http:// URL refuses before connecting, says what to do, and sends it nothing; with
    allow_plain_http it does connect, and sends nothing secret to a peer that cannot prove the token; without a token there is nothing to protect."""
    address = _outward_address()
    if address is None:
        pytest.skip("this host has no address besides loopback")
    with socket.socket() as relay:
        relay.bind((address, 0))
        relay.listen(8)
        relay.settimeout(0.5)
        url = f"http://{address}:{relay.getsockname()[1]}"
        with pytest.raises(ConfigError, match="in clear.*TLS.*allow_plain_http"):
            HubClient(url, token="s3cret")
        with pytest.raises(ConfigError, match="in clear"):
            th.connect(url, worker="w-plain", token="s3cret", hub_retry_s=1.0)
        with pytest.raises(socket.timeout):
            relay.accept()
        allowed = HubClient(url, token="s3cret", allow_plain_http=True, retry_s=1.0, request_timeout_s=1.0)
        caller = threading.Thread(target=lambda: _swallow(lambda: allowed.versions("policy")), daemon=True)
        caller.start()
        conn, _ = relay.accept()
        with conn:
            conn.settimeout(5)
            sent = conn.recv(65536)
            # it connects, but the relay cannot prove it holds the token: it gets the token-less hello only
            assert sent.startswith(b"GET /v1/hello?nonce=") and b"s3cret" not in sent
        caller.join(10)
        allowed.close()
    HubClient(url).close()  # an open hub: nothing secret to send


def _outward_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source address
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def _swallow(call) -> None:
    try:
        call()
    except Exception:
        pass
