"""The hub's replies on the wire: each route's typed reply model (messages.py) keeps the JSON shape that
clients written against the untyped replies read, and the client parses the same bodies with the same models."""

import asyncio
import base64
import json

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.app import _send_error
from tensorhub_verl.ros.client.hub_client import HubClient, _error_of
from tensorhub_verl.ros.wire.manifest import Manifest, TensorBlocks, TensorSpec
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER
from tensorhub_verl.ros.wire.convert import manifest_from_msg, manifest_to_msg
from tensorhub_verl import errors

GOOD = {"model": "m", "version": 1, "layout": "hf", "chunk_bytes": 4096,
        "tensors": [{"name": "w", "shape": [1024], "dtype": "float32", "nbytes": 4096}],
        "chunk_digests": ["0123456789abcdef"]}


@pytest.fixture
def api():
    server = th.start_hub()
    http = httpx.Client(base_url=server.url, timeout=10)
    joined = http.post("/v1/workers/register", json={"worker": "w", "location": {"node": "n1"},
                                                     "agent_name": "w-agent", "agent_metadata_b64": "AAAA"})
    http.headers[CREDENTIAL_HEADER] = joined.json()["credential"]
    yield server, http
    http.close()
    server.stop()


def test_replies_keep_their_json_shape(api):
    server, http = api
    published = http.post("/v1/publish", json={"worker": "w", "holder": "w", "manifest": GOOD,
                                               "regions": [{"addr": 4096}]})
    assert published.json() == {"ok": True}
    assert http.get("/v1/wait", params={"model": "m", "timeout": 0}).json() == {"version": 1}
    assert http.get("/v1/wait", params={"model": "m", "newer_than": 1, "timeout": 0}).json() == {"version": None}
    status = http.get("/v1/status").json()
    assert list(status) == ["hub_instance", "workers", "models", "leases_in_flight", "leases_revoked",
                            "sweeps", "flips"]
    assert status["flips"] == {}  # no replica reported for a fleet flip
    worker = status["workers"]["w"]
    assert list(worker) == ["location", "spot", "bytes_served", "last_seen_s"]
    assert worker["location"] == {"dc": "dc0", "rack": "r0", "node": "n1"} and worker["spot"] is False
    assert status["models"] == {"m": [{"version": 1, "layout": "hf", "bytes": 4096, "chunks": 1, "holders": [
        {"holder": "w", "worker": "w", "state": "active", "quarantined": False, "chunks": 1, "served_bytes": 0}]}]}
    assert (status["leases_in_flight"], status["leases_revoked"]) == (0, 0)
    assert isinstance(status["sweeps"], int) and status["sweeps"] >= 0

    client = HubClient(server.url)
    try:
        typed = client.get("/v1/status", msg.StatusReply).model_dump()
        for reply in (typed, status):  # both counted live: the sweeper may run between the two calls
            reply["workers"]["w"].pop("last_seen_s")
            reply.pop("sweeps")
        assert typed == status
        assert client.versions("m") == {1: ["w"]} and client.wait("m", None, "hf", 0) == 1
        assert client.wait("m", 1, "hf", 0) is None
    finally:
        client.close()

    # /v1/fetch/end answers with its own type, the same JSON as an unpublish's acknowledgement.
    reader = httpx.Client(base_url=server.url, timeout=10)
    reader.headers[CREDENTIAL_HEADER] = http.post("/v1/workers/register", json={
        "worker": "r2", "location": {}, "agent_name": "r2-agent", "agent_metadata_b64": "AAAA"}).json()["credential"]
    try:
        key = {"worker": "r2", "holder": "r2", "model": "m", "version": 1, "layout": "hf"}
        digest = manifest_from_msg(msg.ManifestMsg.model_validate(GOOD)).digest
        assert reader.post("/v1/fetch/begin", json=key | {"digest": digest, "regions": [{"addr": 8192}]}
                           ).status_code == 200
        ended = reader.post("/v1/fetch/end", json=key | {"ok": False, "hold": False, "wait_s": 0})
        assert ended.json() == {"drained": True, "inflight": 0}
        assert msg.EndFetchAck.model_validate(ended.json()).drained
    finally:
        reader.close()


def test_error_bodies(api):
    server, http = api
    missing = http.get("/v1/manifest", params={"model": "nope"})
    assert missing.status_code == 404 and set(missing.json()) == {"error", "detail"}
    assert missing.json()["error"] == "VersionNotFound"
    malformed = http.get("/v1/wait", params={"model": "m", "timeout": "nan"})
    assert malformed.status_code == 422 and malformed.json()["error"] == "InvalidRequest"
    assert malformed.json()["detail"].startswith("malformed request: ")
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(_send_error(send, 413, "InvalidRequest", "too large"))  # the body limit's reply, before any route
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"error": "InvalidRequest", "detail": "too large"}


