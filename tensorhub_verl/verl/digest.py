"""A digest of a whole weight set, to prove end to end that a rollout holds exactly what the trainer published.

Opt-in (``tensorhub.verify_digests``): it reads every byte once on each side (blake2b, ~1 GB/s per core),
which the regression tests and debugging runs can afford and a production step usually should not.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch

DIGEST_KEY = "tensorhub/publish_digest"
"""Where the publishing rank's digest travels back to the updater beside its float metrics."""


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """blake2b over (name, dtype, shape, bytes) of every tensor, in name order; CUDA tensors are read via CPU."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().cpu().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


__all__ = ["DIGEST_KEY", "weights_digest"]
