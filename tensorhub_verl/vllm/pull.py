"""One pull of a version by an engine shard: its state and what it staged (``EngineHolder`` owns the one
running pull; the pull thread fills it in under the holder's lock)."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field

import torch


class PullState(str, enum.Enum):
    IDLE = "idle"
    PULLING = "pulling"
    READY = "ready"
    FAILED = "failed"


@dataclass(slots=True)
class Pull:
    version: int
    source_layout: str
    thread: threading.Thread | None = None
    state: PullState = PullState.PULLING
    error: BaseException | None = None
    stats: object | None = None
    buffers: dict[str, torch.Tensor] | None = None
    held: bool = False
    """The staging copy is published as a holder of ``version`` (released after ``apply`` or on abort)."""
    in_engine_layout: bool = False
    """The buffers are in the engine's layout although the source was 'hf' (a TP rank's slices, staged)."""
    bucketed: bool = False
    """The version goes through the engine's loader in buckets inside ``apply`` (no mapping of 'hf')."""
    have: int | None = None
    """The served version, when ``version`` lands as the delta from it (inside ``apply``)."""
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    def finish(self, state: PullState) -> None:
        """Ends the pull in ``state`` (READY or FAILED), recording how long it took."""
        self.seconds = time.monotonic() - self.started
        self.state = state


__all__ = ["Pull", "PullState"]
