"""The general (bucketed) load path and the checks that an engine serves exactly what it applied, without vLLM:
a real hub and real ROS clients; the 'engine' is plain tensors in vLLM's layout and a loader that, like vLLM's,
writes the names it knows through ``layout.hf_views`` and silently skips the others."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.bench.tiny_model import random_hf_weights
from tensorhub_verl.vllm.buckets import plan_buckets
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.layout import DecoderShape, hf_views, layout_name, vllm_param_shapes
from tensorhub_verl.vllm.verify import VersionRefused, check_views_against_loader

pytestmark = pytest.mark.vllm

SHAPE = DecoderShape(arch="qwen3", num_layers=3, hidden_size=64, intermediate_size=128, num_heads=2,
                     num_kv_heads=1, head_dim=32, vocab_size=100, tie_word_embeddings=True, qkv_bias=False,
                     qk_norm=True)
LAYOUT = layout_name("qwen3", 1, 0)
MODEL_BYTES = sum(t.numel() * 4 for t in random_hf_weights(SHAPE).values())


def new_params() -> dict[str, torch.Tensor]:
    return {n: torch.zeros(s) for n, s in vllm_param_shapes(SHAPE).items()}


def skipping_loader(params, swap_kv: bool = False):
    """vLLM-like: known names land where the engine keeps them (vocab padding zeroed), unknown ones are skipped."""
    views = hf_views(params, SHAPE)

    def load(weights):
        for name, t in weights:
            if swap_kv and ".k_proj." in name:
                name = name.replace(".k_proj.", ".v_proj.")
            elif swap_kv and ".v_proj." in name:
                name = name.replace(".v_proj.", ".k_proj.")
            if name in views.views:
                views.views[name].copy_(t)
            if name == "model.embed_tokens.weight":
                for pad in views.padding:
                    pad.zero_()
    return load


def test_plan_buckets_keeps_decoder_layers_whole_and_bounded():
    sizes = [("model.embed_tokens.weight", 40)]
    for i in range(3):
        sizes += [(f"model.layers.{i}.self_attn.q_proj.weight", 30), (f"model.layers.{i}.mlp.up_proj.weight", 30)]
    sizes += [("model.norm.weight", 5), ("lm_head.weight", 40)]
    buckets = plan_buckets(sizes, 70)
    assert [n for b in buckets for n in b] == [n for n, _ in sizes]  # every tensor once, in order
    for b in buckets:
        layers = {n.split(".")[2] for n in b if ".layers." in n}
        assert sum(dict(sizes)[n] for n in b) <= 70 or len(layers) == 1
    for i in range(3):  # a layer's tensors share a bucket
        assert len({k for k, b in enumerate(buckets) for n in b if f".layers.{i}." in n}) == 1
    assert plan_buckets(sizes, 10)[1] == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(errors.ConfigError):
        plan_buckets(sizes, 0)


def test_views_checked_against_the_loader():
    params = new_params()
    for t in params.values():
        t.normal_()
    before = {n: t.clone() for n, t in params.items()}
    views = hf_views(params, SHAPE)
    check_views_against_loader(params, views, views.full_shapes, skipping_loader(params))
    assert all(torch.equal(before[n], params[n]) for n in params)  # the probe left the parameters as they were
    with pytest.raises(errors.ConfigError, match="k_proj|v_proj"):
        check_views_against_loader(params, views, views.full_shapes, skipping_loader(params, swap_kv=True))
    assert all(torch.equal(before[n], params[n]) for n in params)


@pytest.fixture(scope="module")
def trainer(hub):
    c = th.connect(hub.url, worker="trainer", location={"dc": "dc0", "rack": "r0", "node": "n0"})
    yield c
    c.close()


def bucket_holder(hub, worker: str, bucket_bytes: int = 40_000):
    client = th.connect(hub.url, worker=worker, location={"dc": "dc0", "rack": "r0", "node": worker})
    params = new_params()
    h = EngineHolder(client, HolderConfig(model="bk", layout=LAYOUT, staging="cpu", fetch_timeout_s=30,
                                          bucket_bytes=bucket_bytes),
                     params, skipping_loader(params), skip_hf=("lm_head.weight",))
    return h, params, client


def expected(version: int) -> dict[str, torch.Tensor]:
    params = new_params()
    skipping_loader(params)(random_hf_weights(SHAPE, seed=version).items())
    return params


def test_bucketed_load_applies_with_one_bucket_of_memory_and_refuses_skipped_names(hub, trainer):
    trainer.publish("bk", 1, random_hf_weights(SHAPE, seed=1))
    h, params, client = bucket_holder(hub, "eng-bk")
    try:
        res = h.update(1)
        assert res.version == 1 and res.source_layout == "hf"
        assert all(torch.equal(params[n], t) for n, t in expected(1).items())
        assert 0 < res.peak_bucket_bytes < MODEL_BYTES / 2, (res.peak_bucket_bytes, MODEL_BYTES)
        assert "eng-bk" in trainer.versions("bk", layout=LAYOUT)[1]
        # v2 under names the engine does not know (as transformers' fused MoE experts are): its loader skips
        # them, the parameters they would fill stay unwritten, the version is refused and v1 restored
        renamed = {n.replace("mlp.up_proj", "mlp.experts.up_proj"): t
                   for n, t in random_hf_weights(SHAPE, seed=2).items()}
        trainer.publish("bk", 2, renamed)
        with pytest.raises(VersionRefused, match="unwritten.*up_proj"):
            h.update(2)
        assert h.served == 1 and not h.broken
        assert all(torch.equal(params[n], t) for n, t in expected(1).items())
        assert "eng-bk" in trainer.versions("bk", layout=LAYOUT)[1]
        trainer.publish("bk", 3, random_hf_weights(SHAPE, seed=3))
        assert h.update(3).version == 3
        assert all(torch.equal(params[n], t) for n, t in expected(3).items())
    finally:
        h.close()
        client.close()


def test_first_version_refused_leaves_the_shard_serving_nothing(hub, trainer):
    partial = {n: t for n, t in random_hf_weights(SHAPE, seed=4).items() if "layers.2." not in n}
    trainer.publish("bk", 4, partial)
    h, params, client = bucket_holder(hub, "eng-bk2")
    try:
        with pytest.raises(VersionRefused, match="layers.2"):
            h.update(4)
        assert h.served is None and h.broken
        assert "eng-bk2" not in trainer.versions("bk", layout=LAYOUT).get(4, [])
    finally:
        h.close()
        client.close()


def test_checkpoint_names_of_a_fused_moe_model(tmp_path):
    """transformers keeps qwen3_moe experts fused in memory; what is published is the checkpoint's names."""
    from safetensors.torch import load_file

    from tensorhub_verl.hf_names import checkpoint_state_dict
    from tensorhub_verl.bench.tiny_model import build_tiny_model, load_hf_model

    d = build_tiny_model(tmp_path / "moe", arch="qwen3_moe", bpe_vocab=300, seed=1)
    model = load_hf_model(d)
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in model.state_dict())
    published, on_disk = checkpoint_state_dict(model), load_file(str(d / "model.safetensors"))
    assert set(published) == set(on_disk)
    assert all(torch.equal(published[n], on_disk[n]) for n in on_disk)


