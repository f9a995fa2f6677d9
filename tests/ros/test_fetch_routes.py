"""The hot fetch routes (/v1/fetch/begin, /v1/fetch/exchange), answered before FastAPI, refuse what the other
routes refuse, with the same typed errors, and answer a real fetch's requests (real hub process, real HTTP)."""

import httpx
import pytest

from tensorhub_verl.ros.hub_server import HubServer
from tensorhub_verl.ros.messages import CREDENTIAL_HEADER, INSTANCE_HEADER

WHO = {"worker": "r", "holder": "r", "model": "m", "version": 1, "layout": "hf"}


@pytest.fixture
def hub_url():
    server = HubServer(token="t0ken").start()
    try:
        yield server.url
    finally:
        server.stop()


def _post(url: str, path: str, body, credential: str = "", token: str = "t0ken", **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", CREDENTIAL_HEADER: credential}
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, headers=headers | {"content-type": "application/json"}, **kw)
    return httpx.post(url + path, json=body, headers=headers, **kw)


def _register(url: str, worker: str) -> str:
    reply = _post(url, "/v1/workers/register", {"worker": worker, "location": {}, "agent_name": f"{worker}-a",
                                                 "agent_metadata_b64": "AAAA"})
    assert reply.status_code == 200, reply.text
    return reply.json()["credential"]


@pytest.mark.parametrize("path", ["/v1/fetch/begin", "/v1/fetch/exchange"])
def test_fetch_routes_refuse_bad_requests_with_typed_errors(hub_url, path):
    credential = _register(hub_url, "r")
    cases = {
        "no token": (_post(hub_url, path, WHO, credential, token="wrong"), 401, "Unauthorized"),
        "not json": (_post(hub_url, path, b"{not json", credential), 422, "InvalidRequest"),
        "unknown field": (_post(hub_url, path, WHO | {"surprise": 1}, credential), 422, "InvalidRequest"),
        "wrong type": (_post(hub_url, path, WHO | {"version": "1"}, credential), 422, "InvalidRequest"),
        "long credential": (_post(hub_url, path, WHO, "x" * 300), 422, "InvalidRequest"),
        "wrong credential": (_post(hub_url, path, WHO | {"digest": "d", "regions": []}
                                   if path.endswith("begin") else WHO, "not-it"), 403, "NotOwner"),
        "unknown worker": (_post(hub_url, path, WHO | {"worker": "ghost", "holder": "ghost"}
                                 | ({"digest": "d", "regions": []} if path.endswith("begin") else {}), credential),
                           404, "UnknownWorker"),
    }
    for name, (reply, status, error) in cases.items():
        assert reply.status_code == status, (name, reply.text)
        assert reply.json()["error"] == error, (name, reply.text)
        assert reply.headers.get(INSTANCE_HEADER), name
    assert "surprise" in cases["unknown field"][0].json()["detail"]


def test_exchange_of_a_fetch_the_hub_does_not_know_names_it(hub_url):
    credential = _register(hub_url, "r")
    reply = _post(hub_url, "/v1/fetch/exchange", WHO | {"wait_s": 0.1}, credential)
    assert reply.status_code == 404 and reply.json()["error"] == "UnknownFetch", reply.text
    assert "begin the fetch first" in reply.json()["detail"]
