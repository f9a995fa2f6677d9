"""The dtype a version is published in: the rollout's, so that bytes nobody serves never cross a wire.

verl's trainer keeps its parameters in ``actor.fsdp_config.model_dtype`` (fp32 master weights by default) while
vLLM serves ``actor_rollout_ref.rollout.dtype`` (bf16 by default). The trainer casts what it stages to the
rollout dtype; only floating-point tensors are cast (integer buffers stay as they are), as verl's own
checkpoint engines do.
"""

from __future__ import annotations

import torch

from tensorhub_verl.errors import ConfigError

ROLLOUT_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}
"""Names vLLM and verl accept for a rollout dtype. 'auto' (vLLM: the model config's dtype) is not known to the
trainer: it then publishes in its parameters' dtype, and a reader of another dtype is told what to set."""


def rollout_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of ``tensorhub.rollout_dtype`` (None: publish in the parameters' dtype)."""
    if name is None:
        return None
    try:
        return ROLLOUT_DTYPES[str(name).lower()]
    except KeyError:
        raise ConfigError(f"tensorhub.rollout_dtype must be one of {sorted(ROLLOUT_DTYPES)} or null, got {name!r}; "
                          f"the presets set it from actor_rollout_ref.rollout.dtype") from None


def published_dtype(source: torch.dtype, target: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor of ``source`` dtype is published in: ``target`` for floating-point tensors."""
    return target if target is not None and source.is_floating_point else source


__all__ = ["ROLLOUT_DTYPES", "published_dtype", "rollout_dtype"]
