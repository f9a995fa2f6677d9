"""A ring of buffer sets, one per held version, reused from version to version.

A held version's bytes must not change until ``unpublish`` returns (the mutability contract), so a
worker that keeps ``keep`` versions needs ``keep`` buffer sets. Allocating them once and reusing them
also registers each buffer with the transport once, not once per version (NIXL registration is the
expensive part of a first transfer).

Life of a slot::

    acquire() ──> [oldest slot full? unpublish(its version) first] ──> fill ──> commit(slot, v)

The ring knows nothing about verl or the hub: ``unpublish`` is a callable, so the ring is tested alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from tensorhub_verl.errors import ConfigError, VersionNotFound
from tensorhub_verl.ros.wire.manifest import dtype_name

logger = logging.getLogger("tensorhub_verl.verl.staging")


@dataclass(slots=True)
class Slot:
    """One buffer set and the version it holds (None while free or being filled)."""

    index: int
    version: int | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def matches(self, specs: Iterable[tuple[str, tuple[int, ...], str]]) -> bool:
        """Whether the buffers have exactly these names, shapes and dtypes (dtype as in a manifest:
        ``"bfloat16"``); if not, the caller reallocates them."""
        specs = list(specs)
        if len(specs) != len(self.buffers):
            return False
        for name, shape, dtype in specs:
            buf = self.buffers.get(name)
            if buf is None or tuple(buf.shape) != tuple(shape) or dtype_name(buf.dtype) != dtype:
                return False
        return True


class BufferRing:
    """``keep`` slots; acquiring when all are full first unpublishes the oldest held version."""

    def __init__(self, keep: int, unpublish: Callable[[int], None]) -> None:
        if keep < 1:
            raise ConfigError(f"a buffer ring needs keep >= 1, got {keep}")
        self._slots = [Slot(i) for i in range(keep)]
        self._unpublish = unpublish
        self._order: list[int] = []  # slot indices of held versions, oldest first

    @property
    def keep(self) -> int:
        return len(self._slots)

    def held(self) -> dict[int, Slot]:
        """Held versions -> their slot."""
        return {self._slots[i].version: self._slots[i] for i in self._order}

    def get(self, version: int) -> Slot | None:
        return self.held().get(version)

    def acquire(self) -> Slot:
        """A slot free to be filled. If every slot holds a version, the oldest is unpublished first
        (which waits until no read of its bytes is in flight)."""
        for slot in self._slots:
            if slot.version is None and slot.index not in self._order:
                return slot
        oldest = self._slots[self._order[0]]
        self.release(oldest.version)
        return oldest

    def release(self, version: int) -> None:
        """Unpublishes ``version`` and frees its slot (keeping the buffers for reuse)."""
        slot = self.get(version)
        if slot is None:
            raise VersionNotFound(f"the buffer ring holds no version {version}")
        try:
            self._unpublish(version)
        except VersionNotFound:
            # The hub's retention already made the client drop it; that drop waited for the readers too.
            logger.debug("version %d was already released by the hub's retention", version)
        self._order.remove(slot.index)
        slot.version = None

    def commit(self, slot: Slot, version: int) -> None:
        """Marks ``slot`` as holding ``version`` (call after its bytes are complete and published)."""
        if version in self.held():
            raise ConfigError(f"version {version} is already held in slot {self.get(version).index}")
        slot.version = version
        if slot.index in self._order:
            self._order.remove(slot.index)
        self._order.append(slot.index)

    def abandon(self, slot: Slot) -> None:
        """Returns a slot whose fill failed; its buffers are kept but it holds nothing."""
        slot.version = None
        if slot.index in self._order:
            self._order.remove(slot.index)

    def release_all(self) -> None:
        for version in list(self.held()):
            self.release(version)
