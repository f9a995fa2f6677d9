"""vLLM worker extension: makes each TP rank's live parameters a ROS holder and applies new versions.

Use: ``LLM(..., worker_extension_cls=EXTENSION_QUALNAME)`` then drive it with ``updater.EngineUpdater``
(every method is reached through ``collective_rpc`` and runs inside the worker process, on every rank).

Importing this module prepares the process (``compat.prepare_worker_process``: CPU linear weights stay live)
and registers the ``tensorhub`` weight-transfer backend. vLLM imports it in each worker process before the
model loads, which is the only per-engine hook that early.

Identity is passed in (``th_setup``'s worker id and location), never read from globals; the TP rank comes from
the engine itself. A rank's worker id is ``<worker>`` at TP=1 and ``<worker>/rank<r>`` otherwise.
Every method takes plain values and returns plain values or a result dataclass of ``results.py`` (they cross
vLLM's RPC: pickled, or msgpack where a dataclass arrives as its dict; the driver reads either with ``from_wire``).
"""

from __future__ import annotations

import logging
from typing import Any

from tensorhub_verl import errors
from tensorhub_verl.vllm import compat
from tensorhub_verl.vllm.engine_holder import holder_for_engine, rank_worker_id
from tensorhub_verl.vllm.holder import EngineHolder
from tensorhub_verl.vllm.lora import AdapterHolder, load_adapter_into_vllm
from tensorhub_verl.vllm.mapping import engine_mapping
from tensorhub_verl.vllm.results import AdapterUpdate, ApplyResult, HolderStatus, PullStart, SleepStatus
from tensorhub_verl.vllm.sleep import Asleep, install_hooks, rejoin, wakes_weights

logger = logging.getLogger("tensorhub_verl.vllm.extension")

EXTENSION_QUALNAME = "tensorhub_verl.vllm.extension.TensorHubWorkerExtension"

compat.prepare_worker_process()
compat.register_weight_transfer_backend("tensorhub", "tensorhub_verl.vllm.weight_transfer",
                                        "TensorHubWeightTransferEngine")


def engine_layout(hf_cfg, tp_size: int, rank: int, params: dict, quantization: str | None = None) -> str:
    """This rank's layout name (``mapping.engine_arch``: the model type, and the quantization if any)."""
    return engine_mapping(hf_cfg, tp_size, rank, params, quantization=quantization, load_hf=None).layout


def build_holder(worker_obj: Any, *, hub_url: str, model: str, worker: str, location: Any = None,
                 token: str | None = None, staging: str = "cpu", client_config: dict | None = None,
                 fetch_timeout_s: float = 300.0, bucket_bytes: int | None = None,
                 delta: str = "auto") -> EngineHolder:
    """Connects this rank to the hub and wraps its live parameters in an ``EngineHolder``
    (``engine_holder.holder_for_engine``, as the weight-transfer backend does)."""

    def load_hf(weights):
        compat.load_hf_weights(worker_obj, weights)

    return holder_for_engine(compat.worker_model(worker_obj), worker_obj.vllm_config, load_hf,
                             hub_url=hub_url, model=model, worker=worker, location=location, token=token,
                             staging=staging, client_config=client_config, fetch_timeout_s=fetch_timeout_s,
                             bucket_bytes=bucket_bytes, delta=delta)


