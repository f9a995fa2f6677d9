"""verl with ``actor_rollout_ref.model.lora_rank > 0``: the trainer publishes the base once, then only adapters.

verl 0.9.1 hands checkpoint-engine backends ``get_per_tensor_param()`` with its defaults, which for a peft model
are the base weights without the adapter (``collect_lora_params(base_sync_done=False)``): every step would move
the whole base and no rollout would ever see what LoRA learned. With the ``tensorhub`` backend instead:

- the first version: every trainer rank drives ``get_per_tensor_param(base_sync_done=False)`` (its gathers are
  collectives) and the master publishes the base as that version of ``<model>`` (``hf``), held from then on;
- every version: ``get_per_tensor_param(base_sync_done=True)`` gives the adapter in peft's names and its
  ``LoraConfig``; the master publishes it as ``<model>.lora`` (``tensorhub_verl.vllm.lora``), megabytes, naming
  the base version it applies to (engines refuse it on any other base);
- the updater brings each replica's base to the base version once (the usual path, peers included) and then
  applies each adapter version inside a short pause as verl's adapter id ``VLLM_LORA_INT_ID``, which verl's vLLM
  servers then put on every request (``lora_as_adapter``).

With ``model.lora.merge=True`` verl merges the adapter into full weights; that path publishes full versions.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tensorhub_verl.vllm.lora import ADAPTER_LAYOUT, BASE_LAYER, adapter_bytes, adapter_model, pack_adapter
from tensorhub_verl.vllm.results import AdapterUpdate, UpdateResult, add_sources

logger = logging.getLogger("tensorhub_verl.verl.lora")

LORA_KEY = "tensorhub/lora"
"""Where the publishing rank tells the updater the base version beside its float metrics (taken out before
verl sees them)."""


def lora_adapter_engine(engine: Any) -> bool:
    """True when verl's training ``engine`` trains a peft LoRA adapter that rollouts should apply as an adapter
    (not merged: ``model.lora.merge`` false)."""
    module = getattr(engine, "module", None)
    inner = getattr(module, "_fsdp_wrapped_module", module)
    if module is None or not hasattr(inner, "peft_config"):
        return False
    lora = getattr(getattr(engine, "model_config", None), "lora", None) or {}
    return not bool(lora.get("merge", False))


def checkpoint_names(named_tensors):
    """verl's base weights of a peft model under HF checkpoint names: verl names the LoRA-wrapped layers
    ``x.base_layer.weight`` (``replace_lora_wrapper``, for vLLM's wrapped modules); the ``hf`` layout is the
    checkpoint's ``x.weight``, whatever the engines' LoRA."""
    for name, tensor in named_tensors:
        yield name.replace(BASE_LAYER, "."), tensor


class AdapterPublisher:
    """Publishes adapter versions of ``model`` through ``client`` and holds the newest ``keep`` of them.

    Each version is a private copy (the trainer's LoRA parameters change at the next optimizer step)."""

    def __init__(self, client, *, model: str, keep: int, unpublish_timeout_s: float, chunk_bytes: int | None = None
                 ) -> None:
        self._client = client
        self.model = adapter_model(model)
        self._keep = max(1, keep)
        self._unpublish_timeout_s = unpublish_timeout_s
        self._chunk_bytes = chunk_bytes
        self._held: dict[int, dict] = {}

    @property
    def held_versions(self) -> list[int]:
        return sorted(self._held)

    def publish(self, version: int, tensors: Any, peft_config: Any, base_version: int) -> dict[str, float]:
        """Publishes adapter ``version``, trained on version ``base_version`` of the base model."""
        started = time.monotonic()
        packed = pack_adapter({n: t.detach().to("cpu", copy=True).contiguous() for n, t in dict(tensors).items()},
                              peft_config, base_version=base_version)
        staged = time.monotonic()
        while len(self._held) >= self._keep:
            oldest = min(self._held)
            self._client.unpublish(self.model, oldest, layout=ADAPTER_LAYOUT, timeout=self._unpublish_timeout_s)
            del self._held[oldest]
        self._client.publish(self.model, version, packed, layout=ADAPTER_LAYOUT, chunk_bytes=self._chunk_bytes)
        self._held[version] = packed
        size = adapter_bytes(packed)
        logger.info("published %s v%d: %d tensors, %d bytes", self.model, version, len(packed), size)
        return {"tensorhub/publish_bytes": float(size), "tensorhub/adapter_bytes": float(size),
                "tensorhub/publish_stage_s": staged - started, "tensorhub/publish_s": time.monotonic() - staged}




def adapter_update_result(version: int, answers: list, base: UpdateResult | None = None) -> UpdateResult:
    """One replica's update to adapter ``version`` from its ranks' ``th_lora_update`` answers, plus the base
    update that preceded it in the same step (its bytes and sources count too: they moved for this version)."""
    ranks = [AdapterUpdate.from_wire(a) for a in answers]
    result = UpdateResult(version=version, applied=any(r.applied for r in ranks),
                          pull_s=max((r.seconds for r in ranks), default=0.0),
                          bytes=sum(r.bytes for r in ranks), rank_bytes=[r.bytes for r in ranks],
                          source_layouts=[ADAPTER_LAYOUT] * len(ranks))
    for r in ranks:
        add_sources(result.sources, r.sources)
    if base is not None:
        result.bytes += base.bytes
        result.rank_bytes = [a + b for a, b in zip(result.rank_bytes, base.rank_bytes)]
        result.pull_s = max(result.pull_s, base.pull_s)
        result.source_layouts = base.source_layouts + result.source_layouts
        add_sources(result.sources, base.sources)
    return result


__all__ = ["LORA_KEY", "AdapterPublisher", "adapter_update_result", "checkpoint_names", "lora_adapter_engine"]
