"""Hugging Face *checkpoint* names of a transformers model's weights: the ``hf`` layout (DESIGN.md).

transformers 5 may keep weights in memory under other names and shapes than its checkpoints (MoE experts fused
into one ``mlp.experts.gate_up_proj`` [E, 2I, D] tensor, while checkpoints and every engine's loader have one
``mlp.experts.{i}.gate_proj.weight`` per expert). A version published from ``model.state_dict()`` would then
say something no engine loads. ``checkpoint_state_dict`` applies transformers' own reverse conversion (the one
``save_pretrained`` applies), so what is published is what a checkpoint of the model holds.
"""

from __future__ import annotations

import torch


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
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype) if t.numel() \
            else (name,)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.contiguous()
    return out


__all__ = ["checkpoint_state_dict"]
