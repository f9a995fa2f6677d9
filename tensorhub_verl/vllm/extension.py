"""vLLM worker extension: makes each TP rank's live parameters a ROS holder and applies new versions.

Use: ``LLM(..., worker_extension_cls=EXTENSION_QUALNAME)`` then drive it with ``updater.EngineUpdater``
(every method is reached through ``collective_rpc`` and runs inside the worker process, on every rank).

Importing this module prepares the process (``compat.prepare_worker_process``: CPU linear weights stay live)
and registers the ``tensorhub`` weight-transfer backend. vLLM imports it in each worker process before the
model loads, which is the only per-engine hook that early.

Identity is passed in (``th_setup``'s worker id and location), never read from globals; the TP rank comes from
the engine itself. A rank's worker id is ``<worker>`` at TP=1 and ``<worker>/rank<r>`` otherwise.
Every method takes and returns plain JSON-like values (they cross vLLM's msgpack RPC).
"""

from __future__ import annotations

import logging
from typing import Any

from tensorhub_verl import errors
from tensorhub_verl.vllm import compat
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.layout import SUPPORTED_ARCHES, DecoderShape, hf_views, layout_name, vllm_param_shapes
from tensorhub_verl.vllm.lora import AdapterHolder, base_parameters, load_adapter_into_vllm

logger = logging.getLogger("tensorhub_verl.vllm.extension")

EXTENSION_QUALNAME = "tensorhub_verl.vllm.extension.TensorHubWorkerExtension"

compat.prepare_worker_process()
compat.register_weight_transfer_backend("tensorhub", "tensorhub_verl.vllm.weight_transfer",
                                        "TensorHubWeightTransferEngine")


def rank_worker_id(worker: str, rank: int, tp_size: int) -> str:
    return worker if tp_size == 1 else f"{worker}/rank{rank}"


def engine_layout(hf_cfg, tp_size: int, rank: int, params: dict) -> str:
    """This rank's layout name; for architectures ``layout.py`` knows, checks the live shapes against it."""
    arch = hf_cfg.model_type
    if arch in SUPPORTED_ARCHES:
        expected = vllm_param_shapes(DecoderShape.from_hf_config(hf_cfg), tp_size, rank)
        live = {n: tuple(t.shape) for n, t in params.items()}
        if live != expected:
            diff = sorted(set(live.items()) ^ set(expected.items()))[:4]
            raise errors.ConfigError(f"vLLM's {arch} parameters differ from tensorhub_verl.vllm.layout "
                                     f"(first differences: {diff}); update layout.py for this vLLM version")
    return layout_name(arch, tp_size, rank)


def build_holder(worker_obj: Any, *, hub_url: str, model: str, worker: str, location: Any = None,
                 token: str | None = None, staging: str = "cpu", client_config: dict | None = None,
                 fetch_timeout_s: float = 300.0) -> EngineHolder:
    """Connects this rank to the hub and wraps its live parameters in an ``EngineHolder``."""
    import tensorhub_verl as th

    rank, tp = compat.tp_rank_and_size()
    # With LoRA enabled the base weights are named as without it: one layout, whatever the engine's LoRA.
    params = base_parameters(compat.live_parameters(compat.worker_model(worker_obj)))
    hf_cfg = compat.hf_config(worker_obj)
    layout = engine_layout(hf_cfg, tp, rank, params)
    # Where the layout is known, an 'hf' pull lands straight in the parameters (staging 'none': no copy), and
    # at TP>1 each rank reads only its slices of the HF tensors.
    views = hf_views(params, DecoderShape.from_hf_config(hf_cfg), tp, rank) if \
        hf_cfg.model_type in SUPPORTED_ARCHES else None
    # Engines take the client's defaults, the UCX pump included: NIXL's own progress thread ("thread") kept
    # engine processes from exiting on vLLM's CPU build (a worker spinning after shutdown).
    cfg = th.ClientConfig(**(client_config or {}))
    client = th.connect(hub_url, worker=rank_worker_id(worker, rank, tp), location=location, token=token,
                        config=cfg)
    try:
        # The engine's ranks are one shard group, named by its base worker id: a version in their layouts is
        # visible only once every rank holds it.
        config = HolderConfig(model=model, layout=layout, staging=staging, fetch_timeout_s=fetch_timeout_s,
                              shard_group=worker if tp > 1 else None, shard_count=tp)
        return EngineHolder(client, config,
                            params, lambda weights: compat.load_hf_weights(worker_obj, weights), hf_views=views)
    except BaseException:
        client.close()
        raise


