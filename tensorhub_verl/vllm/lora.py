"""LoRA: only the adapter moves. An engine serves the base model it got once and a LoRA adapter per version.

ROS names (``adapter_model``): the adapter of model ``policy`` is the model ``policy.lora`` in layout ``peft``:
peft's checkpoint names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, as
``get_peft_model_state_dict`` and ``adapter_model.safetensors`` have them), full tensors, plus one uint8
tensor ``PEFT_CONFIG_KEY`` holding the adapter's peft config as JSON, so a version says how to apply itself and
peers serve it exactly as they serve the tensors, and one int64 tensor ``BASE_VERSION_KEY`` naming the version
of ``policy`` the adapter was trained on. The base model stays ``policy`` in ``hf`` (published once).

    trainer                         hub                       engine e1                   engine e2
    publish policy v0 (base, once) ─>│<── base pull (once) ─────┤                           │
    publish policy.lora v ──────────>│<── fetch v (MBs, hold) ──┤ load_adapter(v) ──► serves │
                                     │<── fetch v ──────────────┼───────────────────────────┤ (from e1 or trainer)

``AdapterHolder`` is the engine side: it fetches a version into buffers it then holds for peers (they never
change: a new version gets new buffers), hands a copy of the tensors to the engine's loader, and releases the
version it served before. It refuses (``BaseMismatch``) an adapter whose base version is not the one the engine
serves: an adapter applied to another base serves weights nobody trained. ``load_adapter_into_vllm`` is that
loader for a vLLM worker: vLLM's own ``LoRAModel.from_lora_tensors`` and its adapter manager, under a fixed
adapter id that requests name.

With LoRA enabled vLLM wraps each target layer and its weight becomes ``<layer>.base_layer.weight``;
``base_parameters`` names them as the plain model does, so the base holder's layout (and its peers) are the
same with and without LoRA.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tensorhub_verl import errors
from tensorhub_verl.vllm.results import AdapterUpdate

logger = logging.getLogger("tensorhub_verl.vllm.lora")

ADAPTER_SUFFIX = ".lora"
ADAPTER_LAYOUT = "peft"
PEFT_CONFIG_KEY = "__peft_config__"
"""The uint8 tensor of a published adapter that holds its peft config (JSON, UTF-8)."""
BASE_VERSION_KEY = "__base_version__"
"""The one-element int64 tensor of a published adapter that names the version of the base model it applies to."""
_RESERVED = (PEFT_CONFIG_KEY, BASE_VERSION_KEY)
BASE_LAYER = ".base_layer."

LoadAdapter = Callable[[dict[str, torch.Tensor], dict], None]


def adapter_model(model: str) -> str:
    """The ROS model name of ``model``'s LoRA adapter."""
    return f"{model}{ADAPTER_SUFFIX}"


