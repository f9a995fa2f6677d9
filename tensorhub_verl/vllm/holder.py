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
- Source layout: ``hf`` as the delta from the served version when that delta is published and the ``hf``
  tensors map in place (``Landing.applies_deltas``: only the changes move, checked against the version's
  digests); else the engine's own layout when some other worker holds that version in it (raw one-sided
  reads), else the trainer's ``hf`` layout through the engine's loader. Which holders serve a read is the
  ROS planner's choice.
- A delta is read and applied inside ``apply``, straight into the parameters, whatever ``staging`` says (it is
  small: staging it would cost a model-sized buffer to save a short read); a chunk that fails a check is
  re-read in full, and if even that fails the shard restores the old version in full, as for any direct pull
  that failed midway: it never serves a half-applied version.
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

import logging
import os
import threading
import time
from collections.abc import Mapping

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT
from tensorhub_verl.settings import SOURCE_LAYOUT_ENV
from tensorhub_verl.vllm.holder_config import EngineStateLost, HolderConfig, LoadHF
from tensorhub_verl.vllm.landing import Landing
from tensorhub_verl.vllm.layout import HFViews
from tensorhub_verl.vllm.pull import Pull, PullState
from tensorhub_verl.vllm.registration import Registration
from tensorhub_verl.vllm.results import ApplyResult, DeltaOutcome, HolderStatus, PullStart, PullStatus
from tensorhub_verl.vllm.staging import Staging
from tensorhub_verl.vllm.verify import VersionRefused

logger = logging.getLogger("tensorhub_verl.vllm.holder")


