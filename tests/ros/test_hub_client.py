"""HubClient's recovery after a hub restart, driven by threads against a real (embedded) hub."""

import threading

from tensorhub_verl.errors import UnknownWorker
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.hub_client import HubClient


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
    result = {}

    def heartbeat_call():
        try:
            result["ack"] = client.post("/v1/workers/heartbeat", params={"worker": "w1"})
        except UnknownWorker as e:  # what the race used to give
            result["error"] = e

    caller = threading.Thread(target=heartbeat_call)
    caller.start()
    caller.join(0.5)
    assert caller.is_alive(), "the call should wait for the recovery in progress, not fail or skip it"
    release.set()
    caller.join(30)
    heartbeat.join(30)
    assert "error" not in result and "ack" in result
    assert len(recoveries) == 1
    client.close()
