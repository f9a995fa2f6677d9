"""Bounce buffers of the TCP plane: GPU memory crosses a socket through a small pinned host buffer.

A socket reads and writes host memory only, and a CUDA address is not a host address. So the holder copies
each piece of a served range device -> pinned buffer and sends the buffer; the reader receives into a pinned
buffer and copies buffer -> device. Each connection (holder) and each stream (reader) owns one buffer of
``nbytes``, made at its first device read and reused for every piece after it: never a copy of a whole tensor,
never a pageable staging copy. The device side is always a tensor view of the registered storage (``view``),
never a pointer.

A reader's copies run ``non_blocking`` on the stream's own CUDA stream; the read is synchronized before it is
marked done, and before the buffer takes the next piece. CPU tensors go through the same code (the copies are
then plain memcpys), which is how the CPU suite tests it (tests/ros/test_tcp_bounce.py: a subclass of ``TcpPlane``
whose ``_bounced`` says yes to CPU memory too).
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from tensorhub_verl.ros.planes import tcp_wire as wire
from tensorhub_verl.ros.planes.config import DEFAULT_BOUNCE_BYTES



def view(storage: StorageWeakRef, base: int, addr: int, nbytes: int) -> torch.Tensor | None:
    """A uint8 tensor over ``nbytes`` at ``addr`` of the storage that starts at ``base``, holding the storage
    alive while it is used; None once the storage is freed, moved, or too short for the range now.

    The range is checked against the live storage, not the size it had at registration: a storage may shrink
    or move after it was registered (FSDP frees a parameter's storage with ``resize_(0)`` between steps), and
    ``set_`` past its end would grow it, so a read would serve (or a reader write) bytes that are no longer
    the registered tensor's."""
    live = torch.UntypedStorage._new_with_weak_ptr(storage.cdata)
    if live is None:
        return None
    offset = addr - base
    if live.data_ptr() != base or offset < 0 or nbytes < 0 or offset + nbytes > live.nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=live.device).set_(live, offset, (nbytes,))


class Bounces:
    """Makes the bounce buffers of one plane, and counts them (``made``) and the pieces they carried (``pieces``)."""

    def __init__(self, nbytes: int = DEFAULT_BOUNCE_BYTES):
        if nbytes < 1:
            raise ValueError(f"a bounce buffer needs at least one byte, got {nbytes}")
        self.nbytes = nbytes
        self.made = 0
        self.pieces = 0
        self._lock = threading.Lock()

    def new(self) -> "Bounce":
        with self._lock:
            self.made += 1
        return Bounce(self)

    def _count(self) -> None:
        with self._lock:
            self.pieces += 1


class Bounce:
    """One pinned host buffer (pinned only where CUDA is available: ``pin_memory`` needs it) and, for device
    tensors, one CUDA stream per device for its copies. Used by one thread at a time."""

    def __init__(self, owner: Bounces):
        self._owner = owner
        self.buffer = torch.empty(owner.nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self._host = memoryview(self.buffer.numpy()).cast("B")
        self._streams: dict[int, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> "torch.cuda.Stream | None":
        if device.type != "cuda":
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]

    def send(self, sock: socket.socket, source: torch.Tensor) -> None:
        """Sends ``source`` (uint8, 1-D) piece by piece: copy into the buffer, wait for the copy, send it."""
        stream = self._stream(source.device)
        for start in range(0, source.numel(), self._owner.nbytes):
            n = min(self._owner.nbytes, source.numel() - start)
            self._copy(self.buffer[:n], source[start:start + n], stream)
            sock.sendall(self._host[:n])
            self._owner._count()

    def receive(self, sock: socket.socket, target: torch.Tensor, progress: Callable[[int], None] | None = None) -> None:
        """Fills ``target`` (uint8, 1-D) from ``sock`` piece by piece; returns once every byte is in ``target``.
        ``progress(n)`` after each piece of ``n`` bytes is in ``target``."""
        stream = self._stream(target.device)
        for start in range(0, target.numel(), self._owner.nbytes):
            n = min(self._owner.nbytes, target.numel() - start)
            wire.recv_into_exact(sock, self._host[:n])
            self._copy(target[start:start + n], self.buffer[:n], stream)
            self._owner._count()
            if progress is not None:
                progress(n)

    @staticmethod
    def _copy(into: torch.Tensor, source: torch.Tensor, stream: "torch.cuda.Stream | None") -> None:
        """``into.copy_(source)``, on ``stream`` for device memory, finished when this returns (the buffer is
        sent or refilled next)."""
        if stream is None:
            into.copy_(source)
            return
        device = source.device if source.is_cuda else into.device
        # The copy must see the work queued on the device's current stream (a holder's writes to its weights, a
        # reader's allocation). The view keeps the storage alive until the synchronize below.
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            into.copy_(source, non_blocking=True)
        stream.synchronize()
