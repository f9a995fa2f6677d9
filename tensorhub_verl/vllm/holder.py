"""The state machine that makes one engine shard (one TP rank) a holder and applies new versions.

Framework-neutral: it sees the shard's live parameters (a dict of tensors in the engine's own layout), a
function that loads HF-named tensors through the engine's loader, and a ROS client. ``extension.py`` wires it
into a vLLM worker; the unit tests drive it with plain tensors.

    begin_pull(v) ──► [pull thread] fetch v into staging ──► READY ─┐       (engine keeps generating)
                                                                    ▼
    apply() ─────► unpublish(old) ─► copy staging -> params ──────────────────────► (the only stall)
                                                         └─► [publish thread] digest params, publish(params, v)

Invariants:
- The parameters always hold exactly one version: ``served`` (or the engine's initial weights when None).
  A failed or aborted pull with staging leaves them untouched; the engine keeps serving ``served``.
- The parameters are registered as the holder of ``served`` in ``layout`` and are never written while they
  are registered: ``apply`` unpublishes (waiting for in-flight reads) before the first byte changes.
- An ``hf`` pull without an in-place mapping (``hf_views`` None: any architecture ``layout.py`` does not map, or a
  quantized engine) always runs inside ``apply``, through the engine's own loader in bounded buckets
  (``buckets.py``): one bucket of extra memory, never the whole model, whatever ``staging`` says.
- With staging ``none`` the pull writes straight into the parameters inside ``apply`` (raw from a peer, or from
  ``hf`` into views of the parameters when ``hf_views`` maps every HF tensor): no copy of the model exists
  besides the parameters, at the price of a stall as long as the pull. If it fails midway
  the shard restores ``served`` from the holders that still have it (peers or the trainer). If that fails too,
  the shard is ``broken`` and refuses to report a served version (``EngineStateLost``) rather than serve a mix.
- A version read from ``hf`` is reported applied only if every floating-point byte of the parameters was written
  by it (``verify.poison`` before, ``verify.refuse_unwritten`` after): a tensor the loader skipped or a name it
  ignored makes the apply fail with ``VersionRefused``, and the shard restores the version it served.
- Source layout: the engine's own layout when some other worker holds that version in it (raw one-sided
  reads), else the trainer's ``hf`` layout through the engine's loader. Which holders serve a read is the
  ROS planner's choice.
- A version that arrived in another layout (``hf``) needs one pass over the parameters to digest them in the
  engine's layout before they can be published in it. That pass runs on a thread after ``apply`` returns, so
  the engine generates meanwhile (the parameters are only read); anything that writes the parameters next
  (``apply``, a restore, ``close``, sleep) first waits for it (``_unpublish_served``). ``wait_published`` waits
  for it too. A version fetched in the engine's own layout reuses the fetch's digests and publishes at once.
- TP>1: the ranks of one engine publish their layouts as one shard group (``shard_group``, ``shard_count``):
  no rank's layout of a version is visible before every rank holds it, so a peer never starts a raw read of
  a half-published engine. A raw pull therefore never holds through ``fetch(hold=True)`` (that would turn the
  rank's layout visible alone); the rank publishes in its group once the bytes are in place.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.integrity import tensor_digests
from tensorhub_verl.ros.manifest import HF_LAYOUT, Manifest, check_dtype, dtype_from_name, dtype_name
from tensorhub_verl.settings import SOURCE_LAYOUT_ENV, STAGING_CHOICES
from tensorhub_verl.vllm.buckets import DEFAULT_BUCKET_BYTES, load_in_buckets
from tensorhub_verl.vllm.compat import sync_device
from tensorhub_verl.vllm.layout import HFViews
from tensorhub_verl.vllm.results import ApplyResult, PullStart
from tensorhub_verl.vllm.verify import VersionRefused, poison, refuse_unwritten

logger = logging.getLogger("tensorhub_verl.vllm.holder")

LoadHF = Callable[[Iterable[tuple[str, torch.Tensor]]], None]


class EngineStateLost(errors.TransferFailed):
    """A pull without staging failed midway and the served version could not be restored."""


class PullState(str, enum.Enum):
    IDLE = "idle"
    PULLING = "pulling"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class HolderConfig:
    """How one shard pulls and applies versions."""

    model: str
    """The ROS model name, e.g. ``policy``."""
    layout: str
    """This shard's layout, e.g. ``vllm/qwen2/tp1/rank0``."""
    staging: str = "cpu"
    """``cpu``/``gpu``: pull into a staging buffer while the engine generates, stall only for the copy.
    ``none``: pull straight into the parameters inside ``apply`` (no extra memory, longer stall)."""
    fetch_timeout_s: float = 300.0
    """Limit of one pull."""
    unpublish_timeout_s: float = 120.0
    """Limit of the wait for in-flight reads of the old version before its bytes are overwritten."""
    shard_group: str | None = None
    """The engine this shard belongs to (e.g. its base worker id) when it has ``shard_count`` > 1 ranks."""
    shard_count: int = 1
    """The engine's TP ranks: a version in their layouts becomes visible only when all of them hold it."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Most HF bytes read at once when a version goes through the engine's loader (whole decoder layers)."""

    def __post_init__(self) -> None:
        if self.shard_count < 1 or (self.shard_count > 1) != (self.shard_group is not None):
            raise errors.ConfigError(f"an engine of shard_count {self.shard_count} needs a shard_group exactly "
                                     f"when shard_count > 1 (got {self.shard_group!r})")
        if self.staging not in STAGING_CHOICES:
            raise errors.ConfigError(f"staging must be one of {STAGING_CHOICES}, got {self.staging!r}")
        if self.bucket_bytes <= 0:
            raise errors.ConfigError(f"bucket_bytes must be > 0, got {self.bucket_bytes}")
        if self.fetch_timeout_s <= 0 or self.unpublish_timeout_s <= 0:
            raise errors.ConfigError("fetch_timeout_s and unpublish_timeout_s must be > 0")
        if self.layout == HF_LAYOUT:
            raise errors.ConfigError("an engine shard's layout cannot be 'hf' (that is the trainer's layout)")


