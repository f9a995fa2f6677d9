"""A real vLLM CPU engine (AsyncLLM, engine core in its own process, as verl runs it) applies v2 while a long
greedy generation runs: the response reports two spans, split at the exact output token where v2 took over.

v2 is v1 with the final norm zeroed, so every token it samples is token 0 (all logits equal): the split point
is visible in the tokens themselves. Tokens before it equal v1's own greedy output; tokens from it are 0.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from tests.requires import require

require("vllm")

from tests.vllm.conftest import loc

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = [84, 259, 221, 81, 85, 73, 17, 40]
LONG = 160
APPLY_AFTER = 8


def _child(conn, model_dir: str, hub_url: str) -> None:
    import asyncio

    from tensorhub_verl.vllm.engine_proc import ENGINE_ENV

    os.environ.update(ENGINE_ENV)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"

    async def main() -> dict:
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.async_llm import AsyncLLM

        import tensorhub_verl.vllm.extension  # noqa: F401  (prepares this process before the model loads)
        from tensorhub_verl.vllm.engine_proc import engine_kwargs
        from tensorhub_verl.vllm import version_spans, version_truth

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(model_dir), enable_prefix_caching=False))
        try:
            async def rpc(method, **kwargs):
                return await asyncio.wait_for(engine.collective_rpc(method, kwargs=kwargs), 120)

            async def pull(version):
                await rpc("th_begin_pull", version=version)
                for _ in range(1200):
                    status = (await rpc("th_status"))[0]
                    state = status["pull"]["state"] if isinstance(status, dict) else status.pull.state
                    if state != "pulling":
                        return
                    await asyncio.sleep(0.05)
                raise TimeoutError("pull did not finish")

            await rpc("th_setup", hub_url=hub_url, model="policy", worker="truth-e", location=loc("n1"))
            await pull(1)
            await rpc("th_apply")

            async def generate(rid, n, on_tokens=None):
                params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                final = None
                async for out in engine.generate(TokensPrompt(prompt_token_ids=PROMPT), params, rid):
                    final = out
                    if on_tokens is not None:
                        await on_tokens(len(out.outputs[0].token_ids))
                return final

            ref = await generate("ref", LONG)
            await pull(2)  # staged while nothing runs; the apply below happens mid-generation
            applied = {}

            async def apply_once(n_tokens):
                if not applied and n_tokens >= APPLY_AFTER:
                    applied["seen"] = n_tokens
                    await rpc("th_apply")

            long = await generate("long", LONG, apply_once)
            after = await generate("after", 12)
            return {
                "ref": list(ref.outputs[0].token_ids),
                "long": list(long.outputs[0].token_ids),
                "long_spans": version_spans.to_wire(long.outputs[0].weight_versions),
                "long_taken": version_spans.to_wire(version_truth.take_spans("long")),
                "ref_spans": version_spans.to_wire(ref.outputs[0].weight_versions),
                "after": list(after.outputs[0].token_ids),
                "after_spans": version_spans.to_wire(after.outputs[0].weight_versions),
                "kv_transfer_params": long.kv_transfer_params,
                "applied_seen": applied.get("seen"),
            }
        finally:
            engine.shutdown()

    try:
        conn.send((True, asyncio.run(main())))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback

        conn.send((False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


@pytest.fixture(scope="module")
def straddle(tiny_models, hub, trainer):
    from tensorhub_verl.bench.tiny_model import hf_state_dict, load_hf_model

    weights = hf_state_dict(load_hf_model(tiny_models["qwen2"]))
    v2 = dict(weights)
    v2["model.norm.weight"] = weights["model.norm.weight"].clone().zero_()
    trainer.publish("policy", 1, weights)
    trainer.publish("policy", 2, v2)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, tiny_models["qwen2"], hub.url))
    proc.start()
    try:
        if not parent.poll(540):
            raise TimeoutError("the engine process did not answer within 540 s")
        ok, answer = parent.recv()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    assert ok, answer
    return answer


def test_apply_mid_generation_reports_two_spans_at_the_exact_token(straddle):
    spans = straddle["long_spans"]
    assert len(spans) == 2, spans
    (v_a, start_a, end_a), (v_b, start_b, end_b) = spans
    assert (v_a, v_b) == (1, 2) and start_a == 0 and end_a == start_b and end_b == LONG
    split = end_a
    assert APPLY_AFTER <= split < LONG
    tokens, ref = straddle["long"], straddle["ref"]
    assert tokens[:split] == ref[:split]  # v1 sampled every token before the split
    assert ref[split] != 0  # ...so v1 would not have produced token 0 at the split,
    assert tokens[split:] == [0] * (LONG - split)  # and v2 (zero final norm) produced every token from it
    assert straddle["long_taken"] == spans  # the same spans by request id, for verl's server
    assert straddle["kv_transfer_params"] is None  # the record never leaks into vLLM's own field


def test_requests_on_one_version_report_one_span(straddle):
    assert straddle["ref_spans"] == [[1, 0, LONG]]
    assert straddle["after_spans"] == [[2, 0, 12]] and straddle["after"] == [0] * 12
