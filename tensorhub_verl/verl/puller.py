"""Rollout side: pull a version into HF-layout buffers, hold it for peers, hand it to the engine.

Until the vLLM integration (``tensorhub_verl.vllm``) makes the engine's own parameters a holder, a
rollout worker pulls the trainer's ``hf`` layout into buffers of its own (one ``BufferRing`` slot per
kept version) and gives them to verl's server adapter exactly as verl's other backends give received
weights: as ``(name, tensor)`` pairs for the engine's ``load_weights``. Once pulled, the worker holds the
version, so later readers (new replicas, slower peers) read from it instead of from the trainer.

The pull happens while the engine keeps generating; only the apply pauses it (see ``updater``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator

import torch

from tensorhub_verl.errors import ConfigError, VersionNotFound
from tensorhub_verl.verl.digest import weights_digest
from tensorhub_verl.verl.staging import BufferRing

logger = logging.getLogger("tensorhub_verl.verl.puller")


@dataclass(slots=True)
class PullResult:
    """What one rollout worker's pull of one version cost (sent back to the updater through Ray)."""

    worker: str
    version: int
    bytes: int = 0
    seconds: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)
    """Source worker id -> bytes read from it."""
    reused: bool = False
    """The version was already held here: nothing moved."""
    digest: str | None = None
    """``weights_digest`` of the held buffers (only with ``verify_digests``)."""


class Puller:
    """Pulls versions through ``client`` into ``keep`` reusable buffer sets on ``device``."""

    def __init__(self, client, *, model: str, keep: int, device: str, fetch_timeout_s: float,
                 unpublish_timeout_s: float, verify_digests: bool = False) -> None:
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"rollout staging device must be 'cpu' or 'cuda', got {device!r}")
        self._client = client
        self._model = model
        self._device = device
        self._fetch_timeout_s = fetch_timeout_s
        self._unpublish_timeout_s = unpublish_timeout_s
        self._verify_digests = verify_digests
        self._ring = BufferRing(keep, self._unpublish)

    @property
    def held_versions(self) -> list[int]:
        return sorted(self._ring.held())

    def _unpublish(self, version: int) -> None:
        self._client.unpublish(self._model, version, layout="hf", timeout=self._unpublish_timeout_s)

    def pull(self, version: int | str) -> PullResult:
        """Fetches ``version`` ("latest" resolves once) unless already held; holds it afterwards."""
        manifest = self._client.manifest(self._model, version, layout="hf")
        resolved = manifest.version
        held = self._ring.get(resolved)
        if held is not None:
            return PullResult(worker=self._client.worker, version=resolved, reused=True,
                              digest=weights_digest(held.buffers) if self._verify_digests else None)
        slot = self._ring.acquire()
        specs = [(t.name, tuple(t.shape), t.dtype) for t in manifest.tensors]
        if not slot.matches(specs):
            slot.buffers = manifest.allocate(device=self._device)
        try:
            stats = self._client.fetch(self._model, resolved, into=slot.buffers, layout="hf", hold=True,
                                       timeout=self._fetch_timeout_s)
        except BaseException:
            # A failed fetch leaves the buffers unusable and unheld; the engine never saw them.
            self._ring.abandon(slot)
            raise
        self._ring.commit(slot, resolved)
        logger.info("%s pulled %s v%d: %d bytes in %.3fs from %s", self._client.worker, self._model, resolved,
                    stats.bytes, stats.seconds, dict(stats.sources))
        return PullResult(worker=self._client.worker, version=resolved, bytes=stats.bytes, seconds=stats.seconds,
                          sources=dict(stats.sources),
                          digest=weights_digest(slot.buffers) if self._verify_digests else None)

    def weights(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """The held buffers of ``version`` as ``(name, tensor)``; the engine's loader must only read them."""
        slot = self._ring.get(version)
        if slot is None:
            raise VersionNotFound(f"{self._client.worker} holds no version {version} of {self._model!r}; "
                                  f"held: {self.held_versions}")
        yield from slot.buffers.items()

    def close(self) -> None:
        self._ring.release_all()
