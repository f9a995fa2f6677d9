"""Tiny random Hugging Face models for tests and benchmarks, built offline in seconds.

Nothing is downloaded: the config is written here, the weights are random (seeded), and the tokenizer is a
small byte-level BPE trained on a few lines. Everything is float32 safetensors, which is what vLLM's CPU
build runs exactly (bf16 dies in CPU attention).

Invariants:
- ``build_tiny_model(dir, arch, seed=s)`` is deterministic for a given (arch, sizes, seed).
- ``toy_training_step`` changes every parameter (one Adam step), so greedy outputs move between versions.
- ``hf_greedy`` is a plain argmax loop over full forward passes (no KV cache, no generation config), the
  reference that vLLM's greedy decoding must reproduce token for token.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("tensorhub_verl.bench.tiny_model")

TRAINING_LINES = (
    "the quick brown fox jumps over the lazy dog",
    "weights flow from the trainer to every rollout engine",
    "a holder keeps its bytes unchanged until unpublish returns",
    "readers become sources as their chunks land",
    "reference oriented storage keeps no copy of a version",
    "policy gradient steps change the model a little each time",
    "vllm serves the newest version it has applied in full",
    "0123456789 + - * / = ( ) [ ] { } , . ; : ! ?",
)

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "qwen3_moe", "mixtral")
"""What each exercises: llama (untied head), qwen2 (tied, qkv bias), qwen3 (q/k norms), mistral (llama-shaped,
another model class), gemma2 (tied, extra norms, soft-capping), phi3 (q/k/v and gate/up fused in HF),
qwen3_moe and mixtral (experts: fused in transformers' memory, one tensor per expert in checkpoints)."""
MOE_EXPERTS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyModelSpec:
    """Sizes of a tiny decoder. Defaults give a ~0.1 MB model; the benchmark raises them."""

    arch: str = "llama"
    """One of ``ARCHITECTURES``."""
    hidden_size: int = 128
    """head_dim = hidden_size / num_heads must be one vLLM's CPU attention supports (32, 64, ...; not 16)."""
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    """Fewer KV heads than heads exercises GQA, and KV-head replication at TP=4."""
    vocab_size: int = 0
    """0: use the trained tokenizer's size."""
    bpe_vocab: int = 320
    """Target size of the byte-level BPE (256 byte tokens plus merges)."""
    init_std: float = 0.2
    """Large enough that greedy argmax margins dwarf float32 rounding differences between HF and vLLM."""
    seed: int = 0

    def __post_init__(self) -> None:
        from tensorhub_verl.errors import ConfigError

        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")


def build_tokenizer(out_dir: str | Path, vocab_size: int = 320):
    """Trains a byte-level BPE on TRAINING_LINES and saves it as a fast HF tokenizer in ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(TRAINING_LINES) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(out_dir))
    return fast


def make_config(spec: TinyModelSpec, vocab_size: int, eos_id: int):
    """The transformers config object for ``spec`` (float32, eager attention)."""
    import transformers

    common = dict(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                  num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                  num_key_value_heads=spec.num_kv_heads, vocab_size=vocab_size, max_position_embeddings=512,
                  initializer_range=spec.init_std, rms_norm_eps=1e-6, bos_token_id=eos_id, eos_token_id=eos_id,
                  pad_token_id=eos_id, torch_dtype="float32", rope_theta=10000.0)
    head_dim = spec.hidden_size // spec.num_heads
    moe = dict(num_experts_per_tok=2, moe_intermediate_size=spec.intermediate_size // 4)
    arch = spec.arch
    if arch == "llama":
        return transformers.LlamaConfig(tie_word_embeddings=False, **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(tie_word_embeddings=False, head_dim=head_dim,
                                        use_sliding_window=False, **common)
    if arch == "mistral":
        return transformers.MistralConfig(tie_word_embeddings=False, head_dim=head_dim, sliding_window=None,
                                          **common)
    if arch == "gemma2":
        return transformers.Gemma2Config(tie_word_embeddings=True, head_dim=head_dim,
                                         query_pre_attn_scalar=head_dim, sliding_window=4096,
                                         final_logit_softcapping=None, **common)
    if arch == "phi3":
        return transformers.Phi3Config(tie_word_embeddings=False, **common)
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(tie_word_embeddings=False, head_dim=head_dim,
                                           num_experts=MOE_EXPERTS, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                                           use_sliding_window=False, **moe, **common)
    if arch == "mixtral":
        common["intermediate_size"] = moe["moe_intermediate_size"]
        return transformers.MixtralConfig(tie_word_embeddings=False, head_dim=head_dim,
                                          num_local_experts=MOE_EXPERTS, num_experts_per_tok=2,
                                          sliding_window=None, **common)
    raise ValueError(f"no tiny config for {arch!r}")  # unreachable: TinyModelSpec checks arch


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None, **spec_kw) -> Path:
    """Writes config.json, model.safetensors and the tokenizer into ``out_dir``; returns the directory."""
    from transformers import AutoModelForCausalLM

    spec = spec or TinyModelSpec(**spec_kw)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, spec.bpe_vocab)
    vocab = spec.vocab_size or len(tok)
    config = make_config(spec, vocab, tok.eos_token_id)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, spec.init_std)
        if spec.arch == "gemma2":
            # Gemma scales its (tied) embedding by sqrt(hidden): at full size the input token's own embedding
            # would dominate the residual and the tied head would repeat it forever. Undo the scale.
            model.get_input_embeddings().weight.div_(spec.hidden_size ** 0.5)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "tensorhub_tiny.json").write_text(json.dumps({"arch": spec.arch, "seed": spec.seed}))
    logger.info("built tiny %s model in %s (%d params)", spec.arch, out, sum(p.numel() for p in model.parameters()))
    return out


def float32_bytes(model_dir: str | Path) -> int:
    """Bytes of a checkpoint's tensors in float32 (what a version of it is in vLLM's CPU build)."""
    import math

    from safetensors import safe_open

    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) * 4 for name in f.keys())
    return total


def load_hf_model(model_dir: str | Path):
    """Loads the model in float32 eval mode with eager attention (the exact reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights under checkpoint names and shapes (``hf_names.checkpoint_state_dict``: what
    ``save_pretrained`` writes, e.g. one tensor per MoE expert), contiguous, tied weights once."""
    from tensorhub_verl.hf_names import checkpoint_state_dict

    return checkpoint_state_dict(model)


def toy_training_step(model, tokenizer, step: int, lr: float = 0.05) -> None:
    """One Adam-free SGD step (sign of the gradient, so every parameter moves by ``lr``-ish) on one line.

    Deterministic in ``step``. Stands in for "step k of a training run": the result is a real new version
    whose greedy outputs differ from the previous one.
    """
    model.train()
    line = TRAINING_LINES[step % len(TRAINING_LINES)]
    ids = torch.tensor([tokenizer.encode(line)])
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad.sign())
    model.zero_grad(set_to_none=True)
    model.eval()


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by argmax over full forward passes (the exact reference)."""
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        ids.append(nxt)
    return out


@torch.no_grad()
def greedy_mismatch(model, prompt_ids: list[int], tokens: list[int], near_tie: float = 1e-3) -> int | None:
    """The first position where ``tokens`` (an engine's greedy continuation of ``prompt_ids``) is not ``model``'s
    greedy choice given the same prefix, or None. A token whose logit is within ``near_tie`` of the best one is a
    float rounding tie, not a mismatch. Each position is scored on the engine's own prefix, so one tie does not
    end the comparison."""
    logits = model(input_ids=torch.tensor([list(prompt_ids) + list(tokens)])).logits[0]
    for i, tok in enumerate(tokens):
        row = logits[len(prompt_ids) - 1 + i]
        best = int(torch.argmax(row))
        if best != tok and float(row[best] - row[tok]) > near_tie:
            return i
    return None


__all__ = ["ARCHITECTURES", "float32_bytes", "greedy_mismatch", "TRAINING_LINES", "TinyModelSpec", "build_tiny_model", "build_tokenizer",
           "hf_greedy", "hf_state_dict", "load_hf_model", "make_config", "random_hf_weights", "toy_training_step"]


def random_hf_weights(shape, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF state dict of a ``layout.DecoderShape`` (the names and shapes ``layout.py`` maps), float32."""
    g = torch.Generator().manual_seed(seed)
    d, hd = shape.hidden_size, shape.head_dim
    out = {"model.embed_tokens.weight": torch.randn(shape.vocab_size, d, generator=g)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        rows = {"q": shape.num_heads * hd, "k": shape.num_kv_heads * hd, "v": shape.num_kv_heads * hd}
        for x, n in rows.items():
            out[p + f"self_attn.{x}_proj.weight"] = torch.randn(n, d, generator=g)
            if shape.qkv_bias:
                out[p + f"self_attn.{x}_proj.bias"] = torch.randn(n, generator=g)
        out[p + "self_attn.o_proj.weight"] = torch.randn(d, shape.num_heads * hd, generator=g)
        if shape.qk_norm:
            out[p + "self_attn.q_norm.weight"] = torch.randn(hd, generator=g)
            out[p + "self_attn.k_norm.weight"] = torch.randn(hd, generator=g)
        out[p + "mlp.gate_proj.weight"] = torch.randn(shape.intermediate_size, d, generator=g)
        out[p + "mlp.up_proj.weight"] = torch.randn(shape.intermediate_size, d, generator=g)
        out[p + "mlp.down_proj.weight"] = torch.randn(d, shape.intermediate_size, generator=g)
        out[p + "input_layernorm.weight"] = torch.randn(d, generator=g)
        out[p + "post_attention_layernorm.weight"] = torch.randn(d, generator=g)
    out["model.norm.weight"] = torch.randn(d, generator=g)
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = torch.randn(shape.vocab_size, d, generator=g)
    return out
