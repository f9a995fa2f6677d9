"""Bad input gets a clear, typed error and changes nothing; auth; metrics; retention."""

import time

import httpx
import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError, HubNotProven, InvalidRequest, ManifestMismatch, Unauthorized, \
    VersionNotFound
from tensorhub_verl.ros.hub.server import HubServer

from tests.ros.roles import digest, make_weights

CHUNK = 64 << 10


@pytest.fixture
def published(hub):
    trainer = th.connect(hub.url, "trainer", chunk_bytes=CHUNK)
    weights = make_weights(1, 0.5)
    trainer.publish("policy", 1, weights)
    reader = th.connect(hub.url, "reader")
    yield trainer, reader, weights
    reader.close()
    trainer.close()


def _snapshot(client):
    status = client.status()
    return status["models"], sorted(status["workers"])


def test_unknown_model_and_version(published):
    _, reader, _ = published
    with pytest.raises(VersionNotFound, match="no published version"):
        reader.fetch("nope", "latest")
    with pytest.raises(VersionNotFound, match=r"published versions: \[1\]"):
        reader.fetch("policy", 9)
    with pytest.raises(VersionNotFound):
        reader.fetch("policy", 1, layout="vllm/other")


def test_buffers_that_do_not_match_name_the_tensor_and_move_nothing(published):
    _, reader, weights = published
    before = _snapshot(reader)
    wrong_shape = {n: torch.empty_like(t) for n, t in weights.items()} | {"layers.0.norm.weight": torch.empty(8)}
    with pytest.raises(ManifestMismatch, match="layers.0.norm.weight") as e:
        reader.fetch("policy", 1, into=wrong_shape)
    assert e.value.tensor == "layers.0.norm.weight"
    wrong_dtype = {n: torch.empty_like(t) for n, t in weights.items()} | {"step": torch.empty(1)}
    with pytest.raises(ManifestMismatch, match="'step'.*float32.*int64"):
        reader.fetch("policy", 1, into=wrong_dtype)
    assert _snapshot(reader) == before
    assert reader.status()["leases_in_flight"] == 0


def test_publishing_other_bytes_under_a_published_version_is_refused(published, hub):
    _, reader, weights = published
    other = th.connect(hub.url, "other")
    before = _snapshot(reader)
    with pytest.raises(ManifestMismatch, match="different bytes"):
        other.publish("policy", 1, {n: t.clone() + 1 for n, t in weights.items()})
    with pytest.raises(ManifestMismatch, match="embed.weight"):
        other.publish("policy", 1, {n: t[:10].clone() if n == "embed.weight" else t for n, t in weights.items()})
    assert reader.versions("policy") == {1: ["trainer"]}
    other.publish("policy", 1, {n: t.clone() for n, t in weights.items()})  # same bytes: a second holder
    assert reader.versions("policy") == {1: ["other", "trainer"]}
    other.close()
    assert _snapshot(reader)[0] == before[0]


def test_invalid_arguments(published):
    trainer, reader, weights = published
    with pytest.raises(ConfigError, match="model"):
        trainer.publish("bad name", 2, weights)
    with pytest.raises(InvalidRequest, match="non-negative"):
        trainer.publish("policy", -1, weights)
    with pytest.raises(InvalidRequest, match="not contiguous"):
        trainer.publish("policy", 2, {"w": torch.randn(4, 4).t()})
    with pytest.raises(InvalidRequest, match="non-empty"):
        trainer.publish("policy", 2, {})
    with pytest.raises(InvalidRequest, match="already holds"):
        trainer.fetch("policy", 1, into={n: torch.empty_like(t) for n, t in weights.items()})
    with pytest.raises(ConfigError, match="window"):
        th.ClientConfig.from_fields(window=0)
    assert reader.versions("policy") == {1: ["trainer"]}


def test_malformed_and_oversized_requests_are_refused():
    server = HubServer(max_body_bytes=4096).start()
    try:
        url = server.url
        bad_type = httpx.post(f"{url}/v1/workers/register", json={"worker": 5})
        assert bad_type.status_code == 422 and bad_type.json()["error"] == "InvalidRequest"
        extra = httpx.post(f"{url}/v1/workers/register", json={
            "worker": "w", "location": {}, "agent_name": "a", "agent_metadata_b64": "", "surprise": 1})
        assert extra.status_code == 422 and "surprise" in extra.json()["detail"]
        not_json = httpx.post(f"{url}/v1/publish", content=b"{not json", headers={"content-type": "application/json"})
        assert not_json.status_code == 422
        huge = httpx.post(f"{url}/v1/workers/register", content=b"x" * 10_000,
                          headers={"content-type": "application/json"})
        assert huge.status_code == 413 and "limit" in huge.json()["detail"]
        bad_version = httpx.get(f"{url}/v1/manifest", params={"model": "m", "version": "seven"})
        assert bad_version.status_code == 400 and "integer" in bad_version.json()["detail"]
        assert httpx.get(f"{url}/v1/status").json()["workers"] == {}
    finally:
        server.stop()


