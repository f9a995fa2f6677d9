"""Trainer side: turn verl's per-tensor generator into a published, held version.

verl's training engines export weights as a generator of ``(hf_name, full_tensor)``; for FSDP each
full tensor is gathered on the fly and freed when the generator moves on. What is published must stay
unchanged until unpublished, so each version lives in one slot of a ``BufferRing``:

- ``staging='none'``: the slot keeps the yielded tensors themselves. No extra copy; valid only when the
  engine yields fresh tensors (a tensor that aliases a live parameter would change under readers at the
  next optimizer step: detected, see ``_check_no_alias``).
- ``staging='cpu'`` / ``'gpu'``: each tensor is copied into the slot's buffer, allocated at the first
  version and reused (so the transport registers it once). CPU buffers are pinned where CUDA is present;
  GPU staging keeps one slot (``GPU_STAGING_VERSIONS``), whatever ``keep`` says.

With a ``dtype`` (the rollout's, ``dtypes.published_dtype``) every floating-point tensor is cast as it is
staged, so the version is published in the bytes the engines serve. A cast is a copy: with ``staging='none'``
it lands in slot buffers on the tensor's own device, allocated once and reused like the other modes'.

Deltas (``delta`` 'auto' or 'on', docs/deltas.md): when version N is published while the ring still holds N-1
(``keep`` >= 2), the publisher also publishes the delta N-1 -> N from the two slots, where their bytes live (a
row-shard publisher diffs only its own rows: nothing is gathered). A refused delta (no base, no digests) only
costs the readers a full read; it never fails the version.

A model with tied embeddings (``begin(..., tie_word_embeddings=True)``) yields its embedding twice, as
``model.embed_tokens.weight`` and as ``lm_head.weight``. The head is left out of the version, as a checkpoint leaves
it out, when it is the embedding (``hf_names.repeated_head``): the same tensor, or, from one publisher of whole
tensors, the same bytes once cast. It is then neither staged nor published, so neither full versions nor deltas
carry those bytes twice; engines serve the embedding as the head. A head that differs is published as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from tensorhub_verl.errors import ConfigError, DeltaRefused, InvalidRequest
from tensorhub_verl.hf_names import EMBEDDING, TIED_HEAD, memory_key, repeated_head
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT
from tensorhub_verl.settings import STAGING_CHOICES
from tensorhub_verl.verl.digest import DIGEST_KEY
from tensorhub_verl.verl.dtypes import published_dtype
from tensorhub_verl.verl.staging import BufferRing, Slot

logger = logging.getLogger("tensorhub_verl.verl.publisher")

GPU_STAGING_VERSIONS = 1
"""Versions a trainer rank holds in GPU staging, whatever ``keep_versions`` says."""


@dataclass(slots=True)
class PublishStats:
    version: int
    bytes: int = 0
    tensors: int = 0
    stage_s: float = 0.0
    """Time spent consuming the generator and copying into staging buffers."""
    publish_s: float = 0.0
    """Time of the hub registration (and of the unpublish of the version the slot held before)."""
    digests: dict[str, str] | None = None
    """``tensor_digests`` of the published tensors (only with ``verify_digests``)."""
    delta_bytes: int = 0
    """Bytes of the delta from the previous version this rank published beside it (0: none published)."""
    delta_s: float = 0.0
    """Time spent encoding and publishing that delta."""
    delta_reason: str = ""
    """Why no delta was published although the previous version was held (empty otherwise)."""
    left_out: tuple[str, ...] = ()
    """Tensors the version does not carry because they repeat another one (a tied ``lm_head.weight``)."""

    def as_metrics(self) -> dict[str, float | dict]:
        out: dict[str, float | dict] = {"tensorhub/publish_bytes": float(self.bytes),
                                       "tensorhub/publish_stage_s": self.stage_s, "tensorhub/publish_s": self.publish_s,
                                       "tensorhub/publish_delta_bytes": float(self.delta_bytes),
                                       "tensorhub/publish_delta_s": self.delta_s}
        if self.digests is not None:
            out[DIGEST_KEY] = self.digests  # the updater takes it out before verl sees the metrics
        return out


@dataclass(slots=True)
class _Fill:
    slot: Slot
    version: int
    seen: dict[str, torch.Tensor] = field(default_factory=dict)
    started: float = 0.0
    tie_word_embeddings: bool = False
    embedding_key: tuple | None = None
    """``hf_names.memory_key`` of the embedding as yielded (before staging copies or casts it)."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Name -> bytes of each yielded tensor the version does not carry."""


