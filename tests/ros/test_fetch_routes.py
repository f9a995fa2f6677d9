"""The hot fetch routes (/v1/fetch/begin, /v1/fetch/exchange), answered before FastAPI, refuse what the other
routes refuse, with the same typed errors, and answer a real fetch's requests (real hub process, real HTTP)."""

import httpx
import pytest

from tensorhub_verl.ros.hub.server import HubServer
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER, INSTANCE_HEADER, JOB_KEY_HEADER

WHO = {"worker": "r", "holder": "r", "model": "m", "version": 1, "layout": "hf"}


@pytest.fixture
def hub_url():
    server = HubServer(token="t0ken").start()
    try:
        yield server.url
    finally:
        server.stop()


def _post(url: str, path: str, body, credential: str = "", token: str = "t0ken", headers: dict | None = None,
          **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}", CREDENTIAL_HEADER: credential} | (headers or {})
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, headers=headers | {"content-type": "application/json"}, **kw)
    return httpx.post(url + path, json=body, headers=headers, **kw)


def _register(url: str, worker: str) -> str:
    reply = _post(url, "/v1/workers/register", {"worker": worker, "location": {}, "agent_name": f"{worker}-a",
                                                 "agent_metadata_b64": "AAAA"}, headers={JOB_KEY_HEADER: "job"})
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


def test_a_parked_exchange_plans_again_when_a_lease_ends_not_on_every_poll():
    # In-process hub app (the real routes and HubState over ASGI): reader b waits for work while reader a, on
    # its node, pulls every chunk (rule 2). b's parked exchange plans only when something may have changed, and
    # gets work as soon as a's lease ends.
    import asyncio

    from tensorhub_verl.ros.wire import messages as msg
    from tensorhub_verl.ros.hub.app import create_app
    from tensorhub_verl.ros.hub.config import HubConfig
    from tensorhub_verl.ros.hub.state import HubState
    from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
    from tensorhub_verl.ros.wire.convert import manifest_to_msg

    chunk, chunks = 4096, 64
    manifest = Manifest("m", 1, "hf", (TensorSpec("w", (chunks * chunk,), "uint8", chunks * chunk),), chunk, "f")
    state = HubState(HubConfig(lease_ttl_s=3600))
    creds = {}
    for worker, node in (("trainer", "t"), ("a", "n0"), ("b", "n0")):
        creds[worker] = state.register_worker(msg.RegisterWorker(
            worker=worker, location=msg.LocationMsg(node=node), agent_name=f"{worker}-x",
            agent_metadata_b64="AAAA")).credential
    published = manifest_to_msg(manifest).model_copy(update={"chunk_digests": ["0" * 16] * chunks})
    state.publish(msg.Publish(worker="trainer", holder="trainer", manifest=published,
                              regions=[msg.RegionMsg(addr=1 << 20)]))
    plans = []
    exchange = state.exchange
    state.exchange = lambda req, *park: plans.append(req.worker) or exchange(req, *park)
    app = create_app(state)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hub") as http:
            async def post(worker, path, body):
                reply = await http.post(path, json=WHO | {"worker": worker, "holder": worker} | body,
                                        headers={CREDENTIAL_HEADER: creds[worker]})
                assert reply.status_code == 200, reply.text
                return reply.json()

            begin = {"digest": manifest.digest, "regions": [{"addr": 1 << 20}], "want": 4, "run_chunks": 1024}
            first_a = (await post("a", "/v1/fetch/begin", begin))["first"]
            assert sum(x["count"] for x in first_a["assignments"]) == chunks  # a pulls every chunk
            await post("b", "/v1/fetch/begin", begin | {"want": 0})
            idle = await post("b", "/v1/fetch/exchange", {"want": 4, "run_chunks": 1024, "wait_s": 1.0})
            assert idle["assignments"] == []
            idle_plans = plans.count("b")
            # Nothing changed for a whole second: the first plan parked the reader in the same critical section,
            # and none followed (it was one per 50 ms poll: about 20)
            assert idle_plans == 1, plans
            parked = asyncio.create_task(post("b", "/v1/fetch/exchange", {"want": 4, "run_chunks": 1024,
                                                                          "wait_s": 8.0}))
            await asyncio.sleep(0.1)
            assert not parked.done()
            await post("a", "/v1/fetch/exchange", {"completed": [x["lease"] for x in first_a["assignments"]],
                                                   "want": 0})
            woken = await asyncio.wait_for(parked, 8.0)
            assert woken["assignments"] and woken["assignments"][0]["source"] == "a"

    asyncio.run(scenario())