def test_engine_mapping_picks_buckets_for_quantized_unknown_and_disagreeing_engines():
    from types import SimpleNamespace

    from tensorhub_verl.vllm.mapping import engine_mapping

    cfg = SimpleNamespace(model_type="qwen3", num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                          hidden_size=64, num_hidden_layers=3, intermediate_size=128, vocab_size=100,
                          tie_word_embeddings=True)
    params = new_params()
    ok = engine_mapping(cfg, 1, 0, params, quantization=None, load_hf=skipping_loader(params))
    assert ok.layout == LAYOUT and ok.views is not None and ok.skip_hf == ("lm_head.weight",)
    bad = engine_mapping(cfg, 1, 0, params, quantization=None, load_hf=skipping_loader(params, swap_kv=True))
    assert bad.views is None and "disagrees" in bad.reason
    fp8 = engine_mapping(cfg, 1, 0, params, quantization="fp8", load_hf=skipping_loader(params))
    assert fp8.views is None and fp8.layout == "vllm/qwen3_fp8/tp1/rank0"
    other = engine_mapping(SimpleNamespace(model_type="gemma2", tie_word_embeddings=True), 1, 0, params,
                           quantization=None, load_hf=skipping_loader(params))
    assert other.views is None and other.layout == "vllm/gemma2/tp1/rank0"