class Publisher:
    """Publishes versions through ``client`` (a ``tensorhub_verl`` Client), holding ``keep`` at once."""

    def __init__(self, client, *, model: str, keep: int, staging: str, chunk_bytes: int,
                 unpublish_timeout_s: float, verify_digests: bool = False,
                 shard: tuple[int, int] | None = None, dtype: torch.dtype | None = None,
                 delta: str = "off") -> None:
        if staging not in STAGING_CHOICES:
            raise ConfigError(f"staging must be one of {STAGING_CHOICES}, got {staging!r}")
        if staging == "gpu" and not torch.cuda.is_available():
            raise ConfigError("tensorhub.staging='gpu' needs a CUDA device on the trainer; use 'cpu' or 'none'")
        self._client = client
        self._model = model
        self._staging = staging
        self._chunk_bytes = chunk_bytes
        self._unpublish_timeout_s = unpublish_timeout_s
        self._verify_digests = verify_digests
        if staging == "gpu" and keep > GPU_STAGING_VERSIONS:
            # A version of a 32B model on 4 ranks is 16 GB per rank in bf16: two would not fit beside training on
            # an 80 GB GPU. Older versions stay readable from the rollouts that hold them.
            logger.info("staging='gpu': holding %d version on the GPU (keep_versions=%d applies to CPU staging)",
                        GPU_STAGING_VERSIONS, keep)
            keep = GPU_STAGING_VERSIONS
        self._ring = BufferRing(keep, self._unpublish)
        self._fill: _Fill | None = None
        self._pin = staging == "cpu" and torch.cuda.is_available()
        self._shard = shard
        """(rank, ranks) when this rank publishes only its rows of each tensor (``Client.publish_shard``)."""
        self.dtype = dtype
        """The dtype floating-point tensors are published in (the rollout's); None: their own."""
        self.delta = delta
        """'auto' | 'on': publish the delta from the previous held version beside each version; 'off': never."""
        self._told_left_out = False

    @property
    def held_versions(self) -> list[int]:
        return sorted(self._ring.held())

    def _unpublish(self, version: int) -> None:
        # Every layout of the version this rank holds: 'hf' and the delta form published beside it.
        self._client.unpublish(self._model, version, layout=None, timeout=self._unpublish_timeout_s)

    def begin(self, version: int, *, tie_word_embeddings: bool = False) -> None:
        """Starts a version. May block while the oldest held version drains (bounded by unpublish_timeout_s).
        ``tie_word_embeddings``: the model's config ties its head to its embedding (the head may be left out)."""
        if self._fill is not None:
            raise InvalidRequest(f"version {self._fill.version} is still being published; finish or abort it first")
        if version in self._ring.held():
            raise InvalidRequest(f"version {version} of {self._model!r} is already published by this trainer")
        started = time.monotonic()
        slot = self._ring.acquire()
        self._fill = _Fill(slot=slot, version=version, started=started, tie_word_embeddings=tie_word_embeddings)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Stages one tensor of the version being published."""
        fill = self._require_fill()
        if name in fill.seen or name in fill.left_out:
            raise InvalidRequest(f"tensor {name!r} was yielded twice for version {fill.version}")
        if self._staging == "none" and isinstance(tensor, torch.nn.Parameter):
            raise ConfigError(f"tensorhub.staging='none' but {name!r} is a live nn.Parameter: the optimizer would "
                              f"change it under readers. Use tensorhub.staging=cpu or gpu.")
        if name == EMBEDDING:
            fill.embedding_key = memory_key(tensor)
        elif name == TIED_HEAD and fill.tie_word_embeddings and self._repeats_embedding(fill, tensor):
            fill.left_out[name] = tensor.numel() * published_dtype(tensor.dtype, self.dtype).itemsize
            return
        tensor = tensor.detach()
        dtype = published_dtype(tensor.dtype, self.dtype)
        if self._staging == "none" and dtype == tensor.dtype:
            fill.seen[name] = tensor if tensor.is_contiguous() else tensor.contiguous()
            return
        buf = fill.slot.buffers.get(name)
        device = tensor.device if self._staging in ("gpu", "none") else torch.device("cpu")
        if buf is None or buf.shape != tensor.shape or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(tensor.shape, dtype=dtype, device=device, pin_memory=self._pin)
        # non_blocking: device->pinned-host copies overlap with the next gather; finish() synchronizes.
        # copy_ casts on the way (fp32 -> bf16 rounds to nearest even, as Tensor.to does).
        buf.copy_(tensor, non_blocking=tensor.is_cuda)
        fill.seen[name] = buf

    def _repeats_embedding(self, fill: _Fill, head: torch.Tensor) -> bool:
        same_memory = memory_key(head) == fill.embedding_key
        if not same_memory and torch.cuda.is_available():
            torch.cuda.synchronize()  # the staged embedding's copy from the device has landed before it is compared
        return repeated_head(head, fill.seen.get(EMBEDDING), ties=True, same_memory=same_memory,
                             compare_bytes=self._shard is None)

    def finish(self, specs: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None) -> PublishStats:
        """Publishes the staged version and holds it. Returns what it cost. A shard publisher passes the full
        tensors' ``specs`` (its staged tensors are only its rows of them)."""
        fill = self._require_fill()
        try:
            if not fill.seen:
                raise InvalidRequest(f"version {fill.version}: the weight generator yielded no tensors")
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # every staged copy has landed before anyone may read it
            if self._staging == "none":
                self._check_no_alias(fill)
            staged = time.monotonic()
            fill.slot.buffers = fill.seen  # drops buffers of tensors that no longer exist
            if self._shard is None:
                self._client.publish(self._model, fill.version, fill.slot.buffers, layout=HF_LAYOUT,
                                     chunk_bytes=self._chunk_bytes)
            else:
                if specs is None:
                    raise InvalidRequest("a shard publisher needs the full tensors' specs to finish a version")
                rank, ranks = self._shard
                specs = {name: spec for name, spec in specs.items() if name not in fill.left_out}
                self._client.publish_shard(self._model, fill.version, fill.slot.buffers, specs=specs, rank=rank,
                                           ranks=ranks, layout=HF_LAYOUT, group="trainer",
                                           chunk_bytes=self._chunk_bytes)
            self._ring.commit(fill.slot, fill.version)
        except BaseException:
            self.abort()
            raise
        self._fill = None
        stats = PublishStats(version=fill.version, tensors=len(fill.seen),
                             bytes=sum(t.numel() * t.element_size() for t in fill.seen.values()),
                             stage_s=staged - fill.started, publish_s=time.monotonic() - staged,
                             digests=tensor_digests(fill.seen) if self._verify_digests else None,
                             left_out=tuple(fill.left_out))
        self._tell_left_out(fill)
        self._publish_delta(stats)
        logger.info("published %s v%d: %d tensors, %d bytes%s (staging=%s, stage %.3fs, publish %.3fs)",
                    self._model, stats.version, stats.tensors, stats.bytes,
                    "" if self._shard is None else f" (rank {self._shard[0]} of {self._shard[1]}'s rows)",
                    self._staging, stats.stage_s, stats.publish_s)
        return stats

    def _tell_left_out(self, fill: _Fill) -> None:
        if fill.left_out and not self._told_left_out:
            self._told_left_out = True
            logger.info("%s v%d: left out %s (%d bytes%s): the model ties it to %s, whose bytes it repeats; "
                        "engines serve the embedding in its place (logged once)", self._model, fill.version,
                        ", ".join(fill.left_out), sum(fill.left_out.values()),
                        "" if self._shard is None else " of this rank's rows", EMBEDDING)

    def _publish_delta(self, stats: PublishStats) -> None:
        """The delta from the newest older version still held to ``stats.version`` (no chains: only from the
        version right before it, the one an engine that applied every update serves)."""
        base = stats.version - 1
        if self.delta == "off" or base not in self._ring.held():
            return
        started = time.monotonic()
        try:
            published = self._client.publish_delta(self._model, stats.version, base, layout=HF_LAYOUT,
                                                   mode=self.delta)
        except DeltaRefused as e:
            stats.delta_reason = str(e)
            logger.warning("%s v%d: no delta from v%d (%s); readers read it in full", self._model, stats.version,
                           base, e)
        else:
            stats.delta_bytes = published.bytes if published.published else 0
            stats.delta_reason = published.reason
        stats.delta_s = time.monotonic() - started

    def abort(self) -> None:
        """Drops a version whose generator failed; nothing of it was published."""
        if self._fill is not None:
            if self._staging == "none":
                self._fill.slot.buffers = {}
            self._ring.abandon(self._fill.slot)
            self._fill = None

    def close(self) -> None:
        self.abort()
        self._ring.release_all()

    def _require_fill(self) -> _Fill:
        if self._fill is None:
            raise InvalidRequest("no version is being published; call begin(version) first")
        return self._fill

    def _check_no_alias(self, fill: _Fill) -> None:
        """With staging='none', a yielded tensor sharing storage with a still-held version means the
        engine yields live parameters: their bytes change under readers. Refuse instead of serving
        torn weights."""
        held_ptrs = {t.untyped_storage().data_ptr(): (v, name)
                     for v, slot in self._ring.held().items() for name, t in slot.buffers.items()}
        for name, t in fill.seen.items():
            hit = held_ptrs.get(t.untyped_storage().data_ptr())
            if hit is not None:
                raise ConfigError(
                    f"tensorhub.staging='none' but tensor {name!r} of version {fill.version} shares memory with "
                    f"{hit[1]!r} of held version {hit[0]}: this engine yields live parameters. "
                    f"Use tensorhub.staging=cpu or gpu.")
