"""The data-plane seam: register memory once, read remote memory one-sided. NIXL (nixl.py) and
plain TCP streams (tcp.py) implement it; registry.py picks one.

Kept narrow so the fetch loop can be tested against any implementation of the same Protocol.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True, slots=True)
class Region:
    """A contiguous span of memory: DRAM (device 0) or VRAM on CUDA device ``device``."""

    addr: int
    nbytes: int
    device: int
    mem: str  # "DRAM" | "VRAM"

    @classmethod
    def of_tensor(cls, tensor: torch.Tensor) -> "Region":
        cuda = tensor.device.type == "cuda"
        return cls(tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                   tensor.device.index or 0 if cuda else 0, "VRAM" if cuda else "DRAM")


@dataclass(frozen=True, slots=True)
class Copy:
    """``length`` bytes from ``remote_addr`` on the peer into ``local_addr`` here."""

    local_addr: int
    local_device: int
    local_mem: str
    remote_addr: int
    remote_device: int
    remote_mem: str
    length: int


@runtime_checkable
class Transport(Protocol):
    agent_name: str
    lands_on_own_threads: bool
    """True when reads land on the transport's own threads (TCP), which then set a read's ``wake`` event when it
    finishes and hash its bytes as they land, when asked (``landed_digest``). False (NIXL): the fetch loop
    polls every ``poll_interval_s`` and hashes a landed chunk itself."""

    def register(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Makes the tensors' memory readable by peers. Returns True when new memory was registered
        (the agent metadata changed and must be re-sent to the hub). Each buffer is registered once."""

    def unregister(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stops serving the tensors' memory: called once an unpublish drained every read of it, so a grant
        the hub signed earlier cannot read it afterwards. A plane whose reads need no grant may keep the
        registration (NIXL: its metadata reaches only leaseholders, and re-registering changes it)."""

    def metadata(self) -> bytes:
        """What a peer needs to read this agent's registered memory."""

    def load_peer(self, agent_name: str, metadata: bytes) -> None:
        """Learns (or refreshes) a peer's metadata. Raises ReadError when it is unusable."""

    def start_read(self, peer: str, copies: list[Copy], grant: str = "",
                   granted: Sequence[tuple[int, int]] = (), *, wake: threading.Event | None = None,
                   digest: bool = False) -> object:
        """Posts a one-sided READ of all copies; returns a handle for ``poll``. Raises ReadError.
        ``grant`` is the hub's proof of the lease (grants.py), for a data plane whose holder checks reads;
        ``granted``: the exact remote (address, length) ranges it signs, when the copies read only parts of
        them (a ranged read); empty: the copies' ranges are the granted ones. ``wake`` and ``digest``: see
        ``lands_on_own_threads`` (ignored where it is False)."""

    def poll(self, handle: object) -> str:
        """'DONE', 'PROC' (in progress) or 'ERR'."""

    def landed_digest(self, handle: object) -> str | None:
        """The digest (integrity.py) of a 'DONE' read's bytes, in copy order, hashed as they landed, when the read
        was started with ``digest=True`` and the transport lands on its own threads; otherwise None."""

    def release(self, handle: object) -> None:
        """Frees the handle; cancels the read if it is still in progress."""

    def close(self) -> None: ...


class ReadError(Exception):
    """A read could not be posted or failed (peer gone, memory not registered)."""