class TensorHubWorkerExtension:
    """Mixed into vLLM's worker class. Names start with ``th_`` so they never collide with the worker's."""

    def _th(self) -> EngineHolder:
        holder = getattr(self, "_tensorhub_holder", None)
        if holder is None:
            raise errors.InvalidRequest("tensorhub is not set up on this worker: call th_setup first")
        return holder

    def th_setup(self, hub_url: str, model: str, worker: str, location: Any = None, token: str | None = None,
                 staging: str = "cpu", client_config: dict | None = None, fetch_timeout_s: float = 300.0) -> dict:
        """Connects this rank; returns ``th_status``. Idempotent: a second call with the same hub, model, worker
        and staging keeps the holder (and the version it serves); a different one replaces it."""
        settings = (hub_url, model, worker, staging)
        old = getattr(self, "_tensorhub_holder", None)
        if old is not None and getattr(self, "_tensorhub_settings", None) == settings:
            return old.status()
        if old is not None:
            adapters = getattr(self, "_tensorhub_adapters", None)
            if adapters is not None:  # it reads through the old holder's client
                self._tensorhub_adapters = None
                adapters.close()
            old.close()
            old.client.close()
            self._tensorhub_holder = None
        self._tensorhub_holder = self._th_build_holder(hub_url=hub_url, model=model, worker=worker,
                                                       location=location, token=token, staging=staging,
                                                       client_config=client_config, fetch_timeout_s=fetch_timeout_s)
        self._tensorhub_settings = settings
        return self._tensorhub_holder.status()

    def _th_build_holder(self, **kwargs) -> EngineHolder:
        """The holder of this rank's live parameters (a test double for a whole engine overrides this)."""
        return build_holder(self, **kwargs)

    def th_status(self) -> dict:
        return self._th().status()

    def th_watch(self, poll_timeout_s: float = 10.0) -> None:
        """Starts watching the hub for newer versions (reported as ``newest_seen`` in ``th_status``)."""
        self._th().start_watch(poll_timeout_s)

    def th_newest_version(self) -> int | None:
        return self._th().newest_version()

    def th_begin_pull(self, version: int | str = "latest") -> dict:
        return self._th().begin_pull(version)

    def th_apply(self, timeout: float = 300.0) -> dict:
        return self._th().apply(timeout)

    def th_abort(self) -> None:
        self._th().abort()

    def th_update(self, version: int | str = "latest", timeout: float = 300.0) -> dict:
        return self._th().update(version, timeout)

    def th_hf_digests(self) -> dict:
        """Per-tensor digests of the served weights as HF tensors (``EngineHolder.hf_digests``)."""
        return self._th().hf_digests()

    def th_publish_served(self, version: int) -> dict:
        """Declares the currently loaded weights to be ``version`` and holds them."""
        self._th().publish_served(version)
        return self._th().status()

    def th_layout(self) -> dict:
        """This rank's layout name and ``{name: [shape, dtype]}`` (for tests and tooling)."""
        h = self._th()
        return {"layout": h.config.layout,
                "params": {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in h.params.items()}}

    def th_param_checksum(self) -> dict:
        """Float64 sum of each parameter: a cheap fingerprint of what the engine serves (for tests)."""
        return {n: float(t.double().sum()) for n, t in self._th().params.items()}

    # ------------------------------------------------------------------ LoRA (see tensorhub_verl.vllm.lora)
    def th_lora_setup(self, lora_int_id: int, fetch_timeout_s: float = 300.0) -> dict:
        """Follows ``<model>.lora`` as adapter ``lora_int_id`` of this engine (after ``th_setup``; idempotent)."""
        holder = self._th()
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is not None and adapters.client is holder.client and self._tensorhub_lora_id == lora_int_id:
            return adapters.status()
        if adapters is not None:
            adapters.close()
        if getattr(getattr(self, "model_runner", None), "lora_manager", None) is None:
            raise errors.ConfigError("tensorhub LoRA needs the vLLM engine started with enable_lora=True")
        self._tensorhub_lora_id = lora_int_id
        self._tensorhub_adapters = AdapterHolder(
            holder.client, model=holder.config.model, fetch_timeout_s=fetch_timeout_s,
            load=lambda tensors, cfg: load_adapter_into_vllm(self, tensors, cfg, lora_int_id))
        return self._tensorhub_adapters.status()

    def _th_adapters(self) -> AdapterHolder:
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is None:
            raise errors.InvalidRequest("tensorhub LoRA is not set up on this worker: call th_lora_setup first")
        return adapters

    def th_lora_update(self, version: int | str = "latest", timeout_s: float = 300.0) -> dict:
        """Fetches adapter ``version`` (trainer or peers), applies it, holds it for peers."""
        return self._th_adapters().update(version, timeout_s).as_dict()

    def th_lora_status(self) -> dict:
        return self._th_adapters().status()

    def th_shutdown(self) -> None:
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is not None:
            self._tensorhub_adapters = None
            adapters.close()
        holder = getattr(self, "_tensorhub_holder", None)
        if holder is not None:
            self._tensorhub_holder = None
            try:
                holder.close()
            finally:
                holder.client.close()


__all__ = ["EXTENSION_QUALNAME", "TensorHubWorkerExtension", "build_holder", "engine_layout", "rank_worker_id"]