def test_with_a_token_nothing_is_served_without_it():
    server = th.start_hub(token="s3cret")
    try:
        for method, path in [("GET", "/v1/status"), ("GET", "/metrics"), ("GET", "/healthz"),
                             ("POST", "/v1/publish"), ("POST", "/v1/workers/register")]:
            response = httpx.request(method, server.url + path, json={})
            assert response.status_code == 401, path
            assert "token" in response.json()["detail"]
        assert httpx.get(server.url + "/v1/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
        with pytest.raises(Unauthorized):
            th.connect(server.url, "intruder")
        with pytest.raises(HubNotProven):  # a wrong token cannot check the hub's proof: it sends nothing
            th.connect(server.url, "intruder", token="wrong", job_key="k", hub_retry_s=1.0)
        with th.connect(server.url, "trainer", token="s3cret", job_key="k") as trainer:
            trainer.publish("policy", 1, make_weights(0, 0.1))
            with th.connect(server.url, "reader", token="s3cret", job_key="k") as reader:
                assert digest(reader.fetch("policy", 1).buffers) == digest(make_weights(0, 0.1))
                assert sorted(reader.status()["workers"]) == ["reader", "trainer"]  # no intruder got in
    finally:
        server.stop()


def test_metrics_report_bytes_served_holders_and_latency(published, hub):
    _, reader, weights = published
    stats = reader.fetch("policy", 1)
    text = httpx.get(hub.url + "/metrics").text
    assert f'tensorhub_bytes_served_total{{worker="trainer"}} {float(stats.bytes)}' in text
    assert 'tensorhub_version_holders{layout="hf",model="policy",version="1"} 2.0' in text
    assert 'tensorhub_fetch_seconds_count{model="policy"} 1.0' in text


def test_retention_drops_versions_older_than_the_newest_n():
    server = th.start_hub(config=th.HubConfig(keep_versions=1, heartbeat_s=0.2))
    try:
        with th.connect(server.url, "trainer", chunk_bytes=CHUNK) as trainer:
            trainer.publish("policy", 1, make_weights(1, 0.1))
            trainer.publish("policy", 2, make_weights(2, 0.1))
            deadline = time.monotonic() + 10
            while 1 in trainer.versions("policy") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert trainer.versions("policy") == {2: ["trainer"]}
            assert trainer.holdings() == [("policy", 2, "hf")]
    finally:
        server.stop()


def test_the_last_reliable_copy_of_a_retained_version_is_kept_in_cpu_memory(hub):
    weights = make_weights(3, 0.2)
    original = digest(weights)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "spot-rollout", spot=True) as spot:
        trainer.publish("policy", 1, weights)
        spot.fetch("policy", 1)  # a spot copy is not a reliable one
        trainer.unpublish("policy", 1)
        for t in weights.values():  # the trainer may now overwrite its buffers
            t.zero_()
        assert "trainer~cpu" in str(trainer.status()["models"])
        spot.unpublish("policy", 1)
        with th.connect(hub.url, "late") as late:
            assert digest(late.fetch("policy", 1).buffers) == original


def test_a_request_without_the_token_is_refused_before_its_body_is_read():
    """A stranger announces a 60 MiB body and sends 1 KiB of it: the hub answers 401 at once (it does not wait
    for, read or parse the body), and closes the connection."""
    import socket
    from urllib.parse import urlparse

    server = th.start_hub(token="s3cret")
    try:
        url = urlparse(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            s.sendall(b"POST /v1/publish HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 62914560\r\n\r\n" + b"[" * 1024)
            reply = b""
            while b"\r\n\r\n" not in reply:
                piece = s.recv(4096)  # a hub that waited for the body would time out here (10 s)
                assert piece, "the hub closed the connection without answering"
                reply += piece
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
        assert b"connection: close" in reply.lower()
    finally:
        server.stop()