@dataclass(slots=True)
class _Pull:
    version: int
    source_layout: str
    thread: threading.Thread | None = None
    state: PullState = PullState.PULLING
    error: BaseException | None = None
    stats: object | None = None
    buffers: dict[str, torch.Tensor] | None = None
    held: bool = False
    in_engine_layout: bool = False
    """The buffers are in the engine's layout although the source was 'hf' (a TP rank's slices, staged)."""
    bucketed: bool = False
    """The version goes through the engine's loader in buckets inside ``apply`` (no mapping of 'hf')."""
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0


class EngineHolder:
    """Holder and updater of one engine shard. Thread-safe: one pull at a time, ``apply`` serialized."""

    def __init__(self, client, config: HolderConfig, params: Mapping[str, torch.Tensor], load_hf: LoadHF,
                 staging_device: str | torch.device | None = None, hf_views: HFViews | None = None,
                 skip_hf: tuple[str, ...] = ()):
        bad = [n for n, t in params.items() if t.numel() == 0 or not t.is_contiguous()]
        if bad:
            raise errors.ConfigError(f"parameters {bad[:3]} are empty or not contiguous: the engine repacked its "
                                     f"weights (on CPU import tensorhub_verl.vllm.compat before loading the model)")
        self.client = client
        self.config = config
        self.params = dict(params)
        self._load_hf = load_hf
        device = next(iter(self.params.values())).device if self.params else torch.device("cpu")
        if config.staging == "gpu":
            self._staging_device = torch.device(staging_device or device)
        else:
            self._staging_device = torch.device("cpu")
        # Host staging of a CUDA engine is page-locked: the copy into the parameters in the pause runs at the
        # link's speed, asynchronously, and the data plane reads into it without a bounce through pageable memory.
        self._pin = self._staging_device.type == "cpu" and device.type == "cuda" and torch.cuda.is_available()
        self._staging: dict[str, torch.Tensor] | None = None
        self._hf_views = hf_views
        self._skip_hf = tuple(skip_hf)
        """HF names the engine has no parameter for and its loader skips (a tied head): never read."""
        self._hf_scratch: dict[str, torch.Tensor] = {}
        self._hf_staging: dict[str, dict[str, torch.Tensor]] = {}
        self._lock = threading.RLock()
        self._pull: _Pull | None = None
        self._publishing: threading.Thread | None = None
        self._publish_error: BaseException | None = None
        self.served: int | None = None
        self.broken = False
        self.last_phases: dict[str, float] = {}
        """Seconds of each phase of the last apply (for benchmarks)."""

    # ------------------------------------------------------------------ queries
    @property
    def worker(self) -> str:
        return self.client.worker

    def status(self) -> dict:
        """Plain-typed summary (it crosses vLLM's RPC boundary)."""
        with self._lock:
            p = self._pull
            return {"worker": self.worker, "layout": self.config.layout, "served": self.served,
                    "broken": self.broken, "staging": self.config.staging, "extra_bytes": self.extra_bytes,
                    "pinned_staging": self._pin, "publishing": self._publishing is not None,
                    "pull": None if p is None else {"version": p.version, "state": p.state.value,
                                                    "source_layout": p.source_layout,
                                                    "error": None if p.error is None else repr(p.error)}}

    def newest_version(self) -> int | None:
        """Newest version of the model in any layout."""
        return max(self.client.versions(self.config.model), default=None)

    def plan_source_layout(self, version: int) -> str:
        """The engine's layout when another worker holds ``version`` in it, else ``hf`` (always ``hf`` when
        ``$TENSORHUB_SOURCE_LAYOUT`` is ``hf``: ``attach-vllm --source-layout hf``)."""
        raw = self.client.versions(self.config.model, layout=self.config.layout).get(version, [])
        if any(h != self.worker for h in raw) and os.environ.get(SOURCE_LAYOUT_ENV) != HF_LAYOUT:
            return self.config.layout
        if version in self.client.versions(self.config.model, layout=HF_LAYOUT):
            return HF_LAYOUT
        raise errors.VersionNotFound(f"no worker holds {self.config.model} v{version} in {self.config.layout!r} "
                                     f"or 'hf'")

    def publish_served(self, version: int) -> None:
        """Declares that the parameters now hold ``version`` (e.g. kept through a sleep) and registers them."""
        with self._lock:
            if self._pull is not None and self._pull.state is PullState.PULLING:
                raise errors.InvalidRequest("a pull is running; wait for it or abort it first")
            self._unpublish_served()
            self._publish_params(version)
            self.served = version
            self.broken = False

    # ------------------------------------------------------------------ publish
    def _publish_params(self, version: int, verified: Manifest | None = None) -> None:
        """Holds the parameters as ``version`` in the engine's layout, as one shard of the engine's group.
        ``verified``: the manifest the parameters' bytes were fetched and checked against in this very layout;
        its digests are reused, so that no pass over the model runs again at apply."""
        kw = {} if self.config.shard_count == 1 else {"shard_group": self.config.shard_group,
                                                     "shard_count": self.config.shard_count}
        self.client.publish(self.config.model, version, self.params, layout=self.config.layout, verified=verified,
                            **kw)

    def _publish_off_the_stall(self, version: int) -> None:
        """Digests and publishes the parameters as ``version`` on a thread, so that ``apply`` returns (and the engine
        generates) during the digest pass. A failure leaves the engine serving ``version`` without holding it."""
        def publish() -> None:
            try:
                self._publish_params(version)
            except Exception as e:  # noqa: BLE001 - reported by wait_published; the engine still serves version
                self._publish_error = e
                logger.warning("%s: publishing v%d in %s failed (%r): peers read it elsewhere", self.worker,
                               version, self.config.layout, e)

        self._publish_error = None
        self._publishing = threading.Thread(target=publish, name=f"th-publish-{self.worker}-v{version}", daemon=True)
        self._publishing.start()

    def wait_published(self, timeout: float | None = None) -> bool:
        """Waits for the publication ``apply`` left running. True when the parameters are registered as the
        holder of ``served`` (False after a failed publication, or when nothing is served)."""
        self._join_publisher(self.config.unpublish_timeout_s if timeout is None else timeout)
        return self.served is not None and self._publish_error is None

    def _join_publisher(self, timeout: float) -> None:
        thread = self._publishing
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            raise errors.TransferFailed(f"{self.worker}: publishing v{self.served} is still running after {timeout:.0f} "
                                        f"s; the parameters must not change meanwhile (raise unpublish_timeout_s)")
        self._publishing = None

    def _fetch_raw_into_params(self, version: int, layout: str):
        """Raw read of ``version`` straight into the parameters, which then hold it in the engine's layout.
        At TP>1 the fetch itself does not hold (its holding would be visible before the other ranks'):
        the parameters are published in the engine's shard group once every byte is in."""
        single = self.config.shard_count == 1
        stats = self.client.fetch(self.config.model, version, into=self.params, layout=layout, hold=single,
                                  timeout=self.config.fetch_timeout_s)
        if not single:
            self._publish_params(version, getattr(stats, "manifest", None))
        return stats

    def _unpublish_served(self) -> None:
        self._join_publisher(self.config.unpublish_timeout_s)  # its digest pass reads the parameters
        if self.served is None:
            return
        # Every layout the parameters serve it in: the engine's, and 'hf' after an in-place hf pull.
        try:
            self.client.unpublish(self.config.model, self.served, layout=None,
                                  timeout=self.config.unpublish_timeout_s)
        except errors.VersionNotFound:
            pass  # the hub or a retention policy dropped it already: nobody reads it
        self.served = None

    # ------------------------------------------------------------------ pull
    def begin_pull(self, version: int | str = "latest") -> PullStart:
        """Resolves the version and, with staging, starts pulling it in a background thread.

        ``started`` is False when the shard already serves that version (nothing to do). With staging ``none``
        the pull itself happens in ``apply``.
        """
        with self._lock:
            if self._pull is not None and self._pull.state is PullState.PULLING:
                raise errors.InvalidRequest(f"a pull of v{self._pull.version} is already running")
            self._release_pull()
            if version == "latest":
                v = self.newest_version()
                if v is None:
                    raise errors.VersionNotFound(f"no version of {self.config.model!r} is published")
            elif isinstance(version, int) and not isinstance(version, bool):
                v = version
            else:
                raise errors.InvalidRequest(f"version must be an int or 'latest', got {version!r}")
            if v == self.served and not self.broken:
                return PullStart(version=v, source_layout=self.config.layout, started=False)
            pull = _Pull(version=v, source_layout=self.plan_source_layout(v))
            self._pull = pull
            if self._pulls_in_place(pull.source_layout) or self._loads_in_buckets(pull.source_layout):
                pull.bucketed = self._loads_in_buckets(pull.source_layout)
                pull.state = PullState.READY  # the pull runs inside apply, straight into the params
                self._refuse_other_dtype(pull)
                return PullStart(version=v, source_layout=pull.source_layout, started=True)
            pull.thread = threading.Thread(target=self._run_pull, args=(pull,), daemon=True,
                                           name=f"tensorhub-pull-{self.config.model}-v{v}")
            pull.thread.start()
            return PullStart(version=v, source_layout=pull.source_layout, started=True)

    def _pulls_in_place(self, source_layout: str) -> bool:
        """Staging ``none`` reads straight into the parameters: raw from a peer, or from ``hf`` when the HF
        tensors map onto views of the parameters (``layout.hf_views``); otherwise through a staging copy."""
        return self.config.staging == "none" and (source_layout != HF_LAYOUT or self._hf_views is not None)

    def _refuse_other_dtype(self, pull: _Pull) -> None:
        """An in-place 'hf' pull whose version has the parameters' shapes in another dtype fails here, before the
        served version is unpublished or a byte moves: the pull is FAILED with a ``DtypeMismatch`` that names
        both dtypes, the setting that fixes it, and the version the shard keeps serving."""
        if pull.source_layout != HF_LAYOUT or self._hf_views is None:
            return  # buckets go through the engine's own loader, which casts as it copies
        manifest = self.client.manifest(self.config.model, pull.version, layout=HF_LAYOUT)
        views = self._hf_views.views
        for spec in manifest.tensors:
            target = views.get(spec.name)
            if target is None or dtype_name(target.dtype) == spec.dtype:
                continue
            shape = self._hf_views.slices.get(spec.name)
            try:
                check_dtype(manifest, spec, target, None if shape is None else tuple(target.shape))
            except errors.DtypeMismatch as e:
                keeps = "its initial weights" if self.served is None else f"v{self.served}"
                pull.error = errors.DtypeMismatch(f"{self.worker}: {e}. This engine keeps serving {keeps}.",
                                                  tensor=e.tensor, buffer_dtype=e.buffer_dtype,
                                                  published_dtype=e.published_dtype)
                pull.state = PullState.FAILED
                logger.error("%s", pull.error)
                return

    def _loads_in_buckets(self, source_layout: str) -> bool:
        """An 'hf' source with no in-place mapping goes through the engine's loader in buckets."""
        return source_layout == HF_LAYOUT and self._hf_views is None

    def _hf_targets(self, version: int, hf_views: HFViews | None = None) -> dict[str, torch.Tensor] | None:
        """Views of the parameters (or of ``hf_views``' tensors) for each HF tensor of ``version`` (scratch for
        the ones the engine does not use), or None when some HF tensor has no place in the parameters."""
        manifest = self.client.manifest(self.config.model, version, layout=HF_LAYOUT)
        views, targets = (hf_views or self._hf_views).views, {}
        for spec in manifest.tensors:
            if spec.name in views:
                targets[spec.name] = views[spec.name]
            elif spec.name in self._hf_views.unused and self._hf_views.slices:
                continue  # a TP rank reads only what it uses
            elif spec.name in self._hf_views.unused:
                scratch = self._hf_scratch.get(spec.name)
                if scratch is None or tuple(scratch.shape) != spec.shape or dtype_name(scratch.dtype) != spec.dtype:
                    scratch = self._empty(spec.shape, dtype_from_name(spec.dtype))
                    self._hf_scratch[spec.name] = scratch
                targets[spec.name] = scratch
            else:
                logger.warning("%s: HF tensor %r has no place in the engine's parameters; pulling v%d through a "
                               "staging copy", self.worker, spec.name, version)
                return None
        return targets

    def hf_digests(self) -> dict:
        """``{"version", "digests": {hf_name: digest}, "unused": [...]}`` of the served weights, read through the
        HF views (``integrity.tensor_digests``), to compare end to end with what the trainer published."""
        if self._hf_views is None or self._hf_views.slices:
            raise errors.ConfigError(f"{self.worker}: no HF mapping of this engine's layout "
                                     f"({self.config.layout}); digests in HF terms need a TP=1 llama/qwen2 engine")
        with self._lock:
            return {"version": self.served, "digests": tensor_digests(self._hf_views.views),
                    "unused": list(self._hf_views.unused)}

    @property
    def maps_hf_in_place(self) -> bool:
        """'hf' versions land straight in the parameters (else they go through the engine's loader in buckets)."""
        return self._hf_views is not None

    @property
    def extra_bytes(self) -> int:
        """Bytes this shard holds besides its parameters (staging buffers and scratch), for memory reports."""
        sets = [self._staging or {}, self._hf_scratch, *self._hf_staging.values()]
        return sum(t.numel() * t.element_size() for bufs in sets for t in bufs.values())

    @property
    def _reads_hf_slices(self) -> bool:
        """A TP>1 rank whose layout maps onto HF slices: it reads only its slices of 'hf', staged or not."""
        return self._hf_views is not None and bool(self._hf_views.slices)

    def _empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A staging buffer on the staging device (pinned host memory when the engine is on CUDA)."""
        return torch.empty(tuple(shape), dtype=dtype, device=self._staging_device, pin_memory=self._pin)

    @property
    def pinned_staging(self) -> bool:
        return self._pin

    def _engine_staging(self) -> dict[str, torch.Tensor]:
        if self._staging is None:
            self._staging = {n: self._empty(t.shape, t.dtype) for n, t in self.params.items()}
        return self._staging

    def _fetch_hf_slices_staged(self, version: int):
        """A TP rank's slices of ``version``'s HF tensors, read into its staging copy in the engine's layout
        (``apply`` then copies it in like a raw pull): ~1/N of the model per rank, not the whole of it."""
        staging = self._engine_staging()
        views = self._hf_views.onto(self.params, staging)
        targets = self._hf_targets(version, views)
        if targets is None:
            raise errors.ManifestMismatch(f"v{version}'s HF tensors do not map onto this engine's parameters")
        stats = self.client.fetch_slices(self.config.model, version, into=targets, slices=views.slices,
                                         layout=HF_LAYOUT, timeout=self.config.fetch_timeout_s)
        with torch.no_grad():
            for pad in views.padding:
                pad.zero_()
        return stats, staging

    def _buffers_for(self, layout: str, version: int) -> dict[str, torch.Tensor]:
        if layout != HF_LAYOUT:
            return self._engine_staging()
        manifest = self.client.manifest(self.config.model, version, layout=HF_LAYOUT)
        key = manifest.digest
        if key not in self._hf_staging:
            self._hf_staging.clear()  # one HF staging set at a time
            self._hf_staging[key] = {t.name: self._empty(t.shape, dtype_from_name(t.dtype)) for t in manifest.tensors}
        return self._hf_staging[key]

    def _run_pull(self, pull: _Pull) -> None:
        layouts = [pull.source_layout] + ([HF_LAYOUT] if pull.source_layout != HF_LAYOUT else [])
        for i, layout in enumerate(layouts):
            sliced = layout == HF_LAYOUT and self._reads_hf_slices
            if self._loads_in_buckets(layout):
                with self._lock:  # apply loads it in buckets: nothing to stage
                    pull.source_layout, pull.bucketed, pull.error = layout, True, None
                    pull.seconds = time.monotonic() - pull.started
                    pull.state = PullState.READY
                return
            try:
                if sliced:
                    hold = False  # parts of tensors: nothing whole to serve
                    stats, bufs = self._fetch_hf_slices_staged(pull.version)
                else:
                    bufs = self._buffers_for(layout, pull.version)
                    # A staging copy in the engine's layout serves peers only at TP=1: at TP>1 it would be one
                    # rank's layout visible outside the engine's shard group.
                    hold = layout == HF_LAYOUT or self.config.shard_count == 1
                    stats = self.client.fetch(self.config.model, pull.version, into=bufs, layout=layout,
                                              hold=hold, timeout=self.config.fetch_timeout_s)
            except (errors.TransferFailed, errors.VersionNotFound, errors.ManifestMismatch) as e:
                pull.error = e
                if i + 1 < len(layouts):
                    logger.warning("%s: raw pull of v%d failed (%s); falling back to the 'hf' layout",
                                   self.worker, pull.version, e)
                    continue
            except BaseException as e:  # noqa: BLE001 - reported through status/apply, never swallowed
                pull.error = e
            else:
                with self._lock:
                    pull.source_layout, pull.stats, pull.buffers, pull.held = layout, stats, bufs, hold
                    pull.in_engine_layout = layout != HF_LAYOUT or sliced
                    pull.error = None
                    pull.seconds = time.monotonic() - pull.started
                    pull.state = PullState.READY
                return
            break
        with self._lock:
            pull.seconds = time.monotonic() - pull.started
            pull.state = PullState.FAILED
        logger.warning("%s: pull of %s v%d failed: %s", self.worker, self.config.model, pull.version, pull.error)

    def wait_ready(self, timeout: float) -> dict:
        """Waits for the running pull to finish; returns ``status()``. Raises TimeoutError after ``timeout``."""
        pull = self._pull
        if pull is None:
            raise errors.InvalidRequest("no pull was started")
        if pull.thread is not None:
            pull.thread.join(timeout)
            if pull.thread.is_alive():
                raise TimeoutError(f"pull of v{pull.version} still running after {timeout} s")
        return self.status()

    def abort(self) -> None:
        """Drops a finished pull (its staging hold is released); the served version is unchanged."""
        with self._lock:
            if self._pull is not None and self._pull.state is PullState.PULLING:
                raise errors.InvalidRequest("cannot abort a pull while its reads are in flight; wait_ready first")
            self._release_pull()

    def _release_pull(self) -> None:
        pull, self._pull = self._pull, None
        if pull is not None:
            self._release_pull_hold(pull)

    # ------------------------------------------------------------------ apply
    def apply(self, timeout: float | None = None) -> ApplyResult:
        """Makes the pulled version the served one, all-or-nothing. The engine must not run a forward pass
        meanwhile (the vLLM extension runs this inside a collective RPC, between engine steps).
        On a failed pull raises it (TransferFailed, ...) with the parameters untouched.
        """
        timeout = self.config.fetch_timeout_s if timeout is None else timeout
        self.wait_ready(timeout)
        preserved = self.client.preserved_bytes  # unpublishing the old version may copy it to CPU (the hub says)
        t0 = time.monotonic()
        with self._lock:
            pull = self._pull
            if pull is None:
                raise errors.InvalidRequest("no pull to apply")
            if pull.state is PullState.FAILED:
                self._release_pull()
                raise pull.error if pull.error is not None else errors.TransferFailed("pull failed")
            if self._pulls_in_place(pull.source_layout) or pull.bucketed:
                self._apply_direct(pull)
            else:
                self._apply_staged(pull)
            stats = pull.stats
            self._pull = None
            stall = time.monotonic() - t0
        result = ApplyResult(worker=self.worker, version=pull.version, applied=True,
                             source_layout=pull.source_layout, stall_s=stall, pull_s=pull.seconds,
                             bytes=getattr(stats, "bytes", 0), sources=dict(getattr(stats, "sources", {}) or {}),
                             phases=dict(self.last_phases), preserved_bytes=self.client.preserved_bytes - preserved,
                             peak_bucket_bytes=getattr(stats, "peak_bucket_bytes", 0))
        logger.info("%s: serving %s v%d (from %s via %s; stall %.3f s, pull %.3f s)", self.worker,
                    self.config.model, pull.version, sorted(result.sources), pull.source_layout, stall,
                    pull.seconds)
        return result

    def _apply_staged(self, pull: _Pull) -> None:
        bufs = pull.buffers
        if bufs is None:
            raise errors.InvalidRequest("pull has no buffers")
        t = time.monotonic()
        self._unpublish_served()  # waits for in-flight reads of the params before they change
        self.last_phases = {"unpublish_old_s": time.monotonic() - t}
        t = time.monotonic()
        try:
            with torch.no_grad():
                if not pull.in_engine_layout:
                    poison(self.params)
                    self._load_hf((n, t) for n, t in bufs.items() if n not in self._skip_hf)
                    refuse_unwritten(self.params, pull.version, list(bufs))
                else:
                    for name, p in self.params.items():
                        p.copy_(bufs[name], non_blocking=True)
                    if any(p.is_cuda for p in self.params.values()):
                        torch.cuda.synchronize()
        except VersionRefused:
            self.broken = True
            raise
        except BaseException as e:
            self.broken = True
            raise EngineStateLost(f"{self.worker}: applying v{pull.version} failed midway ({e!r}); "
                                  f"the shard serves no version until the next successful update") from e
        self.last_phases["copy_in_s"] = time.monotonic() - t
        t = time.monotonic()
        self._release_pull_hold(pull)
        self.last_phases["release_staging_s"] = time.monotonic() - t
        t = time.monotonic()
        if pull.in_engine_layout:
            self._publish_params(pull.version, getattr(pull.stats, "manifest", None))
        else:
            self._publish_off_the_stall(pull.version)
        self.last_phases["publish_s"] = time.monotonic() - t
        self.served = pull.version
        self.broken = False

    def _release_pull_hold(self, pull: _Pull) -> None:
        if pull.held:
            try:
                self.client.unpublish(self.config.model, pull.version, layout=pull.source_layout,
                                      timeout=self.config.unpublish_timeout_s)
            except errors.VersionNotFound:
                pass
            pull.held = False

    def _apply_direct(self, pull: _Pull) -> None:
        self.last_phases = {}
        old = self.served
        self._unpublish_served()
        started = time.monotonic()
        try:
            if pull.bucketed:
                pull.stats = self._load_hf_buckets(pull.version)
            elif pull.source_layout == HF_LAYOUT:
                pull.stats = self._fetch_hf_in_place(pull.version)
            else:
                pull.stats = self._fetch_raw_into_params(pull.version, self.config.layout)
        except Exception as e:  # noqa: BLE001 - any failure after the first byte changed needs the restore
            pull.seconds = time.monotonic() - started
            self._restore(old, e)
            raise
        pull.seconds = time.monotonic() - started
        self.served = pull.version  # the params are registered as the holder of it in the engine's layout
        self.broken = False

    def _fetch_hf_in_place(self, version: int):
        """Reads ``version``'s HF tensors straight into views of the parameters, then holds the parameters in
        the engine's layout too. The caller restores the old version if this raises."""
        targets = self._hf_targets(version)
        if targets is None:
            raise errors.ManifestMismatch(f"v{version}'s HF tensors do not map onto this engine's parameters")
        poison(self.params)  # the views cover every byte: whatever the pull does not write stays NaN
        if self._hf_views.slices:
            # A TP rank reads only its slice of each HF tensor (rows, or a row-parallel weight's columns) and
            # nothing of what it does not use: a TP=N engine reads ~1x the model, not N copies. Holding only
            # parts, it cannot serve 'hf'; its peers read its layout raw instead.
            stats = self.client.fetch_slices(self.config.model, version, into=targets, slices=self._hf_views.slices,
                                             layout=HF_LAYOUT, timeout=self.config.fetch_timeout_s)
        else:
            # hold=True: the parameters also serve this version in 'hf' (to replicas of other layouts, and to
            # peers pulling it right now); ``_unpublish_served`` drops both holdings before they change.
            stats = self.client.fetch(self.config.model, version, into=targets, layout=HF_LAYOUT, hold=True,
                                      timeout=self.config.fetch_timeout_s)
        with torch.no_grad():
            for pad in self._hf_views.padding:
                pad.zero_()  # what vLLM's loader does to the vocab padding rows
        sync_device(self.params.values())
        try:
            refuse_unwritten(self.params, version, list(targets))
        except VersionRefused:
            if not self._hf_views.slices:  # the fetch held the parameters as 'hf': nobody may read them now
                self.client.unpublish(self.config.model, version, layout=HF_LAYOUT,
                                      timeout=self.config.unpublish_timeout_s)
            raise
        self._publish_off_the_stall(version)
        return stats

    def _load_hf_buckets(self, version: int):
        """Loads ``version``'s HF tensors through the engine's loader, bucket by bucket, into the parameters,
        then holds them in the engine's layout. The caller restores the old version if this raises."""
        manifest = self.client.manifest(self.config.model, version, layout=HF_LAYOUT)
        device = next(iter(self.params.values())).device if self.params else torch.device("cpu")
        poison(self.params)
        stats = load_in_buckets(self.client, self.config.model, version, manifest, self._load_hf,
                                bucket_bytes=self.config.bucket_bytes, device=device, skip=self._skip_hf,
                                timeout=self.config.fetch_timeout_s)
        sync_device(self.params.values())
        refuse_unwritten(self.params, version, [s.name for s in manifest.tensors])
        self._publish_off_the_stall(version)
        return stats

    def _restore(self, old: int | None, cause: BaseException) -> None:
        """After a direct pull failed midway: put ``old`` back into the params, or mark the shard broken."""
        self.broken = True
        if old is None:
            if isinstance(cause, VersionRefused):
                raise VersionRefused(f"{self.worker}: {cause} (no earlier version to restore: the shard serves "
                                     f"no version until the next successful update)") from cause
            raise EngineStateLost(f"{self.worker}: direct pull failed midway and no earlier version to restore") \
                from cause
        try:
            layout = self.plan_source_layout(old)
            if self._loads_in_buckets(layout):
                self._load_hf_buckets(old)
            elif layout == HF_LAYOUT:
                self._fetch_hf_in_place(old)
            else:
                self._fetch_raw_into_params(old, layout)
        except errors.TensorHubError as e:
            raise EngineStateLost(f"{self.worker}: direct pull failed midway ({cause!r}) and restoring v{old} "
                                  f"failed too ({e!r})") from cause
        self._join_publisher(self.config.unpublish_timeout_s)  # a failed update ends holding the old version
        self.served = old
        self.broken = False
        logger.warning("%s: direct pull failed midway; restored v%d", self.worker, old)

    # ------------------------------------------------------------------ one-shot + teardown
    def update(self, version: int | str = "latest", timeout: float | None = None, *,
               wait_published: bool = True) -> ApplyResult:
        """``begin_pull`` then ``apply`` (the whole pull is a stall: use the two halves to overlap). With
        ``wait_published`` it returns once the parameters are registered as the holder of the version too."""
        started = self.begin_pull(version)
        if not started.started:  # already served: nothing moved
            return ApplyResult(worker=self.worker, version=started.version, applied=False)
        result = self.apply(timeout)
        if wait_published:
            self.wait_published(timeout)
        return result

    def close(self, timeout: float = 30.0) -> None:
        """Stops holding anything; the parameters may change freely afterwards."""
        with self._lock:
            pull = self._pull
        if pull is not None and pull.thread is not None:
            pull.thread.join(timeout)
        with self._lock:
            if self._pull is not None and self._pull.state is not PullState.PULLING:
                self._release_pull()
            if not self.broken:
                self._unpublish_served()


__all__ = ["EngineHolder", "EngineStateLost", "HolderConfig", "PullState", "VersionRefused"]