def base_parameters(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` named as the model without LoRA (``x.base_layer.weight`` -> ``x.weight``); same tensors."""
    out = {}
    for name, t in params.items():
        plain = name.replace(BASE_LAYER, ".")
        if plain in out:
            raise errors.ConfigError(f"parameters {name!r} and {plain!r} collide once '.base_layer' is removed")
        out[plain] = t
    return out


def _jsonable(value: Any) -> Any:
    """peft's ``LoraConfig.to_dict()`` holds sets and enums; JSON needs lists and plain values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
        return _jsonable(value.value)  # enum
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def peft_config_dict(peft_config: Any) -> dict:
    """A JSON-able dict of a peft ``LoraConfig`` (or of its ``to_dict()``). Checks the fields vLLM needs."""
    raw = peft_config.to_dict() if hasattr(peft_config, "to_dict") else peft_config
    if not isinstance(raw, Mapping):
        raise errors.ConfigError(f"a peft config must be a LoraConfig or a dict, got {type(peft_config).__name__}")
    cfg = _jsonable(dict(raw))
    missing = [k for k in ("r", "lora_alpha", "target_modules") if cfg.get(k) in (None, "", [])]
    if missing:
        raise errors.ConfigError(f"the peft config lacks {missing}: vLLM cannot apply the adapter without them")
    return cfg


def pack_adapter(tensors: Mapping[str, torch.Tensor], peft_config: Any, *, base_version: int
                 ) -> dict[str, torch.Tensor]:
    """What the trainer publishes as one adapter version: the LoRA tensors, the config tensor, and the version of
    the base model (``<model>`` in ``hf``) the adapter was trained on."""
    if not tensors:
        raise errors.InvalidRequest("the adapter has no tensors (is the model a peft model with LoRA layers?)")
    not_lora = [n for n in tensors if "lora_" not in n]
    if not_lora:
        raise errors.InvalidRequest(f"tensors {not_lora[:3]} are not LoRA weights (peft names contain 'lora_')")
    reserved = [n for n in _RESERVED if n in tensors]
    if reserved:
        raise errors.InvalidRequest(f"{reserved[0]!r} is reserved for the adapter's own description")
    if isinstance(base_version, bool) or not isinstance(base_version, int) or base_version < 0:
        raise errors.InvalidRequest(f"an adapter names the base version it applies to (an int >= 0), got "
                                    f"{base_version!r}")
    blob = json.dumps(peft_config_dict(peft_config), sort_keys=True).encode()
    out = dict(tensors)
    out[PEFT_CONFIG_KEY] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    out[BASE_VERSION_KEY] = torch.tensor([base_version], dtype=torch.int64)
    return out


def unpack_adapter(buffers: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """(LoRA tensors, peft config) out of a fetched adapter version."""
    blob = buffers.get(PEFT_CONFIG_KEY)
    if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
        raise errors.ManifestMismatch(f"the adapter version has no {PEFT_CONFIG_KEY!r} uint8 tensor: "
                                      f"not published by pack_adapter")
    try:
        cfg = json.loads(bytes(blob.cpu().numpy().tobytes()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise errors.ManifestMismatch(f"the adapter's {PEFT_CONFIG_KEY!r} is not JSON: {e}") from e
    return {n: t for n, t in buffers.items() if n not in _RESERVED}, peft_config_dict(cfg)


def adapter_base_version(buffers: Mapping[str, torch.Tensor]) -> int:
    """The base version a fetched adapter version names; ``BaseMismatch`` when it names none (an adapter
    published without one cannot be checked against the engine's base, so it is never applied)."""
    found = buffers.get(BASE_VERSION_KEY)
    if found is None or found.dtype != torch.int64 or found.numel() != 1:
        raise errors.BaseMismatch(f"the adapter version names no base version (no one-element int64 "
                                  f"{BASE_VERSION_KEY!r} tensor): publish it with pack_adapter(..., base_version=N)")
    return int(found.reshape(()).item())


def adapter_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class AdapterHolder:
    """The adapter versions of one engine rank: fetched, held for peers, applied through ``load``.

    Invariant: the engine serves ``served`` (or no adapter when None); its buffers are held until the next
    version is applied, then released. A failed fetch or load leaves ``served`` as it was.
    """

    def __init__(self, client, *, model: str, load: LoadAdapter, base_version: Callable[[], int | None],
                 fetch_timeout_s: float = 300.0, unpublish_timeout_s: float = 60.0) -> None:
        """``base_version``: the version of ``model`` the engine serves now (None: none yet); an adapter is
        applied only on the base version it names."""
        if fetch_timeout_s <= 0 or unpublish_timeout_s <= 0:
            raise errors.ConfigError("fetch_timeout_s and unpublish_timeout_s must be > 0")
        self.client = client
        self.base_model = model
        self._base_version = base_version
        self.model = adapter_model(model)
        self._load = load
        self.fetch_timeout_s = fetch_timeout_s
        self.unpublish_timeout_s = unpublish_timeout_s
        self.served: int | None = None
        self._held: dict[int, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def newest_version(self) -> int | None:
        return self.client.latest(self.model, layout=ADAPTER_LAYOUT)

    def update(self, version: int | str = "latest", timeout: float | None = None) -> AdapterUpdate:
        """Fetches ``version`` (from the trainer or any peer holding it), applies it, releases the old one."""
        with self._lock:
            t0 = time.monotonic()
            if version == "latest":
                newest = self.newest_version()
                if newest is None:
                    raise errors.VersionNotFound(f"no version of {self.model!r} is published")
                version = newest
            version = int(version)
            if version == self.served:
                return AdapterUpdate(version=version, applied=False)
            stats = self.client.fetch(self.model, version, into=None, layout=ADAPTER_LAYOUT, hold=True,
                                      timeout=timeout or self.fetch_timeout_s)
            buffers = stats.buffers
            try:
                tensors, cfg = unpack_adapter(buffers)
                base, held = adapter_base_version(buffers), self._base_version()
                if base != held:
                    raise errors.BaseMismatch(
                        f"{self.model} v{version} applies to {self.base_model!r} v{base}, but this engine serves "
                        f"{'no version' if held is None else f'v{held}'} of it: refused, the engine keeps "
                        f"{'no adapter' if self.served is None else f'adapter v{self.served}'}. Update the "
                        f"engine's base to v{base} first", base_version=base, held_version=held)
                # vLLM keeps what it is given; the held buffers must stay as published for peers.
                self._load({n: t.clone() for n, t in tensors.items()}, cfg)
            except BaseException:
                self._release(version)
                raise
            old, self.served = self.served, version
            self._held[version] = buffers
            if old is not None:
                self._release(old)
            logger.info("%s v%d applied: %d bytes from %s", self.model, version, stats.bytes, stats.sources)
            return AdapterUpdate(version=version, applied=True, bytes=int(stats.bytes),
                                 seconds=time.monotonic() - t0, sources=dict(stats.sources))

    def status(self) -> dict:
        return {"model": self.model, "served": self.served, "held": sorted(self._held)}

    def close(self) -> None:
        with self._lock:
            for version in list(self._held):
                self._release(version)

    def _release(self, version: int) -> None:
        self._held.pop(version, None)
        try:
            self.client.unpublish(self.model, version, layout=ADAPTER_LAYOUT, timeout=self.unpublish_timeout_s)
        except errors.VersionNotFound:
            pass  # a failed fetch already stopped holding it


def load_adapter_into_vllm(worker: Any, tensors: dict[str, torch.Tensor], peft_config: dict,
                           lora_int_id: int) -> None:
    """Replaces adapter ``lora_int_id`` of a vLLM worker by ``tensors`` (peft names) through vLLM's own
    ``LoRAModel.from_lora_tensors`` and adapter manager. Requests that name ``lora_int_id`` then use it.

    Raises ``ConfigError`` when the engine has no LoRA (``enable_lora``), the adapter's rank exceeds
    ``max_lora_rank``, or a module of the adapter is none of the engine's LoRA layers (it would be ignored)."""
    from vllm.lora.peft_helper import PEFTHelper

    manager = getattr(getattr(worker, "model_runner", None), "lora_manager", None)
    if manager is None:
        raise errors.ConfigError("this vLLM engine has no LoRA support: start it with enable_lora=True and "
                                 "max_lora_rank >= the adapter's rank")
    helper = PEFTHelper.from_dict(peft_config)
    try:
        helper.validate_legal(manager.lora_config)
    except ValueError as e:
        raise errors.ConfigError(f"vLLM refuses the adapter: {e}") from e
    adapters = manager._adapter_manager
    model = adapters.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = manager._lora_model_cls.from_lora_tensors(
        lora_model_id=lora_int_id, tensors=tensors, peft_helper=helper, device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    adapters.remove_adapter(lora_int_id)
    adapters.add_adapter(lora)  # merges q/k/v (packed modules) into the engine's fused layers' names
    unknown = sorted(set(lora.loras) - set(adapters.modules))
    if unknown:
        adapters.remove_adapter(lora_int_id)
        raise errors.ConfigError(f"adapter modules {unknown[:3]} are none of the engine's LoRA layers "
                                 f"({sorted(adapters.modules)[:3]}...): the adapter targets another model")
    adapters.activate_adapter(lora_int_id)


__all__ = ["ADAPTER_LAYOUT", "ADAPTER_SUFFIX", "BASE_VERSION_KEY", "PEFT_CONFIG_KEY", "AdapterHolder",
           "adapter_base_version", "adapter_bytes", "adapter_model", "base_parameters", "load_adapter_into_vllm",
           "pack_adapter", "peft_config_dict", "unpack_adapter"]
