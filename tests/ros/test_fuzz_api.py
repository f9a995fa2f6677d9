"""Fuzzes every hub route from its own OpenAPI schema (schemathesis + hypothesis), bounded in examples.

Checks, for every generated request, valid and invalid alike: no 5xx, and a refused request (4xx) leaves
the hub's state exactly as it was. A registered worker's credential rides on every request, so calls can
get past authentication and reach the handlers' own checks.
"""

import random

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.app import create_app
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.hub.limits import HubLimits

EXAMPLES = 40
"""Per route; each route's examples run in well under a second here."""

state = HubState(HubConfig(limits=HubLimits(max_chunks=4096), require_digests=False))
app = create_app(state)
_credential = {"w": ""}


def _seed() -> str:
    """Worker ``w`` holding m v1 (hf): re-made whenever a case removed it (a leave, an unpublish)."""
    status = state.status().model_dump()
    if "w" not in status["workers"]:
        ack = state.register_worker(msg.RegisterWorker(worker="w", location=msg.LocationMsg(),
                                                       agent_name="w-agent", agent_metadata_b64="AAAA"))
        _credential["w"] = ack.credential
    if not any(v["version"] == 1 and v["layout"] == "hf" for v in status["models"].get("m", [])):
        state.publish(msg.Publish(worker="w", holder="w", regions=[msg.RegionMsg(addr=4096)],
                                  manifest=msg.ManifestMsg(model="m", version=1, layout="hf", chunk_bytes=4096,
                                  tensors=[msg.TensorSpecMsg(name="w", shape=[1024], dtype="float32",
                                                             nbytes=4096)])))
    return _credential["w"]


schema = schemathesis.openapi.from_asgi("/openapi.json", app)
# Both valid requests and requests that break the schema (wrong types, out-of-range numbers, extra fields).
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
                                database="none")


# Names and versions the hub knows: random strings almost never hit a registered worker or a published
# version, so half the cases have theirs replaced by these, to reach the handlers' deeper paths.
_KNOWN = {"worker": ["w", "x"], "holder": ["w", "w~cpu", "x"], "model": ["m", "n"], "layout": ["hf", "other"],
          "version": [0, 1, 2, "1", "latest"], "shard_group": ["g"], "shard_count": [1, 2, 3],
          "shard_rank": [None, 0, 1], "row_shards": [1, 2]}


def _focus(value, rng: random.Random):
    if isinstance(value, dict):
        return {k: rng.choice(_KNOWN[k]) if k in _KNOWN and not isinstance(v, (dict, list)) else _focus(v, rng)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_focus(v, rng) for v in value]
    return value


def _snapshot() -> tuple:
    status = state.status().model_dump()
    workers = {w: (r["location"], r["spot"], r["bytes_served"]) for w, r in status["workers"].items()}
    return status["models"], workers, status["leases_in_flight"], status["leases_revoked"]


@pytest.mark.timeout(240)
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_input_gets_a_5xx_or_changes_state_when_refused(case):
    if case.path == "/v1/wait" and isinstance(case.query, dict):
        case.query["timeout"] = 0  # a long-poll would only make the fuzz slow
    for field in ("wait_s",):
        if isinstance(case.body, dict) and isinstance(case.body.get(field), (int, float)):
            case.body[field] = 0
    rng = random.Random(repr((case.path, case.body, case.query)))
    if rng.random() < 0.5:
        if isinstance(case.body, dict):
            case.body = _focus(case.body, rng)
        if isinstance(case.query, dict):
            case.query = _focus(case.query, rng)
    credential = _seed()
    before = _snapshot()
    response = case.call(headers={msg.CREDENTIAL_HEADER: credential})
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
    if 400 <= response.status_code < 500:
        assert _snapshot() == before, f"refused {case.method} {case.path} changed the hub's state"
