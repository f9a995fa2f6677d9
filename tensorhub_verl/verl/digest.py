"""End-to-end check that every rollout serves exactly what the trainer published, tensor by tensor.

Opt-in (``tensorhub.verify_digests``): the trainer digests each published tensor and each engine rank digests
the weights it serves, read back as HF tensors (``integrity.tensor_digests``, xxh3). It reads every byte
once more on each side, which regression tests and debugging runs can afford.
"""

from __future__ import annotations

from typing import Iterable, Mapping

DIGEST_KEY = "tensorhub/publish_digests"
"""Where the publishing rank's ``{tensor: digest}`` travels back to the updater beside its float metrics."""


def differing(published: Mapping[str, str], served: Mapping[str, str], unused: Iterable[str] = ()) -> list[str]:
    """Tensor names whose served digest differs from the published one, or that only one side has (the
    engine's ``unused`` tensors, e.g. a tied ``lm_head`` that a version carries, are not served and not compared;
    the trainer leaves a tied head out of its versions, so neither side has it)."""
    unused = set(unused)
    names = (set(published) | set(served)) - unused
    return sorted(n for n in names if published.get(n) != served.get(n))


__all__ = ["DIGEST_KEY", "differing"]
