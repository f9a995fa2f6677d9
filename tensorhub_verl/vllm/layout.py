"""vLLM's parameter layout for dense decoders (Llama, Qwen2, Qwen3, Mistral): names, shapes, HF -> vLLM mapping.

Pure functions of the HF config and (tp_size, rank); no vLLM import. vLLM arranges a TP rank's parameters as:

    HF (full, per projection)                   vLLM rank r of tp (fused, sharded)
    q_proj [H*d, D]  k_proj [K*d, D]  v_proj    qkv_proj  = cat(q rows of heads r*H/tp.., k rows, v rows)
    gate_proj [I, D] up_proj [I, D]             gate_up_proj = cat(gate rows r*I/tp.., up rows r*I/tp..)
    o_proj [D, H*d]  down_proj [D, I]           columns r*(H*d)/tp.. / r*I/tp..   (row-parallel: input split)
    embed_tokens / lm_head [V, D]               rows r*Vp/tp.. of V zero-padded to Vp (multiple of 64)
    norms                                       replicated

When tp > K (fewer KV heads than ranks), each KV head is replicated on tp/K consecutive ranks: rank r holds KV
head r // (tp/K), as vLLM's QKVParallelLinear does. With tied embeddings (Qwen2 small models) vLLM has no
separate ``lm_head.weight`` parameter.

Qwen3 adds per-head ``q_norm``/``k_norm`` weights [d], replicated. This mapping is a candidate only: an engine
uses it in place only after ``verify.check_views_against_loader`` found it equal to what vLLM's own loader does
(at set-up, on random tensors); any other model, or a mismatch, goes through the engine's loader in buckets.

Invariant (tested against a live vLLM engine at TP=1 and TP=2): ``hf_to_vllm(hf, shape, tp, r)`` equals, byte for byte,
the parameters of rank r of a vLLM engine that loaded ``hf`` through its own ``load_weights``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.hf_names import EMBEDDING, TIED_HEAD

VOCAB_PADDING = 64
"""vLLM pads embedding/lm_head rows to a multiple of this (DEFAULT_VOCAB_PADDING_SIZE)."""
SUPPORTED_ARCHES = ("llama", "qwen2", "qwen3", "mistral")
"""Architectures whose vLLM parameters may follow this layout (checked against vLLM's loader before use)."""
_LAYOUT_RE = re.compile(r"^vllm/(?P<arch>[a-z0-9_]+)/tp(?P<tp>[0-9]+)/rank(?P<rank>[0-9]+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecoderShape:
    """What the layout depends on, read from an HF config."""

    arch: str
    """HF ``model_type`` (``llama``, ``qwen2``)."""
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    """Qwen2 has biases on q/k/v; Llama has none (unless ``attention_bias``)."""
    qk_norm: bool = False
    """Qwen3 normalizes each head's q and k (``self_attn.q_norm.weight``/``k_norm.weight`` [head_dim])."""

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHES:
            raise ConfigError(f"architecture {self.arch!r} has no vLLM layout mapping here; "
                              f"supported: {SUPPORTED_ARCHES} (others load through the engine's loader in buckets)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")

    @classmethod
    def from_hf_config(cls, cfg) -> DecoderShape:
        """From a transformers config object (or anything with the same attributes)."""
        arch = cfg.model_type
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        bias = arch == "qwen2" or bool(getattr(cfg, "attention_bias", False))
        return cls(arch=arch, num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                   vocab_size=cfg.vocab_size, tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                   qkv_bias=bias, qk_norm=arch == "qwen3")

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def layout_name(arch: str, tp_size: int, rank: int) -> str:
    """``vllm/<arch>/tp<k>/rank<r>``: equal names mean byte-compatible shards (raw copies allowed)."""
    if not 0 <= rank < tp_size:
        raise ConfigError(f"rank must be in [0, tp_size), got rank={rank} tp_size={tp_size}")
    return f"vllm/{arch}/tp{tp_size}/rank{rank}"


def parse_layout_name(name: str) -> tuple[str, int, int]:
    """Inverse of ``layout_name``: (arch, tp_size, rank)."""
    m = _LAYOUT_RE.match(name)
    if m is None:
        raise ConfigError(f"not a vLLM layout name: {name!r} (expected vllm/<arch>/tp<k>/rank<r>)")
    return m["arch"], int(m["tp"]), int(m["rank"])


def _check_tp(shape: DecoderShape, tp_size: int, rank: int) -> None:
    layout_name(shape.arch, tp_size, rank)
    problems = []
    if shape.num_heads % tp_size:
        problems.append(f"num_heads={shape.num_heads}")
    if shape.intermediate_size % tp_size:
        problems.append(f"intermediate_size={shape.intermediate_size}")
    if shape.num_kv_heads % tp_size and tp_size % shape.num_kv_heads:
        problems.append(f"num_kv_heads={shape.num_kv_heads}")
    if shape.padded_vocab % tp_size:
        problems.append(f"padded vocab={shape.padded_vocab}")
    if problems:
        raise ConfigError(f"tp_size={tp_size} does not divide {', '.join(problems)}")


def kv_slot(shape: DecoderShape, tp_size: int, rank: int) -> tuple[int, int]:
    """(first KV head, KV heads) that rank holds; replicated when tp_size > num_kv_heads."""
    if tp_size >= shape.num_kv_heads:
        return rank // (tp_size // shape.num_kv_heads), 1
    per = shape.num_kv_heads // tp_size
    return rank * per, per


def vllm_param_shapes(shape: DecoderShape, tp_size: int = 1, rank: int = 0) -> dict[str, tuple[int, ...]]:
    """Names and shapes of rank ``rank``'s parameters, in vLLM's ``named_parameters()`` order."""
    _check_tp(shape, tp_size, rank)
    d, hd = shape.hidden_size, shape.head_dim
    q_rows = shape.num_heads // tp_size * hd
    kv_rows = kv_slot(shape, tp_size, rank)[1] * hd
    inter = shape.intermediate_size // tp_size
    vocab = shape.padded_vocab // tp_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = (q_rows + 2 * kv_rows, d)
        if shape.qkv_bias:
            out[p + "self_attn.qkv_proj.bias"] = (q_rows + 2 * kv_rows,)
        out[p + "self_attn.o_proj.weight"] = (d, q_rows)
        if shape.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "mlp.gate_up_proj.weight"] = (2 * inter, d)
        out[p + "mlp.down_proj.weight"] = (d, inter)
        out[p + "input_layernorm.weight"] = (d,)
        out[p + "post_attention_layernorm.weight"] = (d,)
    out["model.norm.weight"] = (d,)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (vocab, d)
    return out


def _rows(t: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return t.narrow(0, start, count)


@dataclass(frozen=True, slots=True)
class HFViews:
    """Where each HF tensor's bytes for one TP rank live inside that rank's parameters, so an ``hf`` pull can land
    there directly (no staging copy). For these architectures a rank's part of every HF tensor is one slice of it
    (``slices``) landing in a contiguous row range of one vLLM parameter: q/k/v rows in ``qkv_proj``, gate/up
    rows in ``gate_up_proj``, its vocab rows in the padded embedding, the columns of ``o_proj``/``down_proj``
    (row-parallel: a strided column range of the HF tensor) in the whole parameter, norms one to one. At TP=1
    every slice is the whole tensor and ``slices`` is empty."""

    views: dict[str, torch.Tensor]
    """HF name -> a view of the live parameter its (sliced) bytes belong in."""
    unused: tuple[str, ...]
    """HF names the rank has no parameter for (a tied ``lm_head.weight``): not needed at all. A trainer's version
    leaves a tied head out; a version that carries it lands it in scratch (``landing.py``)."""
    padding: tuple[torch.Tensor, ...]
    """Views of the vocab padding rows, which vLLM's loader zeroes and an HF pull never writes."""
    slices: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """HF name -> ``(dim, start, length)``: the rank reads ``full.narrow(dim, start, length)``; absent: whole."""
    full_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """HF name -> the whole HF tensor's shape."""
    tied: dict[str, str] = field(default_factory=dict)
    """Unused HF name -> the HF name whose bytes it repeats (a tied ``lm_head.weight``: the embedding, which the
    engine serves in its place)."""

    def onto(self, params: Mapping[str, torch.Tensor], others: Mapping[str, torch.Tensor]) -> HFViews:
        """The same views over ``others``: tensors shaped and strided as ``params`` (a staging copy of them),
        so that a staged pull lands each HF slice where ``apply`` then copies it from, in the engine's layout."""
        owner = {p.untyped_storage().data_ptr(): (n, p) for n, p in params.items()}

        def moved(view: torch.Tensor) -> torch.Tensor:
            name, p = owner[view.untyped_storage().data_ptr()]
            other = others[name]
            if other.shape != p.shape or other.stride() != p.stride():
                raise ConfigError(f"{name}: the copy is {tuple(other.shape)}/{other.stride()}, the parameter "
                                  f"{tuple(p.shape)}/{p.stride()}; views need the same shape and strides")
            offset = other.storage_offset() + view.storage_offset() - p.storage_offset()
            return other.as_strided(view.shape, view.stride(), offset)

        return HFViews({n: moved(v) for n, v in self.views.items()}, self.unused,
                       tuple(moved(v) for v in self.padding), dict(self.slices), dict(self.full_shapes),
                       dict(self.tied))


def hf_views(params: Mapping[str, torch.Tensor], shape: DecoderShape, tp_size: int = 1, rank: int = 0) -> HFViews:
    """The ``HFViews`` of rank ``rank`` of ``tp_size``'s ``params`` (as ``vllm_param_shapes`` names them).
    The same arithmetic as ``hf_to_vllm``, as views and slices instead of copies."""
    expected = vllm_param_shapes(shape, tp_size, rank)
    live = {n: tuple(t.shape) for n, t in params.items()}
    if live != expected:
        raise ConfigError(f"the parameters do not have this architecture's TP={tp_size} vLLM layout (rank {rank}); "
                          f"cannot map HF views")
    hd = shape.head_dim
    q_rows = shape.num_heads // tp_size * hd
    kv_first, kv_count = kv_slot(shape, tp_size, rank)
    kv_rows = kv_count * hd
    inter = shape.intermediate_size // tp_size
    views: dict[str, torch.Tensor] = {}
    slices: dict[str, tuple[int, int, int]] = {}
    padding: list[torch.Tensor] = []
    full_shapes: dict[str, tuple[int, ...]] = {}

    def put(hf_name: str, view: torch.Tensor, dim: int, start: int, full: int) -> None:
        views[hf_name] = view
        full_shapes[hf_name] = tuple(full if i == dim else n for i, n in enumerate(view.shape))
        if view.shape[dim] != full:
            slices[hf_name] = (dim, start, view.shape[dim])

    for name, p in params.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            per = shape.padded_vocab // tp_size
            start = rank * per
            n = max(0, min(per, shape.vocab_size - start))
            # A rank of padding rows only reads nothing of it (an empty slice).
            put(name, _rows(p, 0, n), 0, start if n else 0, shape.vocab_size)
            if n < per:
                padding.append(_rows(p, n, per - n))
        elif name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            kind = name.rsplit(".", 1)[1]
            pre = name.replace("qkv_proj." + kind, "")
            put(f"{pre}q_proj.{kind}", _rows(p, 0, q_rows), 0, rank * q_rows, shape.num_heads * hd)
            put(f"{pre}k_proj.{kind}", _rows(p, q_rows, kv_rows), 0, kv_first * hd, shape.num_kv_heads * hd)
            put(f"{pre}v_proj.{kind}", _rows(p, q_rows + kv_rows, kv_rows), 0, kv_first * hd,
                shape.num_kv_heads * hd)
        elif name.endswith("gate_up_proj.weight"):
            pre = name.replace("gate_up_proj.weight", "")
            put(pre + "gate_proj.weight", _rows(p, 0, inter), 0, rank * inter, shape.intermediate_size)
            put(pre + "up_proj.weight", _rows(p, inter, inter), 0, rank * inter, shape.intermediate_size)
        elif name.endswith("o_proj.weight"):
            put(name, p, 1, rank * q_rows, shape.num_heads * hd)
        elif name.endswith("down_proj.weight"):
            put(name, p, 1, rank * inter, shape.intermediate_size)
        else:
            views[name] = p
            full_shapes[name] = tuple(p.shape)
    unused = (TIED_HEAD,) if shape.tie_word_embeddings else ()
    tied = {TIED_HEAD: EMBEDDING} if shape.tie_word_embeddings else {}
    return HFViews(views, unused, tuple(padding), slices, full_shapes, tied)


__all__ = [
    "SUPPORTED_ARCHES",
    "VOCAB_PADDING",
    "DecoderShape",
    "HFViews",
    "hf_views",
    "kv_slot",
    "layout_name",
    "parse_layout_name",
    "vllm_param_shapes",
]
