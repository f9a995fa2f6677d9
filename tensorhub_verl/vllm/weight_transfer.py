"""vLLM ``WeightTransferEngine`` backend ``tensorhub``: vLLM's own weight-transfer API, served by ROS.

Enable with ``LLM(..., worker_extension_cls=EXTENSION_QUALNAME, weight_transfer_config={"backend": "tensorhub"})``
(importing the extension registers this backend in each worker process and keeps CPU weights live). Then:

    llm.init_weight_transfer_engine({"init_info": {"hub_url": ..., "model": "policy", "worker": "rollout-0"}})
    llm.start_weight_update()                                  # no-op: nothing changes before apply
    llm.update_weights({"update_info": {"version": 7}})        # pull (from peers or the trainer) + apply
    llm.finish_weight_update()                                 # no-op: the apply already committed

``phase`` splits the update: ``"pull"`` starts the pull in the background and returns (the engine keeps
generating), ``"apply"`` waits for it and applies (the stall), ``"both"`` (default) does both. The same
``EngineHolder`` as the worker extension does the work, so every invariant there holds here: all-or-nothing
per rank, the live parameters are the holder of the served version, the old one is unpublished first.
Across TP ranks vLLM calls every phase on every rank; ``EngineUpdater`` adds the cross-rank abort.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from tensorhub_verl import errors
from tensorhub_verl.settings import STAGING_CHOICES
from tensorhub_verl.vllm import compat
from tensorhub_verl.vllm.engine_holder import holder_for_engine
from tensorhub_verl.vllm.holder import EngineHolder
from tensorhub_verl.vllm.results import ApplyResult, PullStart

logger = logging.getLogger("tensorhub_verl.vllm.weight_transfer")

_api = compat.weight_transfer_api()
if _api is None:  # pragma: no cover - only on vLLM without the weight-transfer API
    raise ImportError(f"vLLM {compat.vllm_version()} has no vllm.distributed.weight_transfer; use the worker "
                      f"extension (tensorhub_verl.vllm.extension) instead")
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

PHASES = ("both", "pull", "apply")


@dataclass
class TensorHubInitInfo(WeightTransferInitInfo):
    """Identity and hub of this engine (passed in, never read from globals)."""

    hub_url: str
    model: str
    worker: str
    location: Any = None
    token: str | None = None
    staging: str = "cpu"
    client_config: dict[str, Any] = field(default_factory=dict)
    fetch_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.hub_url or not self.model or not self.worker:
            raise ValueError("hub_url, model and worker are required")
        if self.staging not in STAGING_CHOICES:
            raise ValueError(f"staging must be one of {STAGING_CHOICES}, got {self.staging!r}")


@dataclass
class TensorHubUpdateInfo(WeightTransferUpdateInfo):
    """Which version to apply, and which phase of the update to run."""

    version: int | str = "latest"
    phase: str = "both"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if not (self.version == "latest" or (isinstance(self.version, int) and not isinstance(self.version, bool))):
            raise ValueError(f"version must be an int or 'latest', got {self.version!r}")


class TensorHubWeightTransferEngine(WeightTransferEngine[TensorHubInitInfo, TensorHubUpdateInfo]):
    init_info_cls = TensorHubInitInfo
    update_info_cls = TensorHubUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.holder: EngineHolder | None = None
        self.last_result: PullStart | ApplyResult | None = None

    def init_transfer_engine(self, init_info: TensorHubInitInfo) -> None:
        """This rank's holder, set up as the worker extension sets it up (``engine_holder.holder_for_engine``):
        LoRA base parameters, the GPU staging check, the engine's TP ranks as one shard group."""
        self.shutdown()
        self.holder = holder_for_engine(self.model, self.vllm_config, self._load_hf, hub_url=init_info.hub_url,
                                        model=init_info.model, worker=init_info.worker, location=init_info.location,
                                        token=init_info.token, staging=init_info.staging,
                                        client_config=init_info.client_config,
                                        fetch_timeout_s=init_info.fetch_timeout_s)

    def _load_hf(self, weights) -> None:
        # vLLM's own loader on the model this engine targets (its layerwise reload re-processes in place)
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        with compat.unloaded_elements_nan():
            initialize_layerwise_reload(self.model)
            self.model.load_weights(weights)
            finalize_layerwise_reload(self.model, self.model_config)

    def _holder(self) -> EngineHolder:
        if self.holder is None:
            raise errors.InvalidRequest("call init_weight_transfer_engine first")
        return self.holder

    def start_weight_update(self) -> None:
        self._holder()

    def finish_weight_update(self) -> None:
        self._holder()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class calls torch.accelerator.synchronize(), which raises on CPU-only hosts (see compat)
        self.receive_weights(self.parse_update_info(update_info))
        compat.sync_device(self._holder().params.values())

    def receive_weights(self, update_info: TensorHubUpdateInfo) -> None:
        holder = self._holder()
        if update_info.phase == "pull":
            self.last_result = holder.begin_pull(update_info.version)
        elif update_info.phase == "apply":
            self.last_result = holder.apply(update_info.timeout_s)
        else:
            # vLLM's pause: the engine generates again while its layout is digested and published
            self.last_result = holder.update(update_info.version, update_info.timeout_s, wait_published=False)

    def shutdown(self) -> None:
        holder, self.holder = self.holder, None
        if holder is not None:
            try:
                holder.close()
            finally:
                holder.client.close()


__all__ = ["TensorHubInitInfo", "TensorHubUpdateInfo", "TensorHubWeightTransferEngine"]
