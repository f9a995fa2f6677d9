"""The one set-up of an engine rank's holder, shared by the worker extension (``extension.build_holder``) and
vLLM's weight-transfer backend (``weight_transfer``): whichever API drives the engine, a rank's holder is the same.

For one TP rank of an engine: its live parameters named as without LoRA (``lora.base_parameters``: one layout
whatever the engine's LoRA), GPU staging checked against what vLLM's ``gpu_memory_utilization`` leaves free
(``memory.check_engine_gpu_staging``), the rank's layout and in-place mapping (``mapping.engine_mapping``), a
client of its own (worker ``<worker>`` at TP=1, ``<worker>/rank<r>`` otherwise), and the engine's ranks as one
shard group named by the engine's worker id, so that a version in their layouts is visible only once every rank
holds it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from tensorhub_verl import errors
from tensorhub_verl.vllm import compat
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.lora import base_parameters
from tensorhub_verl.vllm.mapping import EngineMapping, engine_mapping

logger = logging.getLogger("tensorhub_verl.vllm.engine_holder")


def rank_worker_id(worker: str, rank: int, tp_size: int) -> str:
    return worker if tp_size == 1 else f"{worker}/rank{rank}"


def on_gpu(params: dict[str, torch.Tensor]) -> bool:
    """Whether the engine's parameters live on a CUDA device (its staging ``gpu`` then takes GPU memory)."""
    return bool(params) and next(iter(params.values())).is_cuda


def holder_for_engine(module: torch.nn.Module, vllm_config: Any, load_hf: Callable, *, hub_url: str, model: str,
                      worker: str, location: Any = None, token: str | None = None, staging: str = "cpu",
                      client_config: dict | None = None, fetch_timeout_s: float = 300.0,
                      bucket_bytes: int | None = None, delta: str = "auto") -> EngineHolder:
    """Connects this rank (of vLLM's initialized parallel state) to the hub and wraps ``module``'s live parameters
    in an ``EngineHolder``. ``vllm_config``: the engine's (its model and cache configs); ``load_hf``: vLLM's own
    loader of HF-named tensors into ``module``; ``delta``: ``HolderConfig.delta``."""
    import tensorhub_verl as th

    rank, tp = compat.tp_rank_and_size()
    unsupported = compat.prepare_reload(module)
    if unsupported is not None:
        raise errors.ConfigError(unsupported)
    # With LoRA enabled the base weights are named as without it: one layout, whatever the engine's LoRA.
    params = base_parameters(compat.live_parameters(module))
    if staging == "gpu" and on_gpu(params):
        from tensorhub_verl.vllm.memory import check_engine_gpu_staging

        check_engine_gpu_staging(params, vllm_config.cache_config.gpu_memory_utilization)
    model_config = vllm_config.model_config
    # Where the in-place mapping checks out against vLLM's loader, an 'hf' pull lands straight in the
    # parameters (staging 'none': no copy) and at TP>1 each rank reads only its slices; elsewhere versions go
    # through the engine's loader in bounded buckets.
    mapping: EngineMapping = engine_mapping(model_config.hf_config, tp, rank, params,
                                            quantization=model_config.quantization, load_hf=load_hf)
    logger.info("rank %d of %d: layout %s, %s", rank, tp, mapping.layout, mapping.reason)
    # Engines take the client's defaults, the UCX pump included: NIXL's own progress thread ("thread") kept
    # engine processes from exiting on vLLM's CPU build (a worker spinning after shutdown).
    cfg = th.ClientConfig.from_fields(**(client_config or {}))
    client = th.connect(hub_url, worker=rank_worker_id(worker, rank, tp), location=location, token=token,
                        config=cfg)
    try:
        extra = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        config = HolderConfig(model=model, layout=mapping.layout, staging=staging, fetch_timeout_s=fetch_timeout_s,
                              shard_group=worker if tp > 1 else None, shard_count=tp, delta=delta, **extra)
        return EngineHolder(client, config, params, load_hf, hf_views=mapping.views, skip_hf=mapping.skip_hf)
    except BaseException:
        client.close()
        raise
