"""The data-plane seam: register memory once, read remote memory one-sided. NIXL (nixl.py) and
plain TCP streams (tcp.py) implement it; factory.py creates one by name.

Planes differ in what they can do, and say so in capabilities the caller reads, never by arguments one of
them ignores:

- ``needs_grant``: the holder's side checks each read against a grant the hub signed for the lease (TCP: its
  server answers whoever connects). Such a plane has a ``grant_key``, given to the hub at registration only;
  every read then carries a ``Grant``. A plane without it (NIXL) gets no grant: a reader can address only
  memory whose metadata the hub handed it with a lease.
- ``lands_on_own_threads``: reads land on the plane's own threads, which set the read's ``wake`` event when it
  finishes. Without it the fetch loop polls every read.
- ``preconnect_peers``: how many likely sources the hub should name at registration so that the plane
  connects to them before the first fetch (0: none).
- ``reports_progress``: ``landed_bytes`` says how many of a read's bytes landed so far, in copy order, while it
  is in flight (TCP: its stream receives them in order). Without it, what a read in flight or a failed read
  landed is unknown (NIXL: UCX completes a transfer as a whole). A fetch posts a run of chunks as one read of
  their merged ranges (``run_reads.py``) and checks each chunk's digest once its bytes are in.
- ``max_copies``: most copies one read may carry (0: no limit); a longer run is posted as several reads.
- ``in_order_reads``: ``start_read(..., in_order=True)`` queues the read behind the previous in-order read to
  the same peer, on one connection: its bytes follow that read's on the wire with no gap, so reads posted
  together neither share the link nor leave it idle between them (TCP: one stream, the next request sent ahead
  of the reply). Without it, reads posted together may move at once and share the link (NIXL).

``start_read`` owns the checks that tie these together; each plane implements ``_start_read``.
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, Iterable, Sequence, TypeVar

import torch

from tensorhub_verl.errors import TensorHubError
from tensorhub_verl.ros.planes import grants


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


@dataclass(frozen=True, slots=True)
class Grant:
    """The hub's proof of a lease (grants.py), for a plane that ``needs_grant``: ``token`` as the hub signed
    it, over ``ranges``, the exact remote (address, length) ranges it signs when the copies read only parts of
    them (a run of chunks, a ranged read); empty: the copies' own ranges are the signed ones."""

    token: str
    ranges: tuple[tuple[int, int], ...] = ()


class ReadState(enum.Enum):
    IN_PROGRESS = "PROC"
    DONE = "DONE"
    FAILED = "ERR"


class ReadError(TensorHubError):
    """A read could not be posted or failed (peer gone, memory not registered, metadata unusable): the
    fetch reads that chunk from another source."""


class ReadHandle:
    """One posted read. Each plane subclasses it with what it needs to poll and cancel the read."""

    __slots__ = ()


H = TypeVar("H", bound=ReadHandle)


class DataPlane(ABC, Generic[H]):
    """One process's endpoint of a data plane: serves its registered memory, reads peers' memory."""

    name: str = ""
    """Its name in the factory (``factory.plane_names()``): what the worker declares to the hub at registration."""
    needs_grant: bool = False
    lands_on_own_threads: bool = False
    preconnect_peers: int = 0
    reports_progress: bool = False
    max_copies: int = 0
    in_order_reads: bool = False

    def __init__(self, agent_name: str):
        self.agent_name = agent_name
        self.grant_key: bytes | None = grants.new_key() if self.needs_grant else None
        """The key the hub signs this plane's grants with; given to the hub at registration, to nobody else."""

    @abstractmethod
    def register(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Makes the tensors' memory readable by peers. Returns True when new memory was registered
        (the agent metadata changed and must be re-sent to the hub). Each buffer is registered once."""

    @abstractmethod
    def unregister(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stops serving the tensors' memory: called once an unpublish drained every read of it, so a grant
        the hub signed earlier cannot read it afterwards. A plane whose reads need no grant may keep the
        registration (NIXL: its metadata reaches only leaseholders, and re-registering changes it)."""

    @abstractmethod
    def metadata(self) -> bytes:
        """What a peer needs to read this agent's registered memory."""

    @abstractmethod
    def load_peer(self, agent_name: str, metadata: bytes) -> None:
        """Learns (or refreshes) a peer's metadata. Raises ReadError when it is unusable."""

    def start_read(self, peer: str, copies: Sequence[Copy], grant: Grant | None = None, *,
                   wake: threading.Event | None = None, in_order: bool = False) -> H:
        """Posts a one-sided READ of all copies; returns a handle for ``poll``. Raises ReadError.
        ``grant``: required by a plane that ``needs_grant``, refused by one that does not. ``wake``: only
        for a plane that ``lands_on_own_threads``. ``in_order``: only for a plane with ``in_order_reads``."""
        if self.needs_grant and (grant is None or not grant.token):
            raise ReadError(f"the {self.name} plane reads only with the hub's grant of a lease; the hub signed "
                            f"none for {peer} (it registered without a grant key)")
        if not self.needs_grant and grant is not None:
            raise ValueError(f"the {self.name} plane takes no grant (needs_grant is False)")
        if wake is not None and not self.lands_on_own_threads:
            raise ValueError(f"the {self.name} plane lands no reads on its own threads: it takes no wake event "
                             f"(the fetch loop polls)")
        if in_order:
            if not self.in_order_reads:
                raise ValueError(f"the {self.name} plane keeps no order between reads (in_order_reads is False)")
            return self._start_in_order(peer, list(copies), grant, wake)
        return self._start_read(peer, list(copies), grant, wake)

    @abstractmethod
    def _start_read(self, peer: str, copies: list[Copy], grant: Grant | None,
                    wake: threading.Event | None) -> H:
        """Posts the read; the arguments were checked against this plane's capabilities."""

    def _start_in_order(self, peer: str, copies: list[Copy], grant: Grant | None,
                        wake: threading.Event | None) -> H:
        """Posts the read behind the previous in-order read to ``peer`` (a plane with ``in_order_reads``)."""
        raise NotImplementedError(f"the {self.name} plane declares in_order_reads but posts no in-order read")

    @abstractmethod
    def poll(self, handle: H) -> ReadState: ...

    def landed_bytes(self, handle: H) -> int:
        """How many of the read's bytes have landed, counted in copy order (a prefix of its copies' bytes), for a
        plane that ``reports_progress``; 0 for one that does not (poll says when all of them have)."""
        return 0

    def failure(self, handle: H) -> str:
        """Why a read whose state is FAILED failed, when the plane knows."""
        return ""

    @abstractmethod
    def release(self, handle: H) -> None:
        """Frees the handle; cancels the read if it is still in progress."""

    @abstractmethod
    def close(self) -> None: ...
