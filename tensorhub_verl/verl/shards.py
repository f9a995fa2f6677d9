"""This trainer rank's own shard of every weight, as verl's FSDP2 engine holds it: no gather.

FSDP2 shards dim 0 of each parameter across the ranks of a 1-D mesh with ``torch.chunk`` semantics, so rank
r's local tensor is rows ``row_range(rows, r, ranks)`` of the HF tensor: a contiguous byte range. Each rank
publishes its rows (``Client.publish_shard``) and a reader reads every rank at once. Tensors that are not
sharded (buffers, replicated parameters) are whole on every rank; each rank publishes its rows of them too.

``local_shards`` returns None where this does not hold (FSDP1, a 2-D mesh, LoRA adapters, packed MoE
experts that verl unfuses on export); the caller then publishes verl's gathered tensors from one rank.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from tensorhub_verl.ros.wire.manifest import row_range

logger = logging.getLogger("tensorhub_verl.verl.shards")


@dataclass(slots=True)
class LocalShards:
    rank: int
    ranks: int
    pieces: dict[str, torch.Tensor]
    """HF name -> this rank's rows (views of the live parameters: stage them before the optimizer steps)."""
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]]
    """HF name -> the full tensor's (shape, dtype), in export order."""
    full: dict[str, Any]
    """HF name -> what ``full_tensor()`` gathers (the DTensor, or the plain tensor): for ``verify_digests``."""


def local_shards(engine: Any) -> LocalShards | None:
    """This rank's rows of every weight of verl's FSDP training ``engine``, or None (see the module doc)."""
    from torch.distributed.tensor import DTensor, Shard

    module = getattr(engine, "module", None)
    if module is None:
        return None
    inner = getattr(module, "_fsdp_wrapped_module", module)
    if hasattr(inner, "peft_config"):
        return None  # LoRA: verl merges or ships adapters, not the base shards
    from verl.utils.model import convert_weight_keys

    params = convert_weight_keys(module.state_dict(), inner)
    mesh_rank = mesh_size = None
    for name, p in params.items():
        if isinstance(p, DTensor):
            if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
                logger.info("%s is placed %s on a %d-D mesh: publishing gathered tensors", name, p.placements,
                            p.device_mesh.ndim)
                return None
            mesh_rank, mesh_size = p.device_mesh.get_local_rank(), p.device_mesh.size()
        if ".mlp.experts." in name and p.dim() == 3:
            return None  # verl unfuses packed experts into per-expert HF names on export
    if mesh_rank is None:
        return None  # nothing is sharded
    pieces, specs = {}, {}
    for name, p in params.items():
        specs[name] = (tuple(p.shape), p.dtype)
        local = p.to_local() if isinstance(p, DTensor) else _rows_of(p, mesh_rank, mesh_size)
        if p.dim() > 0 and local.shape[0] != _count(row_range(p.shape[0], mesh_rank, mesh_size)):
            logger.info("%s: local rows %d are not torch.chunk's; publishing gathered tensors", name, local.shape[0])
            return None
        pieces[name] = local.detach()
    return LocalShards(rank=mesh_rank, ranks=mesh_size, pieces=pieces, specs=specs, full=params)


def _rows_of(t: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    if t.dim() == 0:
        return t  # whole on every rank; the core serves rank 0's
    start, stop = row_range(t.shape[0], rank, ranks)
    return t.narrow(0, start, stop - start)


def _count(span: tuple[int, int]) -> int:
    return span[1] - span[0]


__all__ = ["LocalShards", "local_shards"]