def test_client_reads_error_bodies():
    def reply(status, body=None, text=None):
        return status, json.dumps(body).encode() if body is not None else text.encode()

    mismatch = _error_of(*reply(409, {"error": "ManifestMismatch", "detail": "no", "tensor": "w"}))
    assert isinstance(mismatch, errors.ManifestMismatch) and mismatch.tensor == "w"
    assert isinstance(_error_of(*reply(404, {"error": "VersionNotFound", "detail": "gone"})), errors.VersionNotFound)
    framework = _error_of(*reply(404, {"detail": "Not Found"}))
    assert isinstance(framework, errors.InvalidRequest) and str(framework) == "Not Found (HTTP 404)"
    proxy = _error_of(*reply(502, text="<html>bad gateway</html>"))
    assert isinstance(proxy, errors.InvalidRequest) and "bad gateway" in str(proxy)
    assert isinstance(_error_of(*reply(401, text="no")), errors.Unauthorized)
    assert msg.ErrorReply(error="X", detail="d").body() == {"error": "X", "detail": "d"}


def test_manifest_round_trips_through_the_wire():
    m = Manifest("m", 3, "hf", (TensorSpec("a", (2, 3), "float32", 24), TensorSpec("b", (), "int64", 8)), 4096,
                 "fp", ("0123456789abcdef",), 1, "lin31x2/1", (TensorBlocks(0, 1, 3, ("", "0123456789abcdef", "")),))
    wire = manifest_to_msg(m)
    assert wire.model_dump() == {"model": "m", "version": 3, "layout": "hf", "chunk_bytes": 4096, "fingerprint": "fp",
                                 "chunk_digests": ["0123456789abcdef"], "row_shards": 1,
                                 "digest_algorithm": "lin31x2/1",
                                 "block_digests": [{"tensor": 0, "dim": 1, "blocks": 3,
                                                    "digests": ["", "0123456789abcdef", ""]}],
                                 "tensors": [{"name": "a", "shape": [2, 3], "dtype": "float32", "nbytes": 24},
                                             {"name": "b", "shape": [], "dtype": "int64", "nbytes": 8}]}
    assert manifest_from_msg(wire) == m


def test_the_client_does_not_import_the_hub():
    import subprocess
    import sys

    code = ("import sys, tensorhub_verl.ros.client.client, tensorhub_verl.vllm.follow; "
            "print('tensorhub_verl.ros.hub.state' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_large_manifest_is_gzipped_for_clients_that_accept_it_and_read_back_the_same(api):
    server, http = api
    digests = [f"{i:016x}" for i in range(64)]
    big = GOOD | {"chunk_bytes": 4096, "chunk_digests": digests,
                  "tensors": [{"name": "w", "shape": [64 * 1024], "dtype": "float32", "nbytes": 64 * 4096}]}
    assert http.post("/v1/publish", json={"worker": "w", "holder": "w", "manifest": big,
                                          "regions": [{"addr": 4096}]}).json() == {"ok": True}
    query = {"model": "m", "version": "1"}
    zipped = http.get("/v1/manifest", params=query, headers={"accept-encoding": "gzip"})
    plain = http.get("/v1/manifest", params=query, headers={"accept-encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert int(zipped.headers["content-length"]) * 2 < int(plain.headers["content-length"])
    assert zipped.json() == plain.json() and zipped.json()["chunk_digests"] == digests  # httpx inflates it
    m = HubClient(server.url).get("/v1/manifest", msg.ManifestMsg, params=query)  # sends accept-encoding: gzip
    assert m.chunk_digests == digests


def test_a_first_exchange_that_brings_a_sources_metadata_is_gzipped(api):
    server, http = api
    meta = base64.b64encode(b"ucx-address " * 300).decode()  # a data-plane metadata blob of 3.6 KB
    holder = httpx.Client(base_url=server.url, timeout=10)
    reader = httpx.Client(base_url=server.url, timeout=10)
    try:
        for client, name, blob in ((holder, "h", meta), (reader, "r", "AAAA")):
            joined = client.post("/v1/workers/register", json={"worker": name, "location": {"node": name},
                                                               "agent_name": f"{name}-agent",
                                                               "agent_metadata_b64": blob})
            client.headers[CREDENTIAL_HEADER] = joined.json()["credential"]
        assert holder.post("/v1/publish", json={"worker": "h", "holder": "h", "manifest": GOOD,
                                                "regions": [{"addr": 4096}]}).json() == {"ok": True}
        digest = manifest_from_msg(msg.ManifestMsg.model_validate(GOOD)).digest
        begin = {"worker": "r", "holder": "r", "model": "m", "version": 1, "layout": "hf", "digest": digest,
                 "regions": [{"addr": 8192}], "want": 1}
        zipped = reader.post("/v1/fetch/begin", json=begin, headers={"accept-encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        assert int(zipped.headers["content-length"]) * 3 < len(zipped.content)  # httpx inflates it
        assert zipped.json()["first"]["sources"][0]["agent_metadata_b64"] == meta
    finally:
        holder.close()
        reader.close()
