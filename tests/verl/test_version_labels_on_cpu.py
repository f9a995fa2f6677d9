"""verl 0.9.1's own classes, patched (``verl_0_9_1_version_labels``): a response's labels come from the version
spans its engine recorded, and a held replica's gate parks new requests until released.

The fast checks of the patch: verl's real ``FullyAsyncLLMServerClient.generate`` resume loop with its server
replaced by a scripted one (the real servers run in test_verl_trainer_on_cpu), and verl's real submission gate
of ``vLLMHttpServer`` driven on an instance built without an engine (the gate needs none).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.requires import require

require("verl")

pytestmark = pytest.mark.timeout(120)


def _job_config(backend: str, audit_dir=None):
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "name": "vllm", "response_length": 9, "full_determinism": False,
        "checkpoint_engine": {"backend": backend,
                              "engine_kwargs": {"tensorhub": {"version_audit_dir": audit_dir}}}}},
        "async_training": {"partial_rollout": True}})


class _ScriptedServer:
    """A rollout server answering each call with the next scripted output, as verl's patched server labels it:
    ``global_steps`` the counter (already bumped to the new version when the first part was aborted), and the
    engine's spans."""

    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.request_ids: list[str] = []
        self.generate = self

    def remote(self, **kwargs):
        self.request_ids.append(kwargs["request_id"])

        async def answer():
            return self.outputs.pop(0)

        return answer()


def _client(config, server):
    import tensorhub_verl.verl.checkpoint_engine  # noqa: F401  registers the patches
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    class Client(FullyAsyncLLMServerClient):
        async def _acquire_server(self, request_id, **extra):
            return "s0", server

        def _release_server(self, server_id, request_id=None):
            return None

    return Client(config, load_balancer_handle=None)


def _parts():
    from verl.workers.rollout.replica import TokenOutput

    aborted = TokenOutput(token_ids=[1, 2, 3, 4, 5], stop_reason="aborted",
                          extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3,
                                        "weight_versions": json.dumps([[2, 0, 5]])})
    resumed = TokenOutput(token_ids=[6, 7, 8, 9], stop_reason="completed",
                          extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3,
                                        "weight_versions": json.dumps([[3, 0, 4]])})
    return [aborted, resumed]


def test_a_partial_rollout_resumed_on_a_new_version_is_labelled_by_its_spans(tmp_path):
    server = _ScriptedServer(_parts())
    client = _client(_job_config("tensorhub", str(tmp_path)), server)
    out = asyncio.run(client.generate("req-1", prompt_ids=[9, 9], sampling_params={}))
    assert out.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # v2 sampled the first 5 tokens, v3 the last 4: verl's counter alone said 3 and 3.
    assert json.loads(out.extra_fields["weight_versions"]) == [[2, 0, 5], [3, 5, 9]]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (2, 3)
    assert out.extra_fields["global_steps"] == 3
    (line,) = [json.loads(x) for f in tmp_path.glob("client-*.jsonl") for x in f.read_text().splitlines()]
    assert line["spans"] == [[2, 0, 5], [3, 5, 9]] and line["parts"] == [[[[2, 0, 5]], 5], [[[3, 0, 4]], 4]]
    # each part named by the engine request id the server's own audit line names it by
    assert len(line["engine_requests"]) == 2 and len(set(line["engine_requests"])) == 2
    assert server.request_ids == line["engine_requests"]


def test_another_backend_keeps_verls_labels():
    server = _ScriptedServer(_parts())
    client = _client(_job_config("nccl"), server)
    out = asyncio.run(client.generate("req-2", prompt_ids=[9, 9], sampling_params={}))
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (3, 3)


def _server(backend: str):
    import tensorhub_verl.verl.checkpoint_engine  # noqa: F401  registers the patches
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    server = object.__new__(vLLMHttpServer)  # the gate's state, as vLLMHttpServer.__init__ sets it
    server.config = _job_config(backend).actor_rollout_ref.rollout
    server._submission_paused, server._admitting, server._rejecting = False, 0, False
    server._resume_event = asyncio.Event()
    server._resume_event.set()
    return server


def test_a_held_gate_parks_new_requests_until_released_and_counts_them():
    async def scenario():
        server = _server("tensorhub")
        assert await server.th_hold_admission(True) == {"held": True, "held_back": 0}
        parked = asyncio.create_task(server._park_until_admitted("r1"))
        await asyncio.sleep(0.2)
        assert not parked.done()  # a new request waits at the held gate
        await server.open_submission_gate()  # verl's resume after a weight update...
        await asyncio.sleep(0.2)
        assert not parked.done()  # ...does not open a gate held for staleness
        assert await server.th_hold_admission(False) == {"held": False, "held_back": 1}
        assert await asyncio.wait_for(parked, 5) is None  # admitted
        assert server._admitting == 1 and not server._submission_paused

    asyncio.run(scenario())
