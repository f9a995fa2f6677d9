"""verl 0.9.1: the critic (value model) loads with the attention implementation the job asks for.

Why: ``verl/utils/model.py`` ``load_valuehead_model`` passes ``attn_implementation="flash_attention_2"`` to
``from_pretrained`` (for the token-classification model and for the trl fallback), ignoring
``critic.model.override_config.attn_implementation``, which verl itself has already written into the
model's config (``HFModelConfig`` builds ``hf_config`` with it). Without flash-attn (any CPU, many GPU
set-ups) PPO with a critic cannot start: the load fails and verl reports "is not a value head model, please
install trl". The actor's loader has no such argument and honours the override.

The patch runs verl's own loader, unchanged, and replaces only that hard-coded argument by the
implementation in the config (``eager`` on the CPU platform: ``+tensorhub_cpu=...`` presets set it and
``job_check`` requires it). A job that asks for ``flash_attention_2`` (verl's default) takes verl's path
untouched.

Guard: registered only on verl's CPU platform (``tensorhub_dev.verl_cpu.plugin``), and the replacement checks
``VERL_PLATFORM=cpu`` again at call time, where flash-attn never exists; on other platforms verl's loader runs as
shipped (install flash-attn there).
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from tensorhub_dev.verl_cpu.patches import CPU_MARK
from tensorhub_verl.settings import cpu_platform_selected
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.utils.model"

HARD_CODED = "flash_attention_2"
"""What verl 0.9.1's value-model loader passes whatever the config says."""

_swap_lock = threading.RLock()


def describe() -> str:
    return ("load_valuehead_model uses the critic config's attn_implementation "
            "instead of always flash_attention_2 (CPU platform)")


def requested_attention(model_config: Any) -> str | None:
    """The attention implementation the job's config asks for (verl sets it from ``override_config``)."""
    value = getattr(model_config, "_attn_implementation", None)
    return value if isinstance(value, str) and value else None


def replace_hard_coded(kwargs: dict, requested: str) -> dict:
    """``from_pretrained`` keyword arguments with verl's hard-coded attention replaced by ``requested``."""
    if kwargs.get("attn_implementation") != HARD_CODED:
        return kwargs
    return {**kwargs, "attn_implementation": requested}


@contextmanager
def _from_pretrained_asking_for(requested: str) -> Iterator[None]:
    """While verl's loader runs on this thread, every ``PreTrainedModel.from_pretrained`` call it makes
    (the auto classes dispatch to it) gets ``requested`` where verl hard-codes flash_attention_2. Other
    threads keep transformers' own behaviour: the swap is checked against the thread that made it."""
    from transformers import PreTrainedModel

    owner = threading.get_ident()
    with _swap_lock:
        original = PreTrainedModel.__dict__["from_pretrained"]  # the classmethod object

        @functools.wraps(original.__func__)
        def from_pretrained(cls, *args, **kwargs):
            if threading.get_ident() == owner:
                kwargs = replace_hard_coded(kwargs, requested)
            return original.__func__(cls, *args, **kwargs)

        PreTrainedModel.from_pretrained = classmethod(from_pretrained)
        try:
            yield
        finally:
            PreTrainedModel.from_pretrained = original


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
            requested = requested_attention(model_config)
            if not cpu_platform_selected() or requested is None or requested == HARD_CODED:
                return original(local_path, torch_dtype, model_config, trust_remote_code)
            with _from_pretrained_asking_for(requested):
                return original(local_path, torch_dtype, model_config, trust_remote_code)

        return load_valuehead_model

    return replace_once(module, "load_valuehead_model", wrap, mark=CPU_MARK)
