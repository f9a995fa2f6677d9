"""Tiny models of many architectures, published by a toy trainer under checkpoint names and served by vLLM
engines (CPU build, float32) that started from dummy weights: after each of two versions the engine's greedy
tokens are transformers' greedy tokens on the published weights (``greedy_mismatch``: near-ties aside).

Default suite: qwen3 (in place: the mapping checked against vLLM's loader at set-up), gemma2 (buckets through
the engine's loader; a tied head that vLLM's Gemma2 loader rejects by name) and qwen3_moe (buckets; vLLM's CPU
experts kernel prepacks on every reload only through ``compat.prepare_reload``), whose engine then refuses a
version missing one expert. The full matrix (every other architecture at TP=1, mixtral included, four at
TP=2) is slow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from tests.requires import require

require("vllm")

from tensorhub_verl.vllm.engine_proc import EngineError, EngineProcess, EngineSpec, running_engines
from tensorhub_verl.bench.tiny_model import ARCHITECTURES, build_tiny_model, greedy_mismatch
from tensorhub_verl.vllm.results import HolderStatus
from tests.vllm.toy_run import N_NEW, PROMPTS, ToyRun

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

BUCKET_BYTES = 96 << 10
"""Small enough that a tiny model takes several buckets (each at least one decoder layer)."""
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
IN_PLACE = {"llama", "qwen2", "qwen3", "mistral"}


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("arch_models")
    return {a: str(build_tiny_model(root / a, arch=a, bpe_vocab=300, seed=3)) for a in ARCHITECTURES}


def spec(hub, arch: str, model_dir: str, tp: int = 1, staging: str = "none") -> EngineSpec:
    worker = f"{arch}-e{tp}"
    return EngineSpec(model_dir=model_dir, hub_url=hub.url, worker=worker, model=f"{arch}-tp{tp}", tp_size=tp,
                      staging=staging, bucket_bytes=BUCKET_BYTES, location={"dc": "dc0", "rack": "r0", "node": worker},
                      env=dict(TP2_ENV) if tp > 1 else {}, client_config={"read_timeout_s": 10.0})


DEFAULT_ENGINES = {"test_engine_follows_two_versions[qwen3]": "qwen3",
                   "test_engine_follows_two_versions[gemma2]": "gemma2",
                   "test_moe_engine_follows_two_versions_and_refuses_a_missing_expert": "qwen3_moe"}
"""The default suite's TP=1 engines, by the test that uses each."""


@pytest.fixture(scope="module")
def default_engines(request, hub, arch_models):
    """The engines of the collected default tests, started together (each follows its own model)."""
    collected = {item.name for item in request.session.items if item.module.__name__ == request.module.__name__}
    archs = [arch for test, arch in DEFAULT_ENGINES.items() if test in collected]
    with running_engines([spec(hub, arch, arch_models[arch]) for arch in archs], start_timeout_s=600) as started:
        yield dict(zip(archs, started))


def assert_serves(e: EngineProcess, run: ToyRun, version: int) -> None:
    for prompt in PROMPTS:
        tokens = e.generate(prompt, N_NEW)
        at = greedy_mismatch(run.models[version], prompt, tokens)
        assert at is None, f"v{version}: engine's token {at} is not transformers' greedy choice ({tokens})"


def follow_two_versions(hub, trainer, arch: str, model_dir: str, tp: int,
                        then: Callable[[EngineProcess, ToyRun, str], None] | None = None,
                        started: EngineProcess | None = None) -> None:
    """Two versions published and served exactly; ``then(engine, run, model)`` runs after, engine still up.
    The engine is ``started`` (a fresh one of ``spec``'s, not yet updated) or one started here."""
    model = f"{arch}-tp{tp}"
    run = ToyRun(model_dir, trainer)
    with (contextlib.nullcontext(started) if started is not None
          else EngineProcess(spec(hub, arch, model_dir, tp=tp), start_timeout_s=600)) as e:
        layout = e.rpc("th_layout")
        assert all(r["in_place"] == (arch in IN_PLACE) for r in layout), layout
        for version in (1, 2):
            run.step_and_publish(version, model=model)
            res = e.update("latest")
            assert res["version"] == version and set(res["sources"]) == {"trainer"}, res
            model_bytes = sum(t.numel() * t.element_size() for t in run.weights[version].values())
            if arch in IN_PLACE:
                assert res["peak_bucket_bytes"] == 0, res  # straight into the parameters
            else:  # a bucket at a time, never the whole model
                assert 0 < res["peak_bucket_bytes"] < model_bytes / 2, (res["peak_bucket_bytes"], model_bytes)
            assert_serves(e, run, version)
        assert run.refs[2] != run.refs[1]
        if then is not None:
            then(e, run, model)


@pytest.mark.parametrize("arch", ["qwen3", "gemma2"])
def test_engine_follows_two_versions(hub, trainer, arch_models, default_engines, arch):
    follow_two_versions(hub, trainer, arch, arch_models[arch], tp=1, started=default_engines[arch])


def refuses_a_version_missing_one_expert(e: EngineProcess, run: ToyRun, model: str) -> None:
    """v3 lacks expert 1 of layer 0: the loader leaves its slots unwritten (NaN), the engine refuses v3 and
    serves v2 again, restored from the trainer."""
    expert = "model.layers.0.mlp.experts.1."
    partial = {n: t for n, t in run.weights[2].items() if not n.startswith(expert)}
    assert len(partial) < len(run.weights[2])
    run.client.publish(model, 3, partial)
    with pytest.raises(EngineError, match="unwritten.*layers.0.mlp.experts"):
        e.update(3)
    status = [HolderStatus.from_wire(r) for r in e.rpc("th_status")]
    assert all(r.served == 2 and not r.broken for r in status), status
    assert_serves(e, run, 2)


def test_moe_engine_follows_two_versions_and_refuses_a_missing_expert(hub, trainer, arch_models, default_engines):
    """Without ``compat.prepare_reload`` vLLM's CPU build serves other experts after the first reload (its
    experts kernel prepacks on the first load only), and without ``compat.unloaded_elements_nan`` a missing
    expert is served from uninitialized memory."""
    follow_two_versions(hub, trainer, "qwen3_moe", arch_models["qwen3_moe"], tp=1,
                        then=refuses_a_version_missing_one_expert, started=default_engines["qwen3_moe"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a not in ("qwen3", "gemma2", "qwen3_moe")])
def test_engine_follows_two_versions_full_matrix(hub, trainer, arch_models, arch):
    follow_two_versions(hub, trainer, arch, arch_models[arch], tp=1)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "phi3", "mistral", "qwen3_moe"])
def test_tp2_engine_follows_two_versions(hub, trainer, arch_models, arch):
    follow_two_versions(hub, trainer, arch, arch_models[arch], tp=2)
