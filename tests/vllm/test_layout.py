"""HF -> vLLM layout mapping (fused qkv/gate_up, TP shards, KV-head replication, vocab padding)."""

from __future__ import annotations

import pytest
import torch

from tensorhub_verl.errors import ConfigError, ManifestMismatch
from tensorhub_verl.bench.tiny_model import random_hf_weights
from tensorhub_dev.testing.layout_oracle import hf_to_vllm, vllm_to_hf
from tensorhub_verl.vllm.layout import DecoderShape, hf_views, layout_name, parse_layout_name, vllm_param_shapes

pytestmark = pytest.mark.vllm


def _shape(arch: str, vocab: int = 300, heads: int = 4, kv: int = 2) -> DecoderShape:
    return DecoderShape(arch=arch, num_layers=2, hidden_size=128, intermediate_size=256, num_heads=heads,
                        num_kv_heads=kv, head_dim=128 // heads, vocab_size=vocab,
                        tie_word_embeddings=arch == "qwen2", qkv_bias=arch == "qwen2")


def _random_hf(shape: DecoderShape, seed: int = 0) -> dict[str, torch.Tensor]:
    return random_hf_weights(shape, seed)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_roundtrip_is_exact(arch, tp):
    shape = _shape(arch)
    hf = _random_hf(shape)
    shards = [hf_to_vllm(hf, shape, tp, r) for r in range(tp)]
    for r, s in enumerate(shards):
        assert {n: tuple(t.shape) for n, t in s.items()} == vllm_param_shapes(shape, tp, r)
        assert all(t.is_contiguous() for t in s.values())
    back = vllm_to_hf(shards, shape)
    assert back.keys() == hf.keys()
    for name in hf:
        assert torch.equal(back[name], hf[name]), name


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_hf_views_land_each_hf_slice_where_the_loader_puts_it(arch, tp):
    """Each rank's slice of each HF tensor, copied into its view, rebuilds exactly that rank's parameters; at
    TP=1 there are no slices (every HF tensor is read whole)."""
    shape = _shape(arch, vocab=300 if tp < 4 else 130)  # 130 (padded 192): rank 3 of 4 holds padding only
    hf = _random_hf(shape)
    for rank in range(tp):
        params = {n: torch.full(s, 7.0) for n, s in vllm_param_shapes(shape, tp, rank).items()}
        mapped = hf_views(params, shape, tp, rank)
        assert set(mapped.views) | set(mapped.unused) <= set(hf) | {"lm_head.weight"}
        assert (tp == 1) == (not mapped.slices)
        for name, view in mapped.views.items():
            dim, start, length = mapped.slices.get(name, (0, 0, hf[name].shape[0]))
            view.copy_(hf[name].narrow(dim, start, length))
        for pad in mapped.padding:
            pad.zero_()
        expected = hf_to_vllm(hf, shape, tp, rank)
        for name, t in expected.items():
            assert torch.equal(params[name], t), (rank, name)
        assert all(v.is_contiguous() for v in mapped.views.values())


