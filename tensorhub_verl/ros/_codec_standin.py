"""Stand-in for the per-chunk codec until its module lands: "same" or the chunk itself. Deleted on merge."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tensorhub_verl.errors import TensorHubError


class DeltaPayloadError(TensorHubError):
    pass


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    encoding: str
    payload: torch.Tensor
    changed: int
    elements: int


def encode_chunk(base: torch.Tensor, target: torch.Tensor, *, dtype: torch.dtype) -> EncodedChunk:
    size = torch.empty(0, dtype=dtype).element_size()
    elements = target.numel() // size
    if torch.equal(base, target):
        return EncodedChunk("same", torch.empty(0, dtype=torch.uint8, device=target.device), 0, elements)
    changed = int((base.view(-1, size) != target.view(-1, size)).any(1).sum()) if size > 1 else \
        int((base != target).sum())
    return EncodedChunk("dense", target.clone(), changed, elements)


def apply_chunk(encoding: str, payload: torch.Tensor, into: torch.Tensor, *, dtype: torch.dtype) -> None:
    if encoding == "same":
        if payload.numel():
            raise DeltaPayloadError("a 'same' chunk carries no payload")
        return
    if encoding != "dense" or payload.numel() != into.numel():
        raise DeltaPayloadError(f"malformed {encoding!r} payload of {payload.numel()} bytes for {into.numel()}")
    into.copy_(payload)
