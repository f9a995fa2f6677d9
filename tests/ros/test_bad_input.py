"""Bounded, strict input: nonsense and oversized requests are refused and change nothing; none gets a 500."""

import json

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER

LIMITS = HubLimits(max_tensors=16, max_tensor_bytes=1 << 20, max_version_bytes=2 << 20, max_chunks=64)


@pytest.fixture
def api():
    server = th.start_hub(config=th.HubConfig(limits=LIMITS, require_digests=False))  # tests other checks
    http = httpx.Client(base_url=server.url, timeout=10)
    joined = http.post("/v1/workers/register", json={"worker": "w", "location": {}, "agent_name": "w-agent",
                                                     "agent_metadata_b64": "AAAA"})
    assert joined.status_code == 200, joined.text
    http.headers[CREDENTIAL_HEADER] = joined.json()["credential"]
    good = {"model": "m", "version": 1, "layout": "hf", "chunk_bytes": 4096,
            "tensors": [{"name": "w", "shape": [1024], "dtype": "float32", "nbytes": 4096}]}
    assert http.post("/v1/publish", json=_publish(good)).status_code == 200
    yield server, http, good
    http.close()
    server.stop()


def _publish(manifest, **extra):
    return {"worker": "w", "holder": "w", "manifest": manifest,
            "regions": [{"addr": 4096 * (i + 1)} for i in range(len(manifest["tensors"]))]} | extra


def _state(http):
    status = http.get("/v1/status").json()
    return status["models"], sorted(status["workers"]), status["leases_in_flight"]


def _tensor(name="t", shape=(1024,), dtype="float32", itemsize=4):
    n = 1
    for d in shape:
        n *= d
    return {"name": name, "shape": list(shape), "dtype": dtype, "nbytes": n * itemsize}


def test_coerced_and_non_finite_values_are_refused(api):
    _, http, good = api
    before = _state(http)
    for version in ("2", True, 2.0, 1e3, -1, 2**63):
        response = http.post("/v1/publish", json=_publish(good | {"version": version}))
        assert response.status_code == 422, (version, response.text)
    for spot in ("true", 1):
        response = http.post("/v1/workers/register", json={"worker": "x", "location": {}, "spot": spot,
                                                           "agent_name": "a", "agent_metadata_b64": "AAAA"})
        assert response.status_code == 422, spot
    end = {"worker": "w", "holder": "w", "model": "m", "version": 1, "layout": "hf", "ok": False, "hold": False}
    for seconds in ("Infinity", "NaN", "1e999"):
        raw = json.dumps(end)[:-1] + f', "seconds": {seconds}}}'
        response = http.post("/v1/fetch/end", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 422, (seconds, response.text)
    for version in ("1.0", "+1", " 1", "1e3", "-0", "9" * 30):
        response = http.get("/v1/manifest", params={"model": "m", "version": version})
        assert response.status_code == 400, (version, response.text)
    assert http.get("/v1/wait", params={"model": "m", "newer_than": "0.5", "timeout": 0}).status_code == 422
    assert http.get("/v1/wait", params={"model": "m", "timeout": "nan"}).status_code == 422
    assert _state(http) == before


def test_oversized_and_nonsense_versions_are_refused_before_any_state_changes(api):
    _, http, good = api
    before = _state(http)
    nonsense = {
        "no tensors": (good | {"version": 2, "tensors": []}, 422),
        "only empty tensors": (good | {"version": 2, "tensors": [_tensor(shape=(0,))]}, 400),
        "one huge tensor": (good | {"version": 2, "tensors": [_tensor(shape=(1 << 40,))]}, 400),
        "huge beyond the wire cap": (good | {"version": 2, "tensors": [_tensor(shape=(1 << 60,))]}, 422),
        "too many tensors": (good | {"version": 2, "tensors": [_tensor(f"t{i}", (4,)) for i in range(17)]}, 400),
        "too many bytes": (good | {"version": 2, "tensors": [_tensor(f"t{i}", (1 << 18,)) for i in range(3)]},
                           400),
        "too many chunks": (good | {"version": 2, "tensors": [_tensor(shape=(65 * 1024,))]}, 400),
        "too many dims": (good | {"version": 2, "tensors": [_tensor(shape=(1,) * 9)]}, 422),
        "control characters in a name": (good | {"version": 2, "tensors": [_tensor(name="a\nb")]}, 422),
        "unknown dtype": (good | {"version": 2, "tensors": [_tensor(dtype="float128", itemsize=16)]}, 400),
        "nbytes that lie": (good | {"version": 2, "tensors": [_tensor() | {"nbytes": 8}]}, 400),
        "duplicate names": (good | {"version": 2, "tensors": [_tensor(), _tensor()]}, 400),
    }
    for what, (manifest, status) in nonsense.items():
        response = http.post("/v1/publish", json=_publish(manifest))
        assert response.status_code == status, (what, response.text)
    for region in ({"addr": 2**64}, {"addr": -1}, {"addr": 4096, "device": 5000}, {"addr": 4096, "mem": "NVME"}):
        response = http.post("/v1/publish", json=_publish(good | {"version": 3}, regions=[region]))
        assert response.status_code == 422, (region, response.text)
    response = http.post("/v1/workers/register", json={"worker": "y", "location": {}, "agent_name": "a",
                                                       "agent_metadata_b64": "not base64!"})
    assert response.status_code == 422 and "base64" in response.text
    assert _state(http) == before


def test_refused_requests_leave_no_trace(api):
    _, http, good = api
    before = _state(http)
    shard = good | {"model": "sharded", "layout": "tp/rank0"}
    assert http.post("/v1/publish", json=_publish(shard, shard_count=2)).status_code == 400  # no group
    assert _state(http) == before  # used to leave an empty version record behind
    assert http.post("/v1/publish", json=_publish(shard, shard_group="e", shard_count=2)).status_code == 200
    middle = _state(http)
    other = shard | {"layout": "tp/rank1"}
    assert http.post("/v1/publish", json=_publish(other, shard_group="e", shard_count=3)).status_code == 400
    assert _state(http) == middle  # a shard count that contradicts the group's is refused whole
    key = {"worker": "w", "holder": "w", "model": "m", "version": 1, "layout": "hf"}
    assert http.post("/v1/unpublish", json=key | {"layout": "nope"}).status_code == 404
    assert _state(http) == middle


def test_preserve_for_a_layout_the_version_lacks_is_an_answer_not_a_500(api):
    _, http, _ = api
    response = http.post("/v1/preserve", json={"holder": "w", "model": "m", "version": 1, "layout": "other"})
    assert response.status_code == 200 and response.json()["must_preserve"] is False


def test_the_chunk_map_is_built_outside_the_hub_lock(monkeypatch):
    server = th.start_hub()
    seen = []
    original = Manifest.chunks

    def chunks(self):
        seen.append(server.state._lock._is_owned())
        return original(self)

    monkeypatch.setattr(Manifest, "chunks", chunks)
    try:
        with th.connect(server.url, "trainer") as trainer:
            import torch

            trainer.publish("policy", 1, {"w": torch.zeros(1 << 16)})
        assert seen and not any(seen), "the hub built a chunk map while holding its lock"
    finally:
        server.stop()
