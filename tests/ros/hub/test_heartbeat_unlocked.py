"""A heartbeat is answered on the hub's event loop without the state lock: it only records when a known worker
with a valid credential was heard. What needs the lock (clearing a suspicion, retention lists to bring up to
date) still goes through it, and liveness reads what the unlocked path wrote."""

import threading

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.errors import NotOwner, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER


def _register(state: HubState, worker: str) -> str:
    return state.register_worker(msg.RegisterWorker(worker=worker, location=msg.LocationMsg(), agent_name=worker,
                                                    agent_metadata_b64="AAAA")).credential


def _tiny(version: int) -> msg.ManifestMsg:
    return msg.ManifestMsg(model="m", version=version, layout="hf", chunk_bytes=4096,
                           tensors=[msg.TensorSpecMsg(name="w", shape=[4096], dtype="uint8", nbytes=4096)])


class _LockHeld:
    """Holds the hub's state lock on another thread until closed (a long drain, status or publish)."""

    def __init__(self, state: HubState):
        self.taken, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(state,), daemon=True)
        self.thread.start()
        assert self.taken.wait(5.0)

    def _hold(self, state: HubState) -> None:
        with state._lock:
            self.taken.set()
            self.release.wait(30.0)

    def close(self) -> None:
        self.release.set()
        self.thread.join(5.0)


def test_a_heartbeat_is_answered_while_another_thread_holds_the_state_lock():
    server = th.start_hub()
    held = None
    try:
        credential = _register(server.state, "w")
        held = _LockHeld(server.state)
        beat = lambda worker, cred: httpx.post(server.url + "/v1/workers/heartbeat", params={"worker": worker},
                                               headers={CREDENTIAL_HEADER: cred}, timeout=3.0)
        ack = beat("w", credential)
        assert ack.status_code == 200, ack.text
        assert ack.json()["worker"] == "w" and ack.json()["hub_instance"] == server.state.instance
        # The credential checks and "unknown worker: register again" hold without the lock too.
        assert beat("w", "not-it").json()["error"] == "NotOwner"
        unknown = beat("ghost", credential)
        assert unknown.status_code == 404 and unknown.json()["error"] == "UnknownWorker"
        assert held.thread.is_alive(), "the lock was held all along"
    finally:
        if held is not None:
            held.close()
        server.stop()


def test_unlocked_heartbeats_keep_a_worker_alive_in_the_hubs_awake_time():
    now = [0.0]
    state = HubState(HubConfig(worker_timeout_s=10.0), clock=lambda: now[0])
    credential = _register(state, "w")
    _register(state, "silent")
    for t in (6.0, 12.0, 18.0):
        now[0] = t
        assert state.heartbeat_unlocked("w", credential) is not None
        state.sweep()
    assert "w" in state.registry and "silent" not in state.registry
    with pytest.raises(NotOwner):
        state.heartbeat_unlocked("w", "")
    with pytest.raises(UnknownWorker):
        state.heartbeat_unlocked("silent", credential)


def test_a_suspect_worker_and_stale_retention_lists_take_the_locked_path():
    state = HubState(HubConfig(keep_versions=1, require_digests=False))
    credential = _register(state, "w")
    state.quarantine.read_failed("w", 0.0)
    assert state.heartbeat_unlocked("w", credential) is None, "a suspicion is cleared under the lock"
    with state.acting_as("w", credential):
        state.heartbeat("w")
    assert not state.quarantine.listed("w")
    for version in (1, 2):
        state.publish(msg.Publish(worker="w", holder="w", manifest=_tiny(version),
                                  regions=[msg.RegionMsg(addr=4096)]))
    assert state.heartbeat_unlocked("w", credential) is None, "lists changed: brought up to date under the lock"
    locked = state.heartbeat("w")
    assert [(k.model, k.version) for k in locked.release] == [("m", 1)]
    unlocked = state.heartbeat_unlocked("w", credential)
    assert unlocked is not None and unlocked.release == locked.release


def test_settled_release_refuses_a_read_that_a_change_overlapped():
    state = HubState(HubConfig(keep_versions=1, require_digests=False))
    credential = _register(state, "w")
    for version in (1, 2):
        state.publish(msg.Publish(worker="w", holder="w", manifest=_tiny(version),
                                  regions=[msg.RegionMsg(addr=4096)]))
    state.heartbeat("w")
    retention = state.retention
    assert retention.settled_release("w") == state.heartbeat("w").release
    original = retention._release_of

    class ChangesWhileRead(dict):
        def get(self, *args):
            retention.changed("m")  # a locked call changes the lists in the middle of the read
            return original.get(*args)

    retention._release_of = ChangesWhileRead(original)
    assert retention.settled_release("w") is None
    assert state.heartbeat_unlocked("w", credential) is None


def test_the_heartbeat_route_refuses_what_fastapi_refused_with_typed_errors():
    server = th.start_hub(token="t0ken")
    try:
        credential = _register(server.state, "w")

        def beat(query, cred=credential, token="t0ken"):
            return httpx.post(server.url + "/v1/workers/heartbeat" + query, timeout=10.0,
                              headers={"authorization": f"Bearer {token}", CREDENTIAL_HEADER: cred})
        cases = {
            "no token": (beat("?worker=w", token="wrong"), 401, "Unauthorized"),
            "no worker": (beat(""), 422, "InvalidRequest"),
            "empty worker": (beat("?worker="), 422, "InvalidRequest"),
            "long worker": (beat("?worker=" + "x" * 257), 422, "InvalidRequest"),
            "long credential": (beat("?worker=w", cred="x" * 300), 422, "InvalidRequest"),
            "wrong credential": (beat("?worker=w", cred="not-it"), 403, "NotOwner"),
            "unknown worker": (beat("?worker=gh%6Fst"), 404, "UnknownWorker"),
        }
        for name, (reply, status, error) in cases.items():
            assert reply.status_code == status and reply.json()["error"] == error, (name, reply.text)
        assert "query.worker" in cases["no worker"][0].json()["detail"]
        assert "'ghost'" in cases["unknown worker"][0].json()["detail"]  # the query is URL-decoded
        ok = beat("?worker=w")
        assert ok.status_code == 200 and msg.WorkerAck.model_validate_json(ok.content).worker == "w"
    finally:
        server.stop()