class TensorHubWorkerExtension:
    """Mixed into vLLM's worker class. Names start with ``th_`` so they never collide with the worker's."""

    def _th(self) -> EngineHolder:
        holder = getattr(self, "_tensorhub_holder", None)
        if holder is None:
            if getattr(self, "_tensorhub_asleep", None) is not None:
                raise errors.InvalidRequest("the engine sleeps (vLLM sleep mode): wake its weights up first")
            raise errors.InvalidRequest("tensorhub is not set up on this worker: call th_setup first")
        return holder

    def th_setup(self, hub_url: str, model: str, worker: str, location: Any = None, token: str | None = None,
                 staging: str = "cpu", client_config: dict | None = None, fetch_timeout_s: float = 300.0,
                 bucket_bytes: int | None = None, delta: str = "auto") -> HolderStatus:
        """Connects this rank; returns ``th_status``. Idempotent: a second call with the same hub, model, worker
        and staging keeps the holder (and the version it serves); a different one replaces it.
        ``bucket_bytes``: most HF bytes read at once when versions go through the engine's loader (None: the
        holder's default). ``delta``: ``HolderConfig.delta``."""
        settings = (hub_url, model, worker, staging, delta)
        extra = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        kwargs = dict(hub_url=hub_url, model=model, worker=worker, location=location, token=token, staging=staging,
                      client_config=client_config, fetch_timeout_s=fetch_timeout_s, delta=delta, **extra)
        if getattr(self, "_tensorhub_asleep", None) is not None:
            # The weights sleep: nothing may register them now. The engine connects with these settings at wake.
            self._tensorhub_build_kwargs, self._tensorhub_settings = kwargs, settings
            return self.th_status()
        old = getattr(self, "_tensorhub_holder", None)
        if old is not None and getattr(self, "_tensorhub_settings", None) == settings:
            return old.status()
        if old is not None:
            self._th_drop_holder()
        self._tensorhub_holder = self._th_build_holder(**kwargs)
        self._tensorhub_build_kwargs = kwargs
        self._tensorhub_settings = settings
        install_hooks(self, self.th_before_sleep, self.th_after_wake)
        return self._tensorhub_holder.status()

    def _th_drop_holder(self) -> None:
        """Stops holding (waiting for reads in flight) and disconnects: the client's data-plane agent and every
        memory registration go with it. The LoRA follower reads through that client, so it goes too."""
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is not None:
            self._tensorhub_adapters = None
            adapters.close()
        holder, self._tensorhub_holder = self._tensorhub_holder, None
        try:
            holder.close(timeout=holder.config.unpublish_timeout_s)
        finally:
            holder.client.close(timeout=holder.config.unpublish_timeout_s)

    def _th_build_holder(self, **kwargs) -> EngineHolder:
        """The holder of this rank's live parameters (a test double for a whole engine overrides this)."""
        return build_holder(self, **kwargs)

    def th_status(self) -> HolderStatus:
        """What this rank serves and pulls, or what it held when it went to sleep (``asleep``)."""
        asleep = getattr(self, "_tensorhub_asleep", None)
        if asleep is not None:
            return HolderStatus(worker=None, served=None, asleep=SleepStatus(**asleep.as_dict()))
        return self._th().status()

    # ------------------------------------------------------------------ sleep and wake (see tensorhub_verl.vllm.sleep)
    def th_before_sleep(self, level: int = 1) -> dict:
        """Before vLLM's sleep frees or moves the weights: unpublishes every holding (draining reads in flight)
        and disconnects. Runs on its own from the hooked ``sleep``; idempotent."""
        holder = getattr(self, "_tensorhub_holder", None)
        if holder is None:
            return {"asleep": getattr(self, "_tensorhub_asleep", None) is not None}
        served = None if holder.broken else holder.served
        asleep = Asleep(served=served, level=int(level))
        self._tensorhub_asleep = asleep
        try:
            self._th_drop_holder()
        except errors.TensorHubError as e:
            # The client is closed whatever happened (its agent and registrations are gone): a read still in
            # flight fails and its reader re-plans; vLLM's sleep must go on.
            logger.warning("%s: unpublishing before sleep did not finish cleanly: %s", holder.worker, e)
        logger.info("%s: sleeping at level %d; stopped holding v%s", holder.worker, level, served)
        return {"asleep": True, **asleep.as_dict()}

    def th_after_wake(self, tags: list[str] | None = None) -> dict:
        """After vLLM woke the weights: a new client registers the parameters as they are now, and the engine
        holds its version again or pulls the newest (``sleep.rejoin``). Nothing happens while the weights
        sleep (a wake-up of the KV cache only)."""
        asleep = getattr(self, "_tensorhub_asleep", None)
        if asleep is None or not wakes_weights(tags):
            return {"rejoined": False}
        self._tensorhub_holder = self._th_build_holder(**self._tensorhub_build_kwargs)
        self._tensorhub_asleep = None
        result = rejoin(self._tensorhub_holder, asleep)
        logger.info("%s: awake; %s", self._tensorhub_holder.worker, result)
        return {"rejoined": True, **result}

    def th_newest_version(self) -> int | None:
        return self._th().newest_version()

    def th_begin_pull(self, version: int | str = "latest") -> PullStart:
        return self._th().begin_pull(version)

    def th_apply(self, timeout: float = 300.0) -> ApplyResult:
        return self._th().apply(timeout)

    def th_wait_published(self, timeout_s: float = 120.0) -> bool:
        """Waits for the publication that ``th_apply`` left running (``EngineHolder.wait_published``)."""
        return self._th().wait_published(timeout_s)

    def th_abort(self) -> None:
        self._th().abort()

    def th_flip_report(self, serving: int | None, pull: int | None, outcome: str | None,
                       min_replica_fraction: float = 1.0) -> dict:
        """Reports the replica this rank belongs to for the fleet flip through this rank's client (the driver
        gathers every rank's status into what it serves and how its pull ended); returns the hub's ``FlipReply`` as a dict. At TP>1
        only rank 0 reports (the replica counts once toward the quorum); the other ranks answer an empty dict."""
        h = self._th()
        group = h.config.shard_group
        if group is not None and h.worker != rank_worker_id(group, 0, h.config.shard_count):
            return {}
        return h.client.flip_report(h.config.model, serving=serving, pull=pull, outcome=outcome,
                                    min_replica_fraction=min_replica_fraction).model_dump()

    def th_hf_digests(self) -> dict:
        """Per-tensor digests of the served weights as HF tensors (``EngineHolder.hf_digests``)."""
        return self._th().hf_digests()

    def th_layout(self) -> dict:
        """This rank's layout name and ``{name: [shape, dtype]}`` (for tests and tooling)."""
        h = self._th()
        return {"layout": h.config.layout, "in_place": h.maps_hf_in_place,
                "params": {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in h.params.items()}}

    def th_param_digests(self) -> dict:
        """``{"version", "digests": {param: digest}}`` of this rank's parameters in the engine's own layout
        (``integrity.tensor_digests``): two engines of one layout that serve one version have equal ones."""
        from tensorhub_verl.ros.wire.integrity import tensor_digests

        h = self._th()
        return {"version": h.served, "digests": tensor_digests(h.params)}

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
            base_version=lambda: holder.served,
            load=lambda tensors, cfg: load_adapter_into_vllm(self, tensors, cfg, lora_int_id))
        return self._tensorhub_adapters.status()

    def _th_adapters(self) -> AdapterHolder:
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is None:
            raise errors.InvalidRequest("tensorhub LoRA is not set up on this worker: call th_lora_setup first")
        return adapters

    def th_lora_update(self, version: int | str = "latest", timeout_s: float = 300.0) -> AdapterUpdate:
        """Fetches adapter ``version`` (trainer or peers), applies it, holds it for peers."""
        return self._th_adapters().update(version, timeout_s)

    def th_lora_status(self) -> dict:
        return self._th_adapters().status()

    def th_shutdown(self) -> None:
        adapters = getattr(self, "_tensorhub_adapters", None)
        if adapters is not None:
            self._tensorhub_adapters = None
            adapters.close()
        self._tensorhub_asleep = None
        holder = getattr(self, "_tensorhub_holder", None)
        if holder is not None:
            self._tensorhub_holder = None
            try:
                holder.close()
            finally:
                holder.client.close()


__all__ = ["EXTENSION_QUALNAME", "TensorHubWorkerExtension", "build_holder", "engine_layout", "rank_worker_id"]
