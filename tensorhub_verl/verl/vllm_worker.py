"""The vLLM worker extension of verl's rollout servers when the ``tensorhub`` backend is on.

verl gives every vLLM worker its ``vLLMColocateWorkerExtension`` (LoRA, FP8 and MoE loader patches, logits
masking). This class keeps all of that and adds ``TensorHubWorkerExtension``'s ``th_*`` methods, so each
engine rank's live parameters become the holder of the version it serves: no copy of the model beside them.
verl's servers load it through ``vLLMHttpServer._get_worker_extension_cls`` (patched, see
``patches/verl_0_9_1_engine_holders``); the updater drives it through the servers' ``collective_rpc``.
"""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from tensorhub_verl.vllm.extension import TensorHubWorkerExtension

EXTENSION_QUALNAME = "tensorhub_verl.verl.vllm_worker.TensorHubVerlWorkerExtension"


class TensorHubVerlWorkerExtension(TensorHubWorkerExtension, vLLMColocateWorkerExtension):
    """verl's colocate extension plus the TensorHub holder (``th_*`` names never collide with verl's)."""


__all__ = ["EXTENSION_QUALNAME", "TensorHubVerlWorkerExtension"]