def test_tp2_splits_heads_and_fuses_in_vllm_order():
    shape = _shape("qwen2")
    hf = _random_hf(shape)
    r1 = hf_to_vllm(hf, shape, 2, 1)
    qkv = r1["model.layers.0.self_attn.qkv_proj.weight"]
    hd = shape.head_dim
    # rank 1 holds q heads 2..3, then kv head 1 of k, then kv head 1 of v
    assert torch.equal(qkv[: 2 * hd], hf["model.layers.0.self_attn.q_proj.weight"][2 * hd: 4 * hd])
    assert torch.equal(qkv[2 * hd: 3 * hd], hf["model.layers.0.self_attn.k_proj.weight"][hd: 2 * hd])
    assert torch.equal(qkv[3 * hd:], hf["model.layers.0.self_attn.v_proj.weight"][hd: 2 * hd])
    bias = r1["model.layers.0.self_attn.qkv_proj.bias"]
    assert torch.equal(bias[2 * hd: 3 * hd], hf["model.layers.0.self_attn.k_proj.bias"][hd: 2 * hd])
    gate_up = r1["model.layers.1.mlp.gate_up_proj.weight"]
    assert torch.equal(gate_up[:128], hf["model.layers.1.mlp.gate_proj.weight"][128:])
    assert torch.equal(gate_up[128:], hf["model.layers.1.mlp.up_proj.weight"][128:])
    # row-parallel layers split their input (columns)
    assert torch.equal(r1["model.layers.0.mlp.down_proj.weight"], hf["model.layers.0.mlp.down_proj.weight"][:, 128:])
    assert torch.equal(r1["model.layers.0.self_attn.o_proj.weight"], hf["model.layers.0.self_attn.o_proj.weight"][:, 64:])
    assert "lm_head.weight" not in r1  # tied embeddings: vLLM has no separate lm_head parameter


def test_tp4_replicates_kv_heads_when_fewer_than_ranks():
    shape = _shape("llama")  # 4 heads, 2 KV heads, tp 4: each KV head lives on 2 ranks
    hf = _random_hf(shape)
    shards = [hf_to_vllm(hf, shape, 4, r) for r in range(4)]
    hd = shape.head_dim
    name = "model.layers.1.self_attn.qkv_proj.weight"
    assert all(s[name].shape == (3 * hd, 128) for s in shards)
    kv = [s[name][hd:] for s in shards]
    assert torch.equal(kv[0], kv[1]) and torch.equal(kv[2], kv[3]) and not torch.equal(kv[1], kv[2])
    k_full = hf["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(shards[3][name][hd: 2 * hd], k_full[hd:])
    q = [s[name][:hd] for s in shards]
    assert torch.equal(torch.cat(q), hf["model.layers.1.self_attn.q_proj.weight"])


def test_vocab_is_padded_to_64_and_sharded():
    shape = _shape("llama", vocab=300)
    hf = _random_hf(shape)
    shards = [hf_to_vllm(hf, shape, 4, r) for r in range(4)]
    assert shape.padded_vocab == 320
    emb = [s["model.embed_tokens.weight"] for s in shards]
    assert all(e.shape == (80, 128) for e in emb)
    assert torch.equal(emb[3][:60], hf["model.embed_tokens.weight"][240:])
    assert torch.count_nonzero(emb[3][60:]) == 0  # vLLM zero-fills the padding rows


def test_invalid_tp_and_names_raise():
    with pytest.raises(ConfigError):
        vllm_param_shapes(_shape("llama"), 3, 0)
    with pytest.raises(ConfigError):
        layout_name("llama", 2, 2)
    with pytest.raises(ConfigError):
        DecoderShape(arch="gpt2", num_layers=1, hidden_size=8, intermediate_size=8, num_heads=1, num_kv_heads=1,
                     head_dim=8, vocab_size=8, tie_word_embeddings=False, qkv_bias=False)
    shape = _shape("llama")
    hf = _random_hf(shape)
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ManifestMismatch) as e:
        hf_to_vllm(hf, shape, 1, 0)
    assert e.value.tensor == "model.layers.1.mlp.up_proj.weight"


def test_layout_names_roundtrip():
    assert layout_name("qwen2", 2, 1) == "vllm/qwen2/tp2/rank1"
    assert parse_layout_name("vllm/qwen2/tp2/rank1") == ("qwen2", 2, 1)
    with pytest.raises(ConfigError):
        parse_layout_name("hf")


def test_shape_from_hf_config(tiny_models):
    from transformers import AutoConfig

    for arch, d in tiny_models.items():
        shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(d))
        assert shape.arch == arch and shape.vocab_size == 300 and shape.head_dim == 32
        assert shape.tie_word_embeddings == (arch == "qwen2") and shape.qkv_bias == (arch == "qwen2")
