"""Checks that an engine serves exactly the version it applied, and that an in-place HF mapping is vLLM's own.

Two checks, both against what vLLM itself does rather than a table of expectations:

- ``poison`` / ``unwritten``: before a version goes through the engine's loader, every floating-point byte of
  the parameters is set to NaN; afterwards any parameter still holding a NaN was never written by the loader (a
  tensor it silently skipped, e.g. fused MoE experts under names it does not know, or a name it ignored). A
  version with such a parameter is refused (``VersionRefused``), never reported applied. Real weights hold no
  NaN; a version that does is refused too, which is what a trainer that diverged deserves.
- ``check_views_against_loader``: an in-place mapping (``layout.HFViews``: which bytes of which parameter each HF
  tensor lands in) is accepted only if, for random HF tensors loaded through the engine's own loader, every view
  then holds exactly its HF slice and the views plus the vocab padding cover every byte of every parameter. It
  runs one group of HF tensors at a time (one decoder layer), restoring the parameters it touched after each, so
  it needs one group's memory, never the model's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from tensorhub_verl import errors
from tensorhub_verl.vllm.layout import HFViews

logger = logging.getLogger("tensorhub_verl.vllm.verify")

LoadHF = Callable[[Iterable[tuple[str, torch.Tensor]]], None]
_LAYER_RE = re.compile(r"^(.*?\.layers\.\d+)\.")


class VersionRefused(errors.ManifestMismatch):
    """The engine cannot serve this version exactly (its loader rejected or skipped some of it); the engine does
    not report it applied."""


def layer_key(hf_name: str) -> str:
    """The group an HF tensor is loaded with: its decoder layer (``model.layers.3``), else its own name.
    vLLM reloads a layer only once all of its weights arrived (``reload_weights`` is layerwise), so the tensors
    of one decoder layer always travel together."""
    m = _LAYER_RE.match(hf_name)
    return m.group(1) if m else hf_name


def poison(params: Mapping[str, torch.Tensor]) -> None:
    """Sets every floating-point parameter to NaN (integer and packed parameters are left as they are)."""
    with torch.no_grad():
        for t in params.values():
            if t.is_floating_point():
                t.fill_(float("nan"))


def unwritten(params: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point parameters that still hold a NaN."""
    return [n for n, t in params.items() if t.is_floating_point() and bool(torch.isnan(t).any())]


def refuse_unwritten(params: Mapping[str, torch.Tensor], version: int, loaded: Sequence[str]) -> None:
    """Raises ``VersionRefused`` when the loader left some parameter unwritten after loading ``loaded``."""
    missing = unwritten(params)
    if missing:
        raise VersionRefused(
            f"v{version}: the engine's loader left {len(missing)} parameter(s) unwritten (first: {missing[:3]}) "
            f"after loading {len(loaded)} HF tensors: the version's names are not the engine's checkpoint names "
            f"(publish checkpoint names: tensorhub_verl.hf_names.checkpoint_state_dict, or verl's export) or it "
            f"lacks tensors")


def _owner_of(params: Mapping[str, torch.Tensor]) -> Callable[[torch.Tensor], str]:
    owners = {t.untyped_storage().data_ptr(): n for n, t in params.items()}

    def owner(view: torch.Tensor) -> str:
        name = owners.get(view.untyped_storage().data_ptr())
        if name is None:
            raise errors.ConfigError("an HF view is not a view of any parameter")
        return name

    return owner


def check_views_against_loader(params: Mapping[str, torch.Tensor], views: HFViews,
                               full_shapes: Mapping[str, tuple[int, ...]], load_hf: LoadHF,
                               seed: int = 0) -> None:
    """Raises ``ConfigError`` unless ``views`` put every HF tensor where the engine's own loader puts it (see the
    module doc). ``full_shapes``: each HF tensor's full shape. The parameters are unchanged afterwards."""
    owner = _owner_of(params)
    covered: dict[str, int] = dict.fromkeys(params, 0)
    for v in [*views.views.values(), *views.padding]:
        covered[owner(v)] += v.numel()
    short = [n for n, t in params.items() if covered[n] != t.numel()]
    if short:
        raise errors.ConfigError(f"the HF views cover {[(n, covered[n], params[n].numel()) for n in short[:3]]} "
                                 f"(covered, total) elements: not every byte of these parameters")
    groups: dict[str, list[str]] = {}
    for name in views.views:
        groups.setdefault(layer_key(name), []).append(name)
    gen = torch.Generator().manual_seed(seed)
    for names in groups.values():
        touched = sorted({owner(views.views[n]) for n in names})
        backup = {n: params[n].clone() for n in touched}
        try:
            probes = {}
            for n in names:
                view = views.views[n]
                probes[n] = torch.randn(full_shapes[n], generator=gen).to(view.dtype).to(view.device)
            with torch.no_grad():
                load_hf(iter(probes.items()))
            for n in names:
                expected = probes[n]
                if n in views.slices:
                    dim, start, length = views.slices[n]
                    expected = expected.narrow(dim, start, length)
                if not torch.equal(views.views[n].cpu(), expected.cpu()):
                    raise errors.ConfigError(f"HF tensor {n!r}: the engine's loader puts it elsewhere than the "
                                             f"in-place mapping does")
        finally:
            with torch.no_grad():
                for n, saved in backup.items():
                    params[n].copy_(saved)


__all__ = ["VersionRefused", "check_views_against_loader", "layer_key", "poison", "refuse_unwritten", "unwritten"]
