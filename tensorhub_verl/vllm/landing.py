"""How a version's bytes land in an engine shard: straight into the parameters or into staging, from a peer's
copy in the engine's layout (raw) or from the trainer's 'hf' layout.

It owns the engine's map of 'hf' onto its parameters (``layout.HFViews``: None for an architecture
``layout.py`` does not map or a quantized engine) and the engine's loader. With a map, 'hf' tensors land in
views of the parameters (at TP>1 each rank reads only its slices); without one, a version goes through the
engine's loader in bounded buckets (``buckets.py``). A version read from 'hf' counts as landed only if every
floating-point byte of the parameters was written by it (``verify.poison`` before, ``verify.refuse_unwritten``
after), or, read as a delta from the version they hold, only if every chunk of them then has the version's
digest (the core's ``fetch(have=...)`` checks base, decoded target and written bytes, and re-reads in full any
chunk that fails; a TP rank's ``fetch_slices(have=...)`` checks its slices of each chunk against the version's
block digests). A trainer leaves a tied ``lm_head.weight`` out of its versions (``hf_names.repeated_head``): such a
version maps onto the parameters alone. A version that does carry an 'hf' tensor the engine has no parameter for
(a tied head, from a publisher that keeps it) lands it in a scratch buffer, which only a whole 'hf' read writes; a
delta's base is the whole 'hf' version, so before a delta from a version that landed otherwise (raw from a peer,
staged) that scratch is filled from the tensor it repeats.
Nothing here decides which version the parameters serve or registers them: ``EngineHolder`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT, check_dtype, dtype_name
from tensorhub_verl.vllm.buckets import load_in_buckets
from tensorhub_verl.vllm.compat import sync_device
from tensorhub_verl.vllm.holder_config import HolderConfig, LoadHF
from tensorhub_verl.vllm.layout import HFViews
from tensorhub_verl.vllm.staging import Staging
from tensorhub_verl.vllm.verify import VersionRefused, poison, refuse_unwritten

logger = logging.getLogger("tensorhub_verl.vllm.landing")


@dataclass(slots=True, frozen=True)
class Staged:
    """A version read into staging: ``apply`` copies it into the parameters."""

    stats: object
    buffers: dict[str, torch.Tensor]
    held: bool
    """The staging copy is published as a holder of the version (the caller releases it)."""
    in_engine_layout: bool
    """The buffers are shaped like the parameters (raw, or a TP rank's 'hf' slices); else HF tensors."""


class Landing:
    def __init__(self, client, config: HolderConfig, params: Mapping[str, torch.Tensor], load_hf: LoadHF,
                 staging: Staging, hf_views: HFViews | None, skip_hf: tuple[str, ...]):
        self._client = client
        self._config = config
        self._params = params
        self._load_hf = load_hf
        self._staging = staging
        self._views = hf_views
        self._skip_hf = skip_hf
        """HF names the engine has no parameter for and its loader skips (a tied head): never read."""
        self._scratch_version: int | None = None
        """The version whose unused HF tensors (a tied ``lm_head.weight``) the scratch buffers hold, None when
        unknown: only a whole 'hf' read in place writes them; a raw, staged or bucketed landing leaves them as
        they were."""

    # ------------------------------------------------------------------ which way a version lands
    @property
    def maps_hf_in_place(self) -> bool:
        """'hf' versions land straight in the parameters (else they go through the engine's loader in buckets)."""
        return self._views is not None

    @property
    def reads_hf_slices(self) -> bool:
        """A TP>1 rank whose layout maps onto HF slices: it reads only its slices of 'hf', staged or not."""
        return self._views is not None and bool(self._views.slices)

    def loads_in_buckets(self, source_layout: str) -> bool:
        """An 'hf' source with no in-place mapping goes through the engine's loader in buckets."""
        return source_layout == HF_LAYOUT and self._views is None

    @property
    def applies_deltas(self) -> bool:
        """A delta lands in the parameters: every HF tensor maps onto a view of them, whole (TP=1) or as the
        rank's slice of it (TP>1: the rank applies its part of each chunk and checks it against the version's
        block digests). An engine loading through buckets holds no HF bytes to apply to: it reads versions in
        full."""
        return self._config.delta != "off" and self._views is not None

    def delta_published(self, version: int, base: int) -> bool:
        """Whether the delta ``base`` -> ``version`` of 'hf' is published (by every row shard: rank 0's part
        stands for them; a missing part only makes the read fall back to the full version)."""
        from tensorhub_verl.ros.wire.delta_form import delta_layout

        manifest = self._client.manifest(self._config.model, version, layout=HF_LAYOUT)
        part = None if manifest.row_shards == 1 else (0, manifest.row_shards)
        layout = delta_layout(HF_LAYOUT, base, part)
        return version in self._client.versions(self._config.model, layout=layout)

    def lands_in_place(self, source_layout: str) -> bool:
        """Staging ``none`` reads straight into the parameters: raw from a peer, or from ``hf`` when the HF
        tensors map onto views of the parameters; otherwise through a staging copy."""
        return self._config.staging == "none" and (source_layout != HF_LAYOUT or self._views is not None)

    def dtype_refusal(self, version: int, keeps: str) -> errors.DtypeMismatch | None:
        """Why an in-place 'hf' landing of ``version`` would fail on a dtype (the parameters' shapes in another
        dtype), checked before a byte moves: a ``DtypeMismatch`` naming both dtypes, the setting that fixes it,
        and ``keeps`` (what the shard keeps serving); None when it would not."""
        if self._views is None:
            return None  # buckets go through the engine's own loader, which casts as it copies
        manifest = self._client.manifest(self._config.model, version, layout=HF_LAYOUT)
        for spec in manifest.tensors:
            target = self._views.views.get(spec.name)
            if target is None or dtype_name(target.dtype) == spec.dtype:
                continue
            shape = self._views.slices.get(spec.name)
            try:
                check_dtype(manifest, spec, target, None if shape is None else tuple(target.shape))
            except errors.DtypeMismatch as e:
                return errors.DtypeMismatch(f"{self._client.worker}: {e}. This engine keeps serving {keeps}.",
                                            tensor=e.tensor, buffer_dtype=e.buffer_dtype,
                                            published_dtype=e.published_dtype)
        return None

    # ------------------------------------------------------------------ straight into the parameters
    def raw_into_params(self, version: int, layout: str):
        """Raw read of ``version`` straight into the parameters, which then hold it in the engine's layout. At
        TP>1 the fetch itself does not hold (its holding would be visible before the other ranks'): the caller
        publishes the parameters in the engine's shard group once every byte is in."""
        single = self._config.shard_count == 1
        return self._client.fetch(self._config.model, version, into=self._params, layout=layout, hold=single,
                                  timeout=self._config.fetch_timeout_s)

    def hf_in_place(self, version: int, have: int | None = None):
        """Reads ``version``'s HF tensors straight into views of the parameters. Unless a TP rank read slices,
        the parameters then hold it in 'hf' too (to replicas of other layouts, and to peers pulling it right
        now); the caller's unpublish drops both holdings before they change. ``have``: the version the
        parameters hold, to read ``version`` as the delta from it (``applies_deltas``)."""
        targets = self._hf_targets(version)
        if targets is None:
            raise errors.ManifestMismatch(f"v{version}'s HF tensors do not map onto this engine's parameters")
        if have is not None and self.applies_deltas:
            return self._delta_in_place(version, have, targets)
        poison(self._params)  # the views cover every byte: whatever the pull does not write stays NaN
        self._scratch_version = None
        cfg = self._config
        if self._views.slices:
            # A TP rank reads only its slice of each HF tensor (rows, or a row-parallel weight's columns) and
            # nothing of what it does not use: a TP=N engine reads ~1x the model, not N copies. Holding only
            # parts, it cannot serve 'hf'; its peers read its layout raw instead.
            stats = self._client.fetch_slices(cfg.model, version, into=targets, slices=self._views.slices,
                                              layout=HF_LAYOUT, timeout=cfg.fetch_timeout_s)
        else:
            stats = self._client.fetch(cfg.model, version, into=targets, layout=HF_LAYOUT, hold=True,
                                       timeout=cfg.fetch_timeout_s)
        with torch.no_grad():
            for pad in self._views.padding:
                pad.zero_()  # what vLLM's loader does to the vocab padding rows
        sync_device(self._params.values())
        try:
            refuse_unwritten(self._params, version, list(targets))
        except VersionRefused:
            if not self._views.slices:  # the fetch held the parameters as 'hf': nobody may read them now
                self._client.unpublish(cfg.model, version, layout=HF_LAYOUT, timeout=cfg.unpublish_timeout_s)
            raise
        if not self._views.slices:
            self._scratch_version = version
        return stats

    def _delta_in_place(self, version: int, have: int, targets: dict[str, torch.Tensor]):
        """``version`` as the delta from ``have`` into views of the parameters, which hold ``have``: only the
        changed elements are written. The core refuses a delta that does not name ``have`` before writing a
        byte, leaves chunks whose bytes are not ``have``'s alone (their base digests, made while the delta is on
        the wire), checks each written chunk against ``version``'s digest (from its base digest and the changed
        words read back), restores a chunk that fails, and re-reads in full, from verified holders of
        ``version``, every chunk that failed a check (``stats.delta`` says which and why). It raises only when
        that re-read fails too: the caller then restores ``have`` in full. On return every chunk of the views
        has ``version``'s digest, and the parameters hold it in 'hf' and hold the delta form (peers read both).
        A TP>1 rank applies only its slices of each chunk (``Client.fetch_slices(have=...)``), checked against
        the sums of ``version``'s block digests they cover; it holds the delta form, never 'hf'."""
        cfg = self._config
        mode = "auto" if cfg.delta == "on" else cfg.delta  # a reader takes a delta whenever one is published
        if self._views.slices:
            stats = self._client.fetch_slices(cfg.model, version, into=targets, slices=self._views.slices,
                                              layout=HF_LAYOUT, timeout=cfg.fetch_timeout_s, have=have, delta=mode)
        else:
            self._scratch_holds(have, targets)
            self._scratch_version = None  # written from here on; known again once every chunk checked out
            stats = self._client.fetch(cfg.model, version, into=targets, layout=HF_LAYOUT, hold=True,
                                       timeout=cfg.fetch_timeout_s, have=have, delta=mode)
            self._scratch_version = version
        with torch.no_grad():
            for pad in self._views.padding:
                pad.zero_()
        sync_device(self._params.values())
        d = stats.delta
        if d is not None and (d.fallback_chunks or not d.used):
            logger.warning("%s: v%d from v%d: %s (%d chunk(s), %d bytes read in full)", self._client.worker,
                           version, have, "; ".join(d.reasons) or "delta not used", d.fallback_chunks,
                           d.fallback_bytes)
        return stats

    def _scratch_holds(self, have: int, targets: Mapping[str, torch.Tensor]) -> None:
        """Makes the scratch of each unused HF tensor hold ``have``'s bytes before the delta from ``have`` is
        applied into ``targets``: the delta's base is the whole version, those tensors included. A version that
        landed other than by a whole 'hf' read in place (raw from a peer, staged, in buckets) never wrote them, so
        a tied tensor's scratch is filled from the view of the tensor it repeats (a tied ``lm_head.weight`` is the
        embedding the engine serves). The delta's base check still decides, chunk by chunk: a publisher whose
        tied tensor is not its tie's bytes gets those chunks re-read in full."""
        if self._scratch_version == have or not self._views.unused:
            return
        filled = []
        with torch.no_grad():
            for name, source in self._views.tied.items():
                scratch, view = targets.get(name), self._views.views.get(source)
                if scratch is not None and view is not None and scratch.shape == view.shape:
                    scratch.copy_(view)
                    filled.append(name)
        logger.debug("%s: the scratch of %s held v%s, not the base v%d; filled %s from the tensors they repeat",
                     self._client.worker, list(self._views.unused), self._scratch_version, have, filled)

    def hf_in_buckets(self, version: int):
        """Loads ``version``'s HF tensors through the engine's loader, bucket by bucket, into the parameters."""
        cfg = self._config
        manifest = self._client.manifest(cfg.model, version, layout=HF_LAYOUT)
        device = next(iter(self._params.values())).device if self._params else torch.device("cpu")
        poison(self._params)
        stats = load_in_buckets(self._client, cfg.model, version, manifest, self._load_hf,
                                bucket_bytes=cfg.bucket_bytes, device=device, skip=self._skip_hf,
                                timeout=cfg.fetch_timeout_s)
        sync_device(self._params.values())
        refuse_unwritten(self._params, version, [s.name for s in manifest.tensors])
        return stats

    # ------------------------------------------------------------------ through staging
    def stage(self, version: int, layout: str) -> Staged:
        """Reads ``version`` from ``layout`` into staging while the engine generates."""
        cfg = self._config
        if layout == HF_LAYOUT and self.reads_hf_slices:
            return self._hf_slices_staged(version)
        if layout == HF_LAYOUT:
            bufs = self._staging.hf_set(self._client.manifest(cfg.model, version, layout=HF_LAYOUT))
        else:
            bufs = self._staging.engine_copy(self._params)
        # A staging copy in the engine's layout serves peers only at TP=1: at TP>1 it would be one rank's layout
        # visible outside the engine's shard group.
        hold = layout == HF_LAYOUT or cfg.shard_count == 1
        stats = self._client.fetch(cfg.model, version, into=bufs, layout=layout, hold=hold,
                                   timeout=cfg.fetch_timeout_s)
        return Staged(stats=stats, buffers=bufs, held=hold, in_engine_layout=layout != HF_LAYOUT)

    def _hf_slices_staged(self, version: int) -> Staged:
        """A TP rank's slices of ``version``'s HF tensors, read into its staging copy in the engine's layout
        (``apply`` then copies it in like a raw pull): ~1/N of the model per rank, not the whole of it. Parts of
        tensors: nothing whole to serve, so nothing is held."""
        staging = self._staging.engine_copy(self._params)
        views = self._views.onto(self._params, staging)
        targets = self._hf_targets(version, views)
        if targets is None:
            raise errors.ManifestMismatch(f"v{version}'s HF tensors do not map onto this engine's parameters")
        stats = self._client.fetch_slices(self._config.model, version, into=targets, slices=views.slices,
                                          layout=HF_LAYOUT, timeout=self._config.fetch_timeout_s)
        with torch.no_grad():
            for pad in views.padding:
                pad.zero_()
        return Staged(stats=stats, buffers=staging, held=False, in_engine_layout=True)

    def from_staging(self, version: int, staged: Mapping[str, torch.Tensor], in_engine_layout: bool) -> None:
        """Copies a staged version into the parameters (the stall): buffer by buffer when shaped like them,
        else through the engine's loader, refusing the version if it left a byte unwritten."""
        with torch.no_grad():
            if not in_engine_layout:
                poison(self._params)
                self._load_hf((n, t) for n, t in staged.items() if n not in self._skip_hf)
                refuse_unwritten(self._params, version, list(staged))
            else:
                for name, p in self._params.items():
                    p.copy_(staged[name], non_blocking=True)
                if any(p.is_cuda for p in self._params.values()):
                    torch.cuda.synchronize()

    # ------------------------------------------------------------------ helpers
    def _hf_targets(self, version: int, hf_views: HFViews | None = None) -> dict[str, torch.Tensor] | None:
        """Views of the parameters (or of ``hf_views``' tensors) for each HF tensor of ``version`` (scratch for
        the ones the engine does not use), or None when some HF tensor has no place in the parameters."""
        manifest = self._client.manifest(self._config.model, version, layout=HF_LAYOUT)
        views, targets = (hf_views or self._views).views, {}
        for spec in manifest.tensors:
            if spec.name in views:
                targets[spec.name] = views[spec.name]
            elif spec.name in self._views.unused and self._views.slices:
                continue  # a TP rank reads only what it uses
            elif spec.name in self._views.unused:
                targets[spec.name] = self._staging.scratch(spec)
            else:
                logger.warning("%s: HF tensor %r has no place in the engine's parameters; pulling v%d through a "
                               "staging copy", self._client.worker, spec.name, version)
                return None
        return targets

    def hf_digests(self) -> dict:
        """``{"digests": {hf_name: digest}, "unused": [...]}`` of the parameters read through the HF views
        (``integrity.tensor_digests``), to compare end to end with what the trainer published."""
        if self._views is None or self._views.slices:
            raise errors.ConfigError(f"{self._client.worker}: no HF mapping of this engine's layout "
                                     f"({self._config.layout}); digests in HF terms need a TP=1 llama/qwen2 engine")
        return {"digests": tensor_digests(self._views.views), "unused": list(self._views.unused)}


__all__ = ["Landing", "Staged"]
