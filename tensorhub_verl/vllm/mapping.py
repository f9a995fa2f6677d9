"""How one engine rank takes ``hf`` versions: in place (reads straight into its parameters) or through its loader.

    engine rank ──► quantized?                 yes ─► buckets (the loader quantizes; layout vllm/<arch>_<quant>/..)
                    layout.py's candidate shapes equal the live ones?   no ─► buckets
                    views put every HF tensor where vLLM's loader does (verify.check_views_against_loader)?
                                               no ─► buckets;   yes ─► in place

The in-place mapping is never trusted on its own: it is used only after vLLM's own loader, fed random tensors,
put every HF tensor's bytes exactly where the views say (and the views cover every parameter byte). Everything
else takes the general path (``buckets.py``), which any architecture vLLM can load takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from tensorhub_verl import errors
from tensorhub_verl.hf_names import TIED_HEAD, ties_word_embeddings
from tensorhub_verl.vllm.layout import SUPPORTED_ARCHES, DecoderShape, HFViews, hf_views, layout_name, \
    vllm_param_shapes
from tensorhub_verl.vllm.verify import check_views_against_loader

logger = logging.getLogger("tensorhub_verl.vllm.mapping")

LoadHF = Callable[[Iterable[tuple[str, torch.Tensor]]], None]


@dataclass(frozen=True, slots=True)
class EngineMapping:
    layout: str
    """This rank's layout name: equal names mean byte-compatible parameters (raw copies allowed)."""
    views: HFViews | None
    """The checked in-place mapping, or None: versions go through the engine's loader in buckets."""
    skip_hf: tuple[str, ...]
    """HF names the engine has no parameter for and its loader would skip (the head of tied embeddings)."""
    reason: str
    """Why this path (for logs and ``th_layout``)."""


def engine_arch(hf_cfg, quantization: str | None) -> str:
    """The arch part of the layout name: ``model_type``, with ``_<quantization>`` for a quantized engine (its
    parameters hold other bytes than an unquantized engine's of the same model)."""
    arch = str(hf_cfg.model_type).lower().replace("-", "_")
    return f"{arch}_{quantization.lower().replace('-', '_')}" if quantization else arch


def tied_heads(hf_cfg, params: Mapping[str, torch.Tensor]) -> tuple[str, ...]:
    """``("lm_head.weight",)`` when the model ties its head to the embedding and the engine has no head of its
    own: vLLM's loaders skip that name (or, as Gemma2's, raise on it), so it is never handed to them. A version
    from a trainer carries it only when the head is not the embedding's bytes (``hf_names.repeated_head``)."""
    return (TIED_HEAD,) if ties_word_embeddings(hf_cfg) and TIED_HEAD not in params else ()


def engine_mapping(hf_cfg, tp_size: int, rank: int, params: Mapping[str, torch.Tensor], *,
                   quantization: str | None, load_hf: LoadHF | None) -> EngineMapping:
    """The rank's layout and, where it checks out against vLLM's loader, its in-place mapping. ``load_hf``
    None skips the check and the mapping (buckets)."""
    layout = layout_name(engine_arch(hf_cfg, quantization), tp_size, rank)
    skip = tied_heads(hf_cfg, params)
    if quantization:
        return EngineMapping(layout, None, skip, f"quantized ({quantization}): the engine's loader quantizes")
    if hf_cfg.model_type not in SUPPORTED_ARCHES:
        return EngineMapping(layout, None, skip, f"{hf_cfg.model_type}: no in-place candidate")
    try:
        shape = DecoderShape.from_hf_config(hf_cfg)
        expected = vllm_param_shapes(shape, tp_size, rank)
    except (errors.ConfigError, AttributeError, TypeError) as e:
        return EngineMapping(layout, None, skip, f"no in-place candidate ({e})")
    live = {n: tuple(t.shape) for n, t in params.items()}
    if live != expected:
        diff = sorted(set(live.items()) ^ set(expected.items()))[:4]
        logger.warning("vLLM's %s parameters differ from layout.py's candidate (first differences: %s); "
                       "loading versions in buckets", hf_cfg.model_type, diff)
        return EngineMapping(layout, None, skip, f"parameters differ from the candidate: {diff}")
    if load_hf is None:
        return EngineMapping(layout, None, skip, "no loader to check the candidate against")
    views = hf_views(params, shape, tp_size, rank)
    try:
        check_views_against_loader(params, views, views.full_shapes, load_hf)
    except errors.ConfigError as e:
        logger.warning("the in-place mapping of %s disagrees with vLLM's loader (%s); loading versions in buckets",
                       hf_cfg.model_type, e)
        return EngineMapping(layout, None, skip, f"in-place candidate disagrees with vLLM's loader: {e}")
    return EngineMapping(layout, views, skip, "in place (checked against vLLM's loader)")


__all__ = ["EngineMapping", "engine_arch", "engine_mapping", "tied_heads"]
