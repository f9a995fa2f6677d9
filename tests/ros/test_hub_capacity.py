"""Hub capacity: a heartbeat's work does not grow with models and versions, and parked long-polls do not
take the threads that heartbeats need."""

import threading
import time

import httpx

import tensorhub_verl as th
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.retention import Retention
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState


def _tiny(model: str, version: int) -> msg.ManifestMsg:
    return msg.ManifestMsg(model=model, version=version, layout="hf", chunk_bytes=4096,
                           tensors=[msg.TensorSpecMsg(name="w", shape=[4096], dtype="uint8", nbytes=4096)])


def test_heartbeats_reuse_the_retention_lists_until_holdings_change(monkeypatch):
    state = HubState(HubConfig(keep_versions=2, require_digests=False))
    for w in ("a", "b"):
        state.register_worker(msg.RegisterWorker(worker=w, location=msg.LocationMsg(), agent_name=w,
                                                 agent_metadata_b64="AAAA"))
    for m in range(200):
        for v in range(1, 5):
            state.publish(msg.Publish(worker="a", holder="a", manifest=_tiny(f"m{m}", v),
                                      regions=[msg.RegionMsg(addr=4096)]))
    first = state.heartbeat("a")  # looks at each model once, after its publishes
    assert {(k.model, k.version) for k in first.release} == {(f"m{m}", v) for m in range(200) for v in (1, 2)}
    rebuilt = []
    original = Retention._rebuild
    monkeypatch.setattr(Retention, "_rebuild", lambda self, model, versions: (rebuilt.append(model),
                                                                              original(self, model, versions)))
    acks = [state.heartbeat(w) for _ in range(50) for w in ("a", "b")]
    assert rebuilt == [], "retention was recomputed on heartbeats with nothing changed"
    assert all(len(a.release) == 400 for a in acks[::2]) and all(a.release == [] for a in acks[1::2])
    state.unpublish(msg.Unpublish(worker="a", holder="a", model="m0", version=1, layout="hf", wait_s=0))
    after = state.heartbeat("a")
    assert rebuilt == ["m0"], "only the model that changed is looked at again"
    assert len(after.release) == 399 and ("m0", 1) not in {(k.model, k.version) for k in after.release}


def test_parked_long_polls_do_not_starve_heartbeats():
    server = th.start_hub()
    try:
        with th.connect(server.url, "engine", hub_retry_s=5.0) as client:
            parked = []

            def park(i):
                try:
                    httpx.get(f"{server.url}/v1/wait", params={"model": f"idle{i}", "timeout": 30}, timeout=60)
                except httpx.HTTPError:
                    pass

            for i in range(60):  # more than the 40 threads every sync route shares
                t = threading.Thread(target=park, args=(i,), daemon=True)
                t.start()
                parked.append(t)
            ack = client._hub.post("/v1/workers/heartbeat", params={"worker": "engine"}, reply=msg.WorkerAck,
                                   timeout=10)
            assert ack.worker == "engine"
            assert client.versions("policy") == {}  # and a plain sync route still answers
            assert all(t.is_alive() for t in parked)  # the long-polls were still parked meanwhile
    finally:
        server.stop()
    # A stopping hub answers its parked long-polls (timeout 30 s) at once rather than waiting them out.
    deadline = time.monotonic() + 5
    for t in parked:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in parked)


def test_bench_hub_prints_one_json_object_last(capsys):
    import json

    from tensorhub_verl.bench.hub_load import main

    assert main(["--workers", "6", "--models", "5", "--versions", "2", "--readers", "2", "--waiters", "3",
                 "--seconds", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["bench"] == "hub" and report["published_versions"] == 10 and report["dropped_workers"] == 0
    assert report["paced_heartbeats_per_s"] > 0 and report["heartbeat_capacity_per_s_loaded"] > 0
    assert report["exchanges"] > 0