class EngineHolder:
    """Holder and updater of one engine shard. Thread-safe: one pull at a time, ``apply`` serialized.

    It owns which version the parameters serve (``served``, ``broken``) and the one running pull; its parts own
    the rest: ``Staging`` (buffers besides the parameters), ``Landing`` (how bytes land: raw, 'hf' in place,
    in buckets, through staging), ``Registration`` (the parameters' publication as a holder)."""

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
        device = next(iter(self.params.values())).device if self.params else torch.device("cpu")
        self._staging = Staging(config.staging, device, staging_device)
        self._landing = Landing(client, config, self.params, load_hf, self._staging, hf_views, tuple(skip_hf))
        self._registration = Registration(client, config, self.params)
        self._lock = threading.RLock()
        self._pull: Pull | None = None
        self.served: int | None = None
        self.broken = False
        self.last_phases: dict[str, float] = {}
        self._dcs: dict[str, str | None] = {}
        """Worker id -> its datacenter label, as the hub reported it (for ``ApplyResult.wan_bytes``)."""
        """Seconds of each phase of the last apply (for benchmarks)."""

    # ------------------------------------------------------------------ queries
    @property
    def worker(self) -> str:
        return self.client.worker

    def status(self) -> HolderStatus:
        """What this shard serves and pulls (it crosses vLLM's RPC boundary: ``HolderStatus.from_wire``)."""
        with self._lock:
            p = self._pull
            pull = None if p is None else PullStatus(version=p.version, state=p.state.value,
                                                     source_layout=p.source_layout,
                                                     error=None if p.error is None else repr(p.error),
                                                     check_failed=isinstance(p.error, errors.DigestMismatch))
            return HolderStatus(worker=self.worker, layout=self.config.layout, served=self.served,
                                broken=self.broken, staging=self.config.staging, extra_bytes=self.extra_bytes,
                                pinned_staging=self.pinned_staging, publishing=self._registration.publishing,
                                pull=pull)

    def newest_version(self) -> int | None:
        """Newest version of the model in any layout."""
        return max(self.client.versions(self.config.model), default=None)

    def plan_source_layout(self, version: int) -> str:
        """``hf`` when a delta from the served version to ``version`` will be applied (``_delta_base``), else the
        engine's layout when another worker holds ``version`` in it, else ``hf`` (always ``hf`` when
        ``$TENSORHUB_SOURCE_LAYOUT`` is ``hf``: ``attach-vllm --source-layout hf``)."""
        if self._delta_base(version) is not None:
            return HF_LAYOUT
        return self._full_source_layout(version)

    def _full_source_layout(self, version: int) -> str:
        raw = self.client.versions(self.config.model, layout=self.config.layout).get(version, [])
        if any(h != self.worker for h in raw) and os.environ.get(SOURCE_LAYOUT_ENV) != HF_LAYOUT:
            return self.config.layout
        if version in self.client.versions(self.config.model, layout=HF_LAYOUT):
            return HF_LAYOUT
        raise errors.VersionNotFound(f"no worker holds {self.config.model} v{version} in {self.config.layout!r} "
                                     f"or 'hf'")

    def _delta_base(self, version: int) -> int | None:
        """The served version, when ``version`` will land as the delta from it: the shard serves a whole,
        verified version, its 'hf' tensors map in place, and that delta is published."""
        base = self.served
        if base is None or self.broken or base >= version or not self._landing.applies_deltas:
            return None
        try:
            return base if self._landing.delta_published(version, base) else None
        except errors.VersionNotFound:
            return None

    def hf_digests(self) -> dict:
        """``{"version", "digests": {hf_name: digest}, "unused": [...]}`` of the served weights, read through the
        HF views (``integrity.tensor_digests``), to compare end to end with what the trainer published."""
        with self._lock:
            return {"version": self.served, **self._landing.hf_digests()}

    @property
    def maps_hf_in_place(self) -> bool:
        """'hf' versions land straight in the parameters (else they go through the engine's loader in buckets)."""
        return self._landing.maps_hf_in_place

    @property
    def extra_bytes(self) -> int:
        """Bytes this shard holds besides its parameters (staging buffers and scratch), for memory reports."""
        return self._staging.extra_bytes

    @property
    def pinned_staging(self) -> bool:
        return self._staging.pinned

    # ------------------------------------------------------------------ registration of the parameters
    def publish_served(self, version: int) -> None:
        """Declares that the parameters now hold ``version`` (e.g. kept through a sleep) and registers them."""
        with self._lock:
            if self._pull is not None and self._pull.state is PullState.PULLING:
                raise errors.InvalidRequest("a pull is running; wait for it or abort it first")
            self._unpublish_served()
            self._registration.publish(version)
            self.served = version
            self.broken = False

    def wait_published(self, timeout: float | None = None) -> bool:
        """Waits for the publication ``apply`` left running. True when the parameters are registered as the
        holder of ``served`` (False after a failed publication, or when nothing is served)."""
        self._registration.join(self.config.unpublish_timeout_s if timeout is None else timeout)
        return self.served is not None and self._registration.error is None

    def _unpublish_served(self) -> None:
        self._registration.unpublish(self.served)
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
            have = self._delta_base(v)
            pull = Pull(version=v, source_layout=HF_LAYOUT if have is not None else self._full_source_layout(v),
                        have=have)
            self._pull = pull
            landing = self._landing
            if pull.have is not None or landing.lands_in_place(pull.source_layout) \
                    or landing.loads_in_buckets(pull.source_layout):
                pull.bucketed = landing.loads_in_buckets(pull.source_layout)
                pull.state = PullState.READY  # the pull runs inside apply, straight into the params
                self._refuse_other_dtype(pull)
                return PullStart(version=v, source_layout=pull.source_layout, started=True)
            pull.thread = threading.Thread(target=self._run_pull, args=(pull,), daemon=True,
                                           name=f"tensorhub-pull-{self.config.model}-v{v}")
            pull.thread.start()
            return PullStart(version=v, source_layout=pull.source_layout, started=True)

    def _refuse_other_dtype(self, pull: Pull) -> None:
        """An in-place 'hf' pull whose version has the parameters' shapes in another dtype fails here, before the
        served version is unpublished or a byte moves: the pull is FAILED with the ``DtypeMismatch``."""
        if pull.source_layout != HF_LAYOUT:
            return
        keeps = "its initial weights" if self.served is None else f"v{self.served}"
        refusal = self._landing.dtype_refusal(pull.version, keeps)
        if refusal is not None:
            pull.error, pull.state = refusal, PullState.FAILED
            logger.error("%s", refusal)

    def _run_pull(self, pull: Pull) -> None:
        """The pull thread: reads the version into staging from its planned layout, falling back to 'hf'."""
        layouts = [pull.source_layout] + ([HF_LAYOUT] if pull.source_layout != HF_LAYOUT else [])
        for i, layout in enumerate(layouts):
            if self._landing.loads_in_buckets(layout):
                with self._lock:  # apply loads it in buckets: nothing to stage
                    pull.source_layout, pull.bucketed, pull.error = layout, True, None
                    pull.finish(PullState.READY)
                return
            try:
                staged = self._landing.stage(pull.version, layout)
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
                    pull.source_layout, pull.stats, pull.buffers = layout, staged.stats, staged.buffers
                    pull.held, pull.in_engine_layout, pull.error = staged.held, staged.in_engine_layout, None
                    pull.finish(PullState.READY)
                return
            break
        with self._lock:
            pull.finish(PullState.FAILED)
        logger.warning("%s: pull of %s v%d failed: %s", self.worker, self.config.model, pull.version, pull.error)

    def wait_ready(self, timeout: float) -> HolderStatus:
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

    def _release_pull_hold(self, pull: Pull) -> None:
        if pull.held:
            try:
                self.client.unpublish(self.config.model, pull.version, layout=pull.source_layout,
                                      timeout=self.config.unpublish_timeout_s)
            except errors.VersionNotFound:
                pass
            pull.held = False

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
            if self._landing.lands_in_place(pull.source_layout) or pull.bucketed or pull.have is not None:
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
                             peak_bucket_bytes=getattr(stats, "peak_bucket_bytes", 0),
                             delta=None if getattr(stats, "delta", None) is None else DeltaOutcome.of(stats.delta),
                             dc=self.client.location.as_dict().get("dc"))
        result.wan_bytes = self._wan_bytes(result.sources, result.dc)
        logger.info("%s: serving %s v%d (from %s via %s; stall %.3f s, pull %.3f s)", self.worker,
                    self.config.model, pull.version, sorted(result.sources), pull.source_layout, stall,
                    pull.seconds)
        return result

    def _wan_bytes(self, sources: Mapping[str, int], dc: str | None) -> int:
        """Bytes of ``sources`` read from workers of another datacenter (their labels from the hub, cached:
        a worker's location does not change)."""
        if dc is None or not sources:
            return 0
        unknown = [w for w in sources if _base_worker(w) not in self._dcs]
        if unknown:
            try:
                for worker, info in self.client.status().get("workers", {}).items():
                    self._dcs[worker] = (info.get("location") or {}).get("dc")
            except errors.TensorHubError as e:
                logger.debug("%s: no worker locations from the hub (%s): WAN bytes not counted", self.worker, e)
                return 0
        return sum(n for w, n in sources.items() if self._dcs.get(_base_worker(w)) not in (None, dc))

    def _apply_staged(self, pull: Pull) -> None:
        bufs = pull.buffers
        if bufs is None:
            raise errors.InvalidRequest("pull has no buffers")
        t = time.monotonic()
        self._unpublish_served()  # waits for in-flight reads of the params before they change
        self.last_phases = {"unpublish_old_s": time.monotonic() - t}
        t = time.monotonic()
        try:
            self._landing.from_staging(pull.version, bufs, pull.in_engine_layout)
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
            self._registration.publish(pull.version, getattr(pull.stats, "manifest", None))
        else:
            self._registration.publish_off_the_stall(pull.version)
        self.last_phases["publish_s"] = time.monotonic() - t
        self.served = pull.version
        self.broken = False

    def _apply_direct(self, pull: Pull) -> None:
        self.last_phases = {}
        old = self.served
        self._unpublish_served()
        started = time.monotonic()
        try:
            pull.stats = self._land_directly(pull.version, pull.source_layout, pull.have)
        except Exception as e:  # noqa: BLE001 - any failure after the first byte changed needs the restore
            pull.seconds = time.monotonic() - started
            self._restore(old, e)
            raise
        pull.seconds = time.monotonic() - started
        self.served = pull.version  # the params are registered as the holder of it in the engine's layout
        self.broken = False

    def _land_directly(self, version: int, layout: str, have: int | None = None):
        """Writes ``version`` from ``layout`` straight into the parameters and registers them as its holder:
        after a raw read at once (at TP=1 the fetch itself held them), after 'hf' off the stall (one digest pass
        in the engine's layout). The caller restores the old version if this raises."""
        landing = self._landing
        if landing.loads_in_buckets(layout):
            stats = landing.hf_in_buckets(version)
        elif layout == HF_LAYOUT:
            stats = landing.hf_in_place(version, have)
        else:
            stats = landing.raw_into_params(version, layout)
            if self.config.shard_count > 1:
                self._registration.publish(version, getattr(stats, "manifest", None))
            return stats
        self._registration.publish_off_the_stall(version)
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
            self._land_directly(old, self.plan_source_layout(old))
        except errors.TensorHubError as e:
            raise EngineStateLost(f"{self.worker}: direct pull failed midway ({cause!r}) and restoring v{old} "
                                  f"failed too ({e!r})") from cause
        self._registration.join(self.config.unpublish_timeout_s)  # a failed update ends holding the old version
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


def _base_worker(source: str) -> str:
    """A source's registered worker id: a CPU archive (``<id>~cpu``) or relay copy (``<id>~relay``) is its
    worker's."""
    return source.split("~", 1)[0]


__all__ = ["EngineHolder", "EngineStateLost", "HolderConfig", "LoadHF", "PullState"]
