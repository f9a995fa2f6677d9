"""Hugging Face *checkpoint* names of a transformers model's weights: the ``hf`` layout (DESIGN.md).

transformers 5 may keep weights in memory under other names and shapes than its checkpoints (MoE experts fused
into one ``mlp.experts.gate_up_proj`` [E, 2I, D] tensor, while checkpoints and every engine's loader have one
``mlp.experts.{i}.gate_proj.weight`` per expert). A version published from ``model.state_dict()`` would then
say something no engine loads. ``checkpoint_state_dict`` applies transformers' own reverse conversion (the one
``save_pretrained`` applies), so what is published is what a checkpoint of the model holds.

A model with tied embeddings (``tie_word_embeddings``: Qwen2/2.5 up to 3B, Llama-3.2 1B/3B, Gemma) has one
tensor under two names in memory, ``model.embed_tokens.weight`` and ``lm_head.weight``. A checkpoint, and so a
version, carries it once, under the embedding's name: every engine serves the embedding as the head of such a
model. ``repeated_head`` decides when a version may leave the head out.
"""

from __future__ import annotations

import torch

TIED_HEAD = "lm_head.weight"
"""The output head's checkpoint name: the embedding's bytes again in a model with tied embeddings."""
EMBEDDING = "model.embed_tokens.weight"
"""The input embedding's checkpoint name (decoders whose head a tied model shares with it)."""


def checkpoint_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{checkpoint name: contiguous detached tensor}`` of a transformers model, as ``save_pretrained`` names
    them; a tied weight appears once, under its first name (the embedding), as in a safetensors checkpoint."""
    from transformers.core_model_loading import revert_weight_conversion

    state = {name: t.detach() for name, t in model.state_dict().items()}
    rank = {name: i for i, name in enumerate(state)}  # module order: the embedding before a tied head
    converted = revert_weight_conversion(model, state)
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple] = set()
    for name in sorted(converted, key=lambda n: rank.get(n, len(rank))):
        t = converted[name]
        key = memory_key(t) if t.numel() else (name,)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.contiguous()
    return out


def ties_word_embeddings(config) -> bool:
    """Whether a transformers ``config`` ties the output head to the input embedding (a multimodal config: as its
    text config says)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def memory_key(t: torch.Tensor) -> tuple:
    """Equal for two tensors exactly when they are the same elements of the same memory (one tensor yielded under
    two names)."""
    return t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype


def repeated_head(head: torch.Tensor, embedding: torch.Tensor | None, *, ties: bool, same_memory: bool,
                  compare_bytes: bool) -> bool:
    """Whether a version may leave out ``head`` (``lm_head.weight``) because its readers get the same bytes from
    ``embedding`` (``model.embed_tokens.weight``, as the version carries it: in the published dtype): the model
    ties them (``ties``, its config's ``tie_word_embeddings``) and the two are one tensor (``same_memory``: the
    trainer yielded one tensor under both names) or, with ``compare_bytes``, ``head`` cast to the embedding's
    dtype has exactly its bytes. An untied model, a head of another shape, or a head whose bytes differ (a
    checkpoint whose head is not its embedding) keeps its head. A publisher of row shards passes
    ``compare_bytes=False``: every rank must leave out the same names, and a rank sees only its own rows."""
    if not ties or embedding is None or tuple(head.shape) != tuple(embedding.shape):
        return False
    if same_memory:
        return True
    if not compare_bytes:
        return False
    cast = head.detach().to(device=embedding.device, dtype=embedding.dtype)
    return torch.equal(_bytes(cast), _bytes(embedding))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (not its values: -0.0 is not 0.0, and a NaN equals the same NaN)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


__all__ = ["EMBEDDING", "TIED_HEAD", "checkpoint_state_dict", "memory_key", "repeated_head", "ties_word_embeddings"]
