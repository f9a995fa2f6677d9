"""Step rows of the main job, read from verl's "file" logger (one JSON line per training step)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
"""verl's per-step mean sequence score (the task's reward), in order of preference."""


@dataclass(frozen=True, slots=True)
class StepRow:
    step: int
    version: int
    reward_mean: float
    stall_s: float
    pull_s: float
    bytes: int
    peer_fraction: float
    sources: str
    """Bytes by kind of source, e.g. 'trainer 0.29 MB, peers 0.29 MB'."""

    def as_json(self) -> dict:
        out = asdict(self)
        out.pop("sources")
        return out


def row_of(step: int, data: dict) -> StepRow:
    """One step's row from verl's metrics (TensorHub's keys are absent until the first weight sync)."""
    reward = next((float(data[k]) for k in REWARD_KEYS if k in data), float("nan"))
    trainer = float(data.get("tensorhub/bytes_from_trainer", 0.0))
    peers = float(data.get("tensorhub/bytes_from_peers", 0.0))
    return StepRow(
        step=int(step),
        version=int(data.get("tensorhub/version", -1)),
        reward_mean=reward,
        stall_s=float(data.get("tensorhub/stall_s", 0.0)),
        pull_s=float(data.get("tensorhub/pull_s", 0.0)),
        bytes=int(data.get("tensorhub/bytes", 0)),
        peer_fraction=float(data.get("tensorhub/sources_peer_fraction", 0.0)),
        sources=f"trainer {trainer / 1e6:.2f} MB, peers {peers / 1e6:.2f} MB",
    )


def read_metrics(path: Path, *, final: bool = True) -> list[tuple[int, dict]]:
    """(step, metrics) of every training step (one with a reward), in step order, from the complete lines so
    far (a line being written is skipped).

    Several lines of one step are merged (fully_async logs its rollouter, its trainer and each weight sync
    separately). Unless ``final``, the newest step is left out: more of its lines may still come.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    merged: dict[int, dict] = {}
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        record = json.loads(line)
        merged.setdefault(int(record["step"]), {}).update(record["data"])
    steps = sorted(merged)
    if not final:
        steps = steps[:-1]
    return [(s, merged[s]) for s in steps if any(k in merged[s] for k in REWARD_KEYS)]


def read_steps(path: Path, *, final: bool = True) -> list[StepRow]:
    """Training steps as table rows (see ``read_metrics``)."""
    return [row_of(step, data) for step, data in read_metrics(path, final=final)]


__all__ = ["REWARD_KEYS", "StepRow", "read_metrics", "read_steps", "row_of"]
