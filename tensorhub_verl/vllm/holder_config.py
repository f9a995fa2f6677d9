"""What an engine shard's holder is configured with, and the error it raises when its parameters are lost."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT
from tensorhub_verl.settings import STAGING_CHOICES
from tensorhub_verl.vllm.buckets import DEFAULT_BUCKET_BYTES

LoadHF = Callable[[Iterable[tuple[str, torch.Tensor]]], None]
"""The engine's own loader: takes (HF name, tensor) pairs and writes them into the parameters."""


class EngineStateLost(errors.TransferFailed):
    """A pull without staging failed midway and the served version could not be restored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderConfig:
    """How one shard pulls and applies versions."""

    model: str
    """The ROS model name, e.g. ``policy``."""
    layout: str
    """This shard's layout, e.g. ``vllm/qwen2/tp1/rank0``."""
    staging: str = "cpu"
    """``cpu``/``gpu``: pull into a staging buffer while the engine generates, stall only for the copy.
    ``none``: pull straight into the parameters inside ``apply`` (no extra memory, longer stall)."""
    fetch_timeout_s: float = 300.0
    """Limit of one pull."""
    unpublish_timeout_s: float = 120.0
    """Limit of the wait for in-flight reads of the old version before its bytes are overwritten."""
    shard_group: str | None = None
    """The engine this shard belongs to (e.g. its base worker id) when it has ``shard_count`` > 1 ranks."""
    shard_count: int = 1
    """The engine's TP ranks: a version in their layouts becomes visible only when all of them hold it."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Most HF bytes read at once when a version goes through the engine's loader (whole decoder layers)."""
    delta: str = "auto"
    """A shard serving N-1 whose 'hf' tensors map in place reads the delta N-1 -> N where one is published,
    applies it into its parameters and checks them against N's digests ('auto', 'on'); 'off': full versions."""

    def __post_init__(self) -> None:
        if self.shard_count < 1 or (self.shard_count > 1) != (self.shard_group is not None):
            raise errors.ConfigError(f"an engine of shard_count {self.shard_count} needs a shard_group exactly "
                                     f"when shard_count > 1 (got {self.shard_group!r})")
        if self.staging not in STAGING_CHOICES:
            raise errors.ConfigError(f"staging must be one of {STAGING_CHOICES}, got {self.staging!r}")
        if self.bucket_bytes <= 0:
            raise errors.ConfigError(f"bucket_bytes must be > 0, got {self.bucket_bytes}")
        if self.fetch_timeout_s <= 0 or self.unpublish_timeout_s <= 0:
            raise errors.ConfigError("fetch_timeout_s and unpublish_timeout_s must be > 0")
        from tensorhub_verl.ros.client.delta import DELTA_MODES

        if self.delta not in DELTA_MODES:
            raise errors.ConfigError(f"delta must be one of {DELTA_MODES}, got {self.delta!r}")
        if self.layout == HF_LAYOUT:
            raise errors.ConfigError("an engine shard's layout cannot be 'hf' (that is the trainer's layout)")


__all__ = ["EngineStateLost", "HolderConfig", "LoadHF"]
