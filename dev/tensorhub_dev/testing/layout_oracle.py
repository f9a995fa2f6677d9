"""The HF <-> vLLM layout mapping as plain copies: the oracle that tests and ``bench tp-bytes`` check the
runtime's views (``layout.hf_views``) against, and the 'engine loader' of engine-free holder tests. The runtime
never builds these copies (the point of ``hf_views`` is that no copy exists)."""

from __future__ import annotations

from typing import Mapping

import torch

from tensorhub_verl.errors import ConfigError, ManifestMismatch
from tensorhub_verl.vllm.layout import DecoderShape, kv_slot, vllm_param_shapes


def _get(hf: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return hf[name]
    except KeyError:
        raise ManifestMismatch(f"HF weights lack {name!r}", tensor=name) from None


def _vocab_shard(t: torch.Tensor, shape: DecoderShape, tp_size: int, rank: int) -> torch.Tensor:
    per = shape.padded_vocab // tp_size
    out = t.new_zeros((per, t.shape[1]))
    start = rank * per
    n = max(0, min(per, shape.vocab_size - start))
    if n:
        out[:n] = _rows(t, start, n)
    return out


def hf_to_vllm(hf: Mapping[str, torch.Tensor], shape: DecoderShape, tp_size: int = 1,
               rank: int = 0) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s vLLM parameters built from full HF tensors (new contiguous tensors)."""
    specs = vllm_param_shapes(shape, tp_size, rank)
    hd = shape.head_dim
    q_per = shape.num_heads // tp_size * hd
    kv_first, kv_count = kv_slot(shape, tp_size, rank)
    inter = shape.intermediate_size // tp_size
    out: dict[str, torch.Tensor] = {}
    for name in specs:
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = _vocab_shard(_get(hf, name), shape, tp_size, rank)
        elif name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            kind = name.rsplit(".", 1)[1]
            pre = name.replace("qkv_proj." + kind, "")
            q = _rows(_get(hf, f"{pre}q_proj.{kind}"), rank * q_per, q_per)
            k = _rows(_get(hf, f"{pre}k_proj.{kind}"), kv_first * hd, kv_count * hd)
            v = _rows(_get(hf, f"{pre}v_proj.{kind}"), kv_first * hd, kv_count * hd)
            t = torch.cat([q, k, v], 0)
        elif name.endswith("o_proj.weight"):
            t = _get(hf, name).narrow(1, rank * q_per, q_per)
        elif name.endswith("gate_up_proj.weight"):
            pre = name.replace("gate_up_proj.weight", "")
            t = torch.cat([_rows(_get(hf, pre + "gate_proj.weight"), rank * inter, inter),
                           _rows(_get(hf, pre + "up_proj.weight"), rank * inter, inter)], 0)
        elif name.endswith("down_proj.weight"):
            t = _get(hf, name).narrow(1, rank * inter, inter)
        else:
            t = _get(hf, name)
        if tuple(t.shape) != specs[name]:
            raise ManifestMismatch(f"{name}: built shape {tuple(t.shape)} != vLLM shape {specs[name]}; "
                                   f"the HF tensors do not match the config", tensor=name)
        out[name] = t.clone(memory_format=torch.contiguous_format)
    return out


def vllm_to_hf(shards: list[Mapping[str, torch.Tensor]], shape: DecoderShape) -> dict[str, torch.Tensor]:
    """Inverse of ``hf_to_vllm`` over all ``len(shards)`` ranks: full HF tensors (tied lm_head omitted)."""
    tp = len(shards)
    if tp == 0:
        raise ConfigError("vllm_to_hf needs at least one shard")
    for r, shard in enumerate(shards):
        expected = vllm_param_shapes(shape, tp, r)
        for name, shp in expected.items():
            if name not in shard or tuple(shard[name].shape) != shp:
                raise ManifestMismatch(f"rank {r}: {name} missing or not of shape {shp}", tensor=name)
    hd, d = shape.head_dim, shape.hidden_size
    q_per = shape.num_heads // tp * hd
    inter = shape.intermediate_size // tp
    out: dict[str, torch.Tensor] = {}
    for name in vllm_param_shapes(shape, tp, 0):
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = torch.cat([s[name] for s in shards], 0)[: shape.vocab_size].contiguous()
        elif name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            kind = name.rsplit(".", 1)[1]
            pre = name.replace("qkv_proj." + kind, "")
            tail = (d,) if kind == "weight" else ()
            q = torch.empty((shape.num_heads * hd, *tail), dtype=shards[0][name].dtype)
            k = torch.empty((shape.num_kv_heads * hd, *tail), dtype=q.dtype)
            v = torch.empty_like(k)
            for r, s in enumerate(shards):
                first, count = kv_slot(shape, tp, r)
                t = s[name]
                q[r * q_per:(r + 1) * q_per] = t[:q_per]
                k[first * hd:(first + count) * hd] = t[q_per:q_per + count * hd]
                v[first * hd:(first + count) * hd] = t[q_per + count * hd:]
            out[pre + "q_proj." + kind], out[pre + "k_proj." + kind], out[pre + "v_proj." + kind] = q, k, v
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = torch.cat([s[name] for s in shards], 1).contiguous()
        elif name.endswith("gate_up_proj.weight"):
            pre = name.replace("gate_up_proj.weight", "")
            out[pre + "gate_proj.weight"] = torch.cat([s[name][:inter] for s in shards], 0)
            out[pre + "up_proj.weight"] = torch.cat([s[name][inter:] for s in shards], 0)
        else:
            out[name] = shards[0][name].clone()
    return out




def _rows(t: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return t.narrow(0, start, count)


__all__ = ["hf_to_vllm", "vllm_to_hf"]
