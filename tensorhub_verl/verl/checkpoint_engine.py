"""verl checkpoint-engine backend ``tensorhub`` (verl 0.9.1 ``CheckpointEngineRegistry``).

Importing this module registers the backend and applies the verl patches (``tensorhub_verl.verl.patches``).
verl imports it on every process that builds a checkpoint engine, either

- through the ``verl.plugins`` entry point (loaded by ``import verl``), or
- through ``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tensorhub_verl.verl.checkpoint_engine``
  (imported by ``CheckpointEngineWorker``, the actor worker and ``CheckpointEngineManager``).

Unlike verl's nccl/nixl engines there is no per-step group: ``prepare``/``init_process_group``/
``finalize`` do nothing, and held versions outlive the step because peers read from them.

- Versions are published in the rollout's dtype (``tensorhub.rollout_dtype``): the trainer casts as it stages.
- Trainer ranks (verl passes ``is_master``): with FSDP2 every rank publishes its own shard of each tensor
  (``shards.py``, ``Client.publish_shard``): no gather, staging ~1/N of the model per rank, and readers read
  all ranks at once. Where shards do not apply, the master publishes verl's gathered tensors and every
  rank consumes the generator, because FSDP's full-tensor gathers are collectives.
- A model with tied embeddings publishes its embedding once: the head (``lm_head.weight``, the same tensor) is
  left out of each version (``Publisher``, ``hf_names.repeated_head``), as a checkpoint leaves it out.
- Rollout side: nothing. The engines' own parameters are the holders (``vllm_worker``), driven by the
  updater through verl's vLLM servers, so verl's per-replica checkpoint-engine workers hold no copy and
  ``receive_weights`` is never called (it refuses, naming why).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator

import torch

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from tensorhub_verl.errors import ConfigError, InvalidRequest
from tensorhub_verl.hf_names import ties_word_embeddings
from tensorhub_verl.verl import BACKEND_NAME
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.dtypes import published_dtype
from tensorhub_verl.verl.hub_actor import ensure_hub, job_credentials
from tensorhub_verl.verl.identity import (
    ACTOR_ROLE,
    ROLLOUT_ROLE,
    WorkerIdentity,
    make_identity,
    ray_boundary_facts,
)
from tensorhub_verl.verl.node_location import this_node, worker_location
from tensorhub_verl.verl.digest import DIGEST_KEY
from tensorhub_verl.verl.lora import LORA_KEY, AdapterPublisher, checkpoint_names, lora_adapter_engine
from tensorhub_verl.verl.publisher import Publisher
from tensorhub_verl.verl.shards import LocalShards, local_shards
from tensorhub_verl.verl.supported import require_supported_verl

logger = logging.getLogger("tensorhub_verl.verl.checkpoint_engine")


@CheckpointEngineRegistry.register(BACKEND_NAME)
class TensorHubCheckpointEngine(CheckpointEngine):
    """Publishes trainer versions to ROS (rollout engines hold their own weights: see ``vllm_worker``).

    Args:
        bucket_size: verl's bucket size; unused (ROS moves chunks of ``tensorhub.chunk_mb``).
        is_master: set by verl on trainer ranks only: True on the rank that publishes.
        job: tag that makes worker ids unique at a shared hub; default: the Ray job id.
        node: the ``node`` location label when neither the Ray node nor the config gives one; default: the Ray
            node's IP. The other labels come from the Ray node this rank runs on (``node_location``).
        **tensorhub: the fields of ``TensorHubVerlConfig`` (verl's ``engine_kwargs['tensorhub']``).
    """

    wire_format = "named_tensors"

    def __init__(self, bucket_size: int = 0, is_master: bool | None = None, *, job: str | None = None,
                 node: str | None = None, **tensorhub: Any) -> None:
        require_supported_verl()  # on another verl the weight-moving patches do not apply: refuse, naming why
        self.config = TensorHubVerlConfig.from_mapping(tensorhub)
        self.is_master = is_master
        self.role = ROLLOUT_ROLE if is_master is None else ACTOR_ROLE
        ray_job, _ = ray_boundary_facts()
        self._job = job or ray_job
        node_labels, node_ip = this_node()
        self._location = worker_location(self.config.location, node_labels, node or node_ip)
        self._client = None
        self._identity: WorkerIdentity | None = None
        self._publisher: Publisher | None = None
        self._last_version = -1
        self._lora_base_version: int | None = None
        """LoRA: the version the base was published as (once), see ``tensorhub_verl.verl.lora``."""
        self._adapters: AdapterPublisher | None = None

    # ------------------------------------------------------------------ verl's per-step group hooks
    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        # The hub plans every read; there is no group to build. verl checks each value's length, so none.
        return {}, {}

    def init_process_group(self, **kwargs) -> None:
        return None

    def finalize(self) -> None:
        # Held versions stay: rollouts that pull later read them from here and from each other.
        return None

    # -------------------------------------------------------------------------------- trainer side
    async def send_weights(self, weights, global_steps: int | None = None) -> dict[str, float]:
        """Publishes version ``global_steps`` and returns metrics.

        ``weights`` is verl's training engine (``patches/verl_0_9_1_trainer_shards``): every rank publishes its
        own FSDP2 shard, no gather. Or it is verl's per-tensor generator of gathered tensors (the fallback, see
        ``shards.local_shards``): the master rank publishes them."""
        version = self._version(global_steps)
        tied = False
        if hasattr(weights, "get_per_tensor_param"):
            tied = _ties_word_embeddings(weights)
            if lora_adapter_engine(weights):
                return await self._send_lora(weights, version, tied)
            # A hub of regions takes whole tensors (``RegionalClient.publish_shard``): gathered, from the master.
            shards = None if self.config.uses_regions() else local_shards(weights)
            if shards is not None:
                return await self._send_shards(shards, version, tied)
            weights, _ = weights.get_per_tensor_param()
        return await self._send_gathered(weights, version, tied)

    async def _send_gathered(self, weights, version: int, tied: bool = False) -> dict:
        """verl's generator of gathered tensors: every rank drives it, the master publishes them. ``tied``: the
        model's config ties its head to its embedding (a plain generator, with no engine: unknown, False)."""
        if not self.is_master:
            async for _ in ensure_async_iterator(weights):
                pass  # FSDP's full_tensor() gathers are collectives: every rank must drive the generator
            return {}
        publisher = await asyncio.to_thread(self._ensure_publisher)
        if version in publisher.held_versions:
            logger.info("version %d of %r is already published; consuming the generator only", version,
                        self.config.model)
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        await asyncio.to_thread(publisher.begin, version, tie_word_embeddings=tied)
        try:
            async for name, tensor in ensure_async_iterator(weights):
                publisher.add(name, tensor)
        except BaseException:
            publisher.abort()
            raise
        stats = await asyncio.to_thread(publisher.finish)
        return stats.as_metrics()

    async def _send_lora(self, engine, version: int, tied: bool) -> dict:
        """LoRA (``tensorhub_verl.verl.lora``): the base once, as the first version; then the adapter only."""
        metrics: dict = {}
        if self._lora_base_version is None:
            base, _ = engine.get_per_tensor_param(base_sync_done=False)
            metrics = await self._send_gathered(checkpoint_names(base), version, tied)
            self._lora_base_version = version
        # Its gathers (full_tensor) are collectives: every rank asks, the master publishes.
        adapter, peft_config = engine.get_per_tensor_param(base_sync_done=True)
        if not self.is_master:
            return {}
        if self._adapters is None:
            await asyncio.to_thread(self._ensure_publisher)  # connects this rank (self._client)
            self._adapters = AdapterPublisher(self._client, model=self.config.model, keep=self.config.keep_versions,
                                              unpublish_timeout_s=self.config.unpublish_timeout_s,
                                              chunk_bytes=self.config.chunk_bytes)
        if version not in self._adapters.held_versions:
            adapter_metrics = await asyncio.to_thread(self._adapters.publish, version, adapter, peft_config,
                                                      self._lora_base_version)
            for key, value in adapter_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        metrics.pop(DIGEST_KEY, None)  # digests of the base say nothing about the adapter the engines serve
        metrics[LORA_KEY] = {"base_version": self._lora_base_version}
        return metrics

    async def _send_shards(self, shards: LocalShards, version: int, tied: bool) -> dict:
        """This rank's rows of every tensor, staged (the optimizer changes the live shard next step) and
        published as one of ``shards.ranks`` row shards of the version."""
        if self.config.staging == "none":
            raise ConfigError("tensorhub.staging='none' with FSDP shards would publish the live parameters, which "
                              "the next optimizer step changes under readers; use tensorhub.staging=cpu or gpu")
        publisher = await asyncio.to_thread(self._ensure_publisher, shards.rank, shards.ranks)
        # With one rank the publisher digests what it stages; with several, the full tensors need a gather,
        # a collective that every rank joins (even one that already holds this version).
        gather = self.config.verify_digests and shards.ranks > 1
        digests = _full_tensor_digests(shards, publisher.dtype) if gather else None
        if version in publisher.held_versions:
            return {}
        # The version's tensors as published: the full shapes, in the rollout's dtype (each piece is cast too).
        specs = {name: (shape, published_dtype(dtype, publisher.dtype))
                 for name, (shape, dtype) in shards.specs.items()}
        await asyncio.to_thread(publisher.begin, version, tie_word_embeddings=tied)
        try:
            for name, piece in shards.pieces.items():
                publisher.add(name, piece)
            stats = await asyncio.to_thread(publisher.finish, specs)
        except BaseException:
            publisher.abort()
            raise
        if gather:
            # Rank 0's digests (None elsewhere), of what the version carries.
            stats.digests = None if digests is None else \
                {name: d for name, d in digests.items() if name not in stats.left_out}
        return stats.as_metrics()

    # -------------------------------------------------------------------------------- rollout side
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator:
        raise ConfigError("the tensorhub backend updates rollout engines in place through TensorHubUpdater "
                          "(CheckpointEngineManager.update_weights, patched when tensorhub_verl.verl.checkpoint_engine "
                          "is imported); verl's receive_weights path would need a copy of the model. Import the "
                          "backend module (checkpoint_engine.custom_backend_module) in the driver.")
        yield  # pragma: no cover - makes this an async generator, as verl expects

    def held_versions(self) -> list[int]:
        """Versions this trainer rank holds (for tests)."""
        return self._publisher.held_versions if self._publisher is not None else []

    def close(self) -> None:
        """Unpublishes everything held here (waiting for in-flight reads) and disconnects."""
        if self._client is not None:
            self._client.close()  # drains every holding; no CPU preservation at shutdown
        self._client = self._publisher = self._adapters = None

    # ------------------------------------------------------------------------------------ helpers
    def _version(self, global_steps: int | None) -> int:
        if global_steps is None:
            version = self._last_version + 1
        elif isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 0:
            raise InvalidRequest(f"global_steps must be a non-negative int or None, got {global_steps!r}")
        else:
            version = global_steps
        self._last_version = max(self._last_version, version)
        return version

    def _connect(self, identity: WorkerIdentity):
        if self._client is not None and self._identity == identity:
            return self._client
        if self._client is not None:
            logger.info("identity changed from %s to %s: reconnecting", self._identity.worker, identity.worker)
            self.close()
        import tensorhub_verl as th

        url = ensure_hub(self.config)
        token, job_key = job_credentials(self.config)
        # The trainer unpublishes its oldest version to reuse that buffer just before publishing the next
        # one; preserving it to CPU then would copy a whole model per step for a version that leaves the
        # retention window a moment later. Rollouts keep the core's default.
        preserve = identity.role != ACTOR_ROLE
        self._client = th.connect(url, worker=identity.worker, location=identity.location, token=token, job_key=job_key,
                                  **self.config.client_settings(), fetch_timeout_s=self.config.fetch_timeout_s,
                                  unpublish_timeout_s=self.config.unpublish_timeout_s,
                                  preserve_on_unpublish=preserve)
        self._identity = identity
        logger.info("%s connected to hub %s at %s", identity.worker, url, identity.location)
        return self._client

    def _ensure_publisher(self, rank: int = 0, ranks: int = 1) -> Publisher:
        """The publisher of trainer rank ``rank`` (of ``ranks`` row shards; 1: whole tensors from one rank)."""
        if self._publisher is None:
            identity = make_identity(role=ACTOR_ROLE, rank=rank, job=self._job, location=self._location)
            client = self._connect(identity)
            self._publisher = Publisher(client, model=self.config.model, keep=self.config.keep_versions,
                                        staging=self.config.staging, chunk_bytes=self.config.chunk_bytes,
                                        unpublish_timeout_s=self.config.unpublish_timeout_s,
                                        verify_digests=self.config.verify_digests and ranks == 1,
                                        shard=(rank, ranks) if ranks > 1 else None,
                                        dtype=self.config.published_dtype,
                                        # A hub of regions serves no deltas (its readers read in full).
                                        delta="off" if self.config.uses_regions() else self.config.delta)
        return self._publisher


def _ties_word_embeddings(engine: Any) -> bool:
    """Whether verl's training ``engine``'s model config ties the head to the embedding (its ``model_config``'s
    HF config, else its module's own config; False when it has neither)."""
    config = getattr(getattr(engine, "model_config", None), "hf_config", None)
    if config is None:
        module = getattr(engine, "module", None)
        config = getattr(getattr(module, "_fsdp_wrapped_module", module), "config", None)
    return config is not None and ties_word_embeddings(config)


def _full_tensor_digests(shards: LocalShards, dtype: torch.dtype | None) -> dict[str, str] | None:
    """``verify_digests`` with shards: every rank joins each tensor's gather; rank 0 digests the full tensors,
    cast to the published ``dtype`` as the rollouts serve them."""
    from tensorhub_verl.ros.wire.integrity import tensor_digests

    digests = {}
    for name, value in shards.full.items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        if shards.rank == 0:
            digests.update(tensor_digests({name: full.to(published_dtype(full.dtype, dtype))}))
    return digests if shards.rank == 0 else None


def _apply_patches() -> None:
    from tensorhub_verl.verl.patches import apply_all

    apply_all()


_apply_patches()

__all__ = ["TensorHubCheckpointEngine"]
