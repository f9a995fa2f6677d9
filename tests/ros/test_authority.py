"""Per-worker authority: the shared token admits a worker; after that a worker acts only as itself."""

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError, NotOwner
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER

from tests.ros.roles import digest, make_weights

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def guarded():
    # Keyless workers admitted (HubConfig.allow_keyless): what a worker's credential proves holds in one job too.
    server = th.start_hub(token=TOKEN, config=th.HubConfig(heartbeat_s=0.5, allow_keyless=True))
    yield server
    server.stop()


def _register(url, worker, credential=None):
    headers = AUTH | ({CREDENTIAL_HEADER: credential} if credential else {})
    return httpx.post(f"{url}/v1/workers/register", headers=headers, timeout=10, json={
        "worker": worker, "location": {}, "agent_name": f"{worker}-evil", "agent_metadata_b64": "AA=="})


def _state(url):
    status = httpx.get(f"{url}/v1/status", headers=AUTH, timeout=10).json()
    return status["models"], {w: (r["location"], r["spot"]) for w, r in status["workers"].items()}


def test_a_worker_with_the_token_cannot_act_for_another(guarded):
    url = guarded.url
    with th.connect(url, "trainer", token=TOKEN, chunk_bytes=64 << 10) as trainer:
        weights = make_weights(2, 0.2)
        trainer.publish("policy", 1, weights)
        manifest = httpx.get(f"{url}/v1/manifest", params={"model": "policy", "version": "1"}, headers=AUTH).json()
        joined = _register(url, "mallory")
        assert joined.status_code == 200 and len(joined.json()["credential"]) >= 32
        mine = AUTH | {CREDENTIAL_HEADER: joined.json()["credential"]}
        before = _state(url)
        regions = [{"addr": 4096}] * len(manifest["tensors"])
        key = {"model": "policy", "version": 1, "layout": "hf"}
        attempts = {
            "publish as trainer": ("/v1/publish", {"worker": "trainer", "holder": "trainer", "manifest": manifest,
                                                   "regions": regions}, mine),
            "publish under trainer's holder": ("/v1/publish", {"worker": "mallory", "holder": "trainer",
                                                               "manifest": manifest, "regions": regions}, mine),
            "publish as trainer's archive": ("/v1/publish", {"worker": "mallory", "holder": "trainer~cpu",
                                                             "manifest": manifest, "regions": regions}, mine),
            "unpublish trainer's copy": ("/v1/unpublish", {"worker": "mallory", "holder": "trainer"} | key, mine),
            "unpublish as trainer": ("/v1/unpublish", {"worker": "trainer", "holder": "trainer"} | key, mine),
            "unpublish as trainer, no credential": ("/v1/unpublish", {"worker": "trainer", "holder": "trainer"} | key,
                                                    AUTH),
            "fetch as trainer": ("/v1/fetch/begin", {"worker": "trainer", "holder": "trainer", "regions": regions,
                                                     "digest": "x"} | key, mine),
            "end trainer's fetch": ("/v1/fetch/end", {"worker": "mallory", "holder": "trainer", "ok": False,
                                                      "hold": False} | key, mine),
        }
        for what, (path, body, headers) in attempts.items():
            response = httpx.post(url + path, json=body, headers=headers, timeout=10)
            assert response.status_code == 403, (what, response.text)
            assert response.json()["error"] == "NotOwner", what
        for path in ("/v1/workers/heartbeat", "/v1/workers/leave"):
            for headers in (mine, AUTH):
                response = httpx.post(url + path, params={"worker": "trainer"}, headers=headers, timeout=10)
                assert response.status_code == 403, (path, response.text)
        taken = _register(url, "trainer")  # a live id cannot be taken over
        assert taken.status_code == 403 and "credential" in taken.json()["detail"]
        assert _register(url, "trainer", credential=joined.json()["credential"]).status_code == 403
        assert _state(url) == before
        # The owner itself is unaffected and keeps full authority.
        with th.connect(url, "reader", token=TOKEN) as reader:
            assert digest(reader.fetch("policy", 1).buffers) == digest(weights)
        trainer.publish("policy", 2, make_weights(3, 0.2))  # registers new memory: re-registers its own id
        trainer.unpublish("policy", 1)
        assert trainer.holdings() == [("policy", 2, "hf")]


def test_a_live_id_is_taken_only_after_its_owner_leaves(guarded):
    first = th.connect(guarded.url, "rollout-0", token=TOKEN)
    with pytest.raises(NotOwner, match="live worker"):
        th.connect(guarded.url, "rollout-0", token=TOKEN, hub_retry_s=1.0)
    first.close()  # leaves: the id is free at once
    with th.connect(guarded.url, "rollout-0", token=TOKEN) as second:
        assert "rollout-0" in second.status()["workers"]


def test_worker_ids_may_not_use_the_holder_separator(guarded):
    with pytest.raises(ConfigError, match="~"):
        th.connect(guarded.url, "trainer~cpu", token=TOKEN)
    refused = _register(guarded.url, "trainer~cpu")
    assert refused.status_code == 422
