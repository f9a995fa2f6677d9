"""What changes between two versions of a bf16 model, in a small form, and synthetic versions drawn from it.

``tensorhub bench delta`` trains a small transformer and measures, per delta, the fraction of words changed in
each block of the version and the distribution of each changed word's step in its ordered integer
representation (``delta_codec``'s ``ulp`` steps). A ``DeltaProfile`` keeps those two distributions (a few KB of
JSON); ``delta_sequence`` draws versions of any size from it, so the network lab (``bench modes --delta``) and the
simulator move realistic deltas of large versions without training a large model.

Drawn versions: version 0 is normal(0, ``init_std``) in bf16; each next version changes, in each block of
``block_bytes``, a fraction of the words drawn from the profile's block fractions (positions uniform within the
block), each by a step drawn from the profile's step distribution. What the codec sees is then what it saw on the
measured sequence: the same changed fractions by block and the same step statistics, at the size asked for.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

BLOCK_BYTES = 1 << 20
"""Granularity of the measured changed fractions (and of the drawn ones)."""
_COMMON_STEPS = 32
"""Steps kept with their own probability; rarer ones are kept as a sample."""
_RARE_SAMPLE = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class DeltaProfile:
    """The change between consecutive bf16 versions of one training run, at one learning rate."""

    lr: float
    """The optimizer's learning rate of the measured run."""
    block_fractions: tuple[float, ...]
    """Changed fraction of the words of each ``BLOCK_BYTES`` block, pooled over the measured deltas."""
    steps: tuple[tuple[int, float], ...]
    """(step, probability) of the most common ulp steps of a changed word."""
    rare_steps: tuple[int, ...] = ()
    """A sample of the other steps, drawn uniformly with the probability the common ones leave."""
    bytes_per_changed: float = 0.0
    """Encoded bytes per changed word of the codec's chosen encodings on the measured deltas."""
    changed_fraction: float = 0.0
    """Changed fraction of the whole version, the mean over the measured deltas."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "DeltaProfile":
        return cls(lr=float(d["lr"]), block_fractions=tuple(float(x) for x in d["block_fractions"]),
                   steps=tuple((int(s), float(p)) for s, p in d["steps"]),
                   rare_steps=tuple(int(s) for s in d.get("rare_steps", ())),
                   bytes_per_changed=float(d.get("bytes_per_changed", 0.0)),
                   changed_fraction=float(d.get("changed_fraction", 0.0)))

    @classmethod
    def load(cls, path: str | Path) -> "DeltaProfile":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def measure(cls, lr: float, block_fractions: Sequence[float], steps: np.ndarray, *,
                bytes_per_changed: float = 0.0, changed_fraction: float = 0.0, seed: int = 0) -> "DeltaProfile":
        """A profile from measured block fractions and the signed ulp steps of every changed word."""
        counts = Counter(steps.tolist())
        total = max(sum(counts.values()), 1)
        common = counts.most_common(_COMMON_STEPS)
        kept = {s for s, _ in common}
        rare = np.array([s for s in steps.tolist() if s not in kept], dtype=np.int64)
        if rare.size > _RARE_SAMPLE:
            rare = np.random.default_rng(seed).choice(rare, _RARE_SAMPLE, replace=False)
        return cls(lr=lr, block_fractions=tuple(round(float(f), 6) for f in block_fractions),
                   steps=tuple((int(s), round(c / total, 6)) for s, c in common), rare_steps=tuple(int(s) for s in rare),
                   bytes_per_changed=round(bytes_per_changed, 4), changed_fraction=round(changed_fraction, 6))

    def draw_steps(self, rng: np.random.Generator, count: int) -> np.ndarray:
        values = np.array([s for s, _ in self.steps], dtype=np.int64)
        probs = np.array([p for _, p in self.steps], dtype=np.float64)
        rest = max(0.0, 1.0 - probs.sum())
        if self.rare_steps and rest > 0:
            values = np.concatenate([values, np.array(self.rare_steps, dtype=np.int64)])
            probs = np.concatenate([probs, np.full(len(self.rare_steps), rest / len(self.rare_steps))])
        if not values.size:
            return np.ones(count, dtype=np.int64)
        return rng.choice(values, size=count, p=probs / probs.sum())


def _keys(words: np.ndarray) -> np.ndarray:
    """bf16 words (int16) to their ordered integers and back (an involution), as in ``delta_codec``."""
    return words ^ ((words >> 15) & 0x7FFF)


def delta_sequence(nbytes: int, versions: int, *, profile: DeltaProfile, seed: int = 0,
                   init_std: float = 0.02, block_bytes: int = BLOCK_BYTES) -> Iterator[torch.Tensor]:
    """``versions`` bf16 versions of ``nbytes`` bytes (flat uint8 CPU tensors), each drawn from the previous
    as the profile says (module docstring). Yields a new tensor per version: the caller keeps the ones it needs."""
    if nbytes <= 0 or nbytes % 2 or versions < 1:
        raise ValueError(f"nbytes must be a positive even count and versions >= 1, got {nbytes}, {versions}")
    if not profile.block_fractions:
        raise ValueError("the profile has no block fractions: measure one with `tensorhub bench delta`")
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    current = (torch.randn(nbytes // 2, generator=g) * init_std).to(torch.bfloat16).view(torch.uint8)
    yield current
    fractions = np.array(profile.block_fractions, dtype=np.float64)
    per_block = block_bytes // 2
    for _ in range(versions - 1):
        nxt = current.clone()
        words = nxt.numpy().view(np.int16)
        for start in range(0, words.size, per_block):
            block = words[start:start + per_block]
            f = fractions[rng.integers(fractions.size)]
            where = np.flatnonzero(rng.random(block.size) < f)
            if where.size:
                keys = _keys(block[where]).astype(np.int32) + profile.draw_steps(rng, where.size)
                block[where] = _keys(np.clip(keys, -32768, 32767).astype(np.int16))
        current = nxt
        yield current


PROFILES_FILE = Path(__file__).with_name("delta_profiles.json")
"""The profiles ``tensorhub bench delta`` measured on its default model, by learning rate; re-measured with
``tensorhub bench delta --profile-out tensorhub_verl/bench/delta_profiles.json``."""


def default_profile(lr: float = 1e-6) -> DeltaProfile:
    """The measured profile at ``lr`` (``PROFILES_FILE``: 1e-6 and 1e-5)."""
    profiles = json.loads(PROFILES_FILE.read_text())
    key = f"{lr:g}"
    if key not in profiles:
        raise ValueError(f"no measured profile for lr {lr:g}: one of {sorted(profiles)}")
    return DeltaProfile.from_dict(profiles[key])
