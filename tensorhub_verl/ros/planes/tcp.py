"""The TCP data plane: reads of peers' registered memory over plain TCP streams, for hosts without RDMA.

UCX's TCP transport emulates a one-sided GET with active messages and segment copies on both sides, well below
a raw socket's throughput even tuned (nixl.UCX_DEFAULTS; figures in docs/design.md). This
plane moves a chunk the way a raw socket does: the holder ``sendall``s it from the registered tensor, the reader
``recv_into``s it straight into its destination tensor.

    reader: fetch loop --start_read--> per-peer queue --> ``streams`` connections (threads)  ==TCP==>
    holder: ReadServer (tcp_server.py): check the grant, then send the ranges from the live tensors

A read is one request, whatever its copies: a run lease's merged ranges go as one reply, received in order
into the copies, and the read counts the bytes in as they land (``landed_bytes``), so the fetch checks each chunk
of a run as soon as its bytes are in.

Connections to a peer are opened in the background as soon as its metadata arrives (``load_peer``, with the
first lease on it), so the first chunk does not wait for TCP's handshake. Each stream sends the next read's
request ahead of the reply it is receiving, so the holder sends chunk after chunk with no gap; several streams
spread a fast link's copies over cores. In-order reads (``in_order_reads``: a seed's WAN reads) go to a stream of
their own, one after another: reads posted together then land one by one, each as early as the link allows,
where on two streams they would share the link and land together, and the link never waits for a post between
them.

GPU memory (``VRAM`` regions) crosses the socket through pinned bounce buffers, one per holder connection and
one per reader stream (tcp_bounce.py): the holder copies each piece device -> host and sends it, the reader
receives each piece and copies it host -> device, synchronized before the read is done. The device side is a
tensor view of a registered storage, never an address turned into host memory.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from tensorhub_verl import errors
from tensorhub_verl.ros.planes import tcp_bounce
from tensorhub_verl.ros.planes import tcp_wire as wire
from tensorhub_verl.ros.planes.tcp_bounce import Bounce, Bounces
from tensorhub_verl.ros.planes.tcp_server import ReadServer
from tensorhub_verl.ros.planes.config import DEFAULT_BOUNCE_BYTES, TcpConfig
from tensorhub_verl.ros.planes.host import advertised_host
from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant, ReadError, ReadHandle, ReadState, Region

logger = logging.getLogger("tensorhub_verl.ros.tcp")

_QUEUE_POLL_S = 0.5
_AHEAD = 1
"""Requests a stream sends ahead of the reply it is receiving."""
_DOWN_S = 1.0
"""After a failed connect, reads of that peer fail at once (a re-plan) for this long, then connects are tried again."""
IDLE_CLOSE_S = 300.0
"""A stream with no read for this long closes its connection and its thread ends; the next read to that peer
starts them again. Workers come and go in an elastic job: without this, a long-lived reader would keep two
threads and two sockets for every peer it ever read from."""


class _Read(ReadHandle):
    """One read (a chunk, or a run's merged ranges) on one stream: posted, then done or failed; ``cancel`` hangs
    its stream up. ``landed``: its bytes received so far, in order (a retry on a fresh connection starts again)."""

    def __init__(self, request: bytes, targets: "list[memoryview | torch.Tensor]", wake: threading.Event | None,
                 in_order: bool = False):
        self.request = request
        self.in_order = in_order
        """Taken by the peer's in-order stream (``_Peer.lane``), behind the in-order reads posted before it."""
        self.targets = targets
        """Where each copy lands: a byte view of CPU memory, or a uint8 tensor (GPU memory, via a bounce buffer)."""
        self.wake = wake
        self.state = ReadState.IN_PROGRESS
        self.reason = ""
        self.cancelled = False
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.attempts = 0
        self.landed = 0

    def advance(self, nbytes: int) -> None:
        self.landed += nbytes

    def finish(self, state: ReadState, reason: str = "") -> None:
        with self.lock:
            if self.state is ReadState.IN_PROGRESS:
                self.state, self.reason = state, reason
        if self.wake is not None:
            self.wake.set()

    def cancel(self) -> None:
        """Stops the read: its stream is shut down, so no more bytes land in the reader's buffer after the
        current recv (at most wire.RECV_PIECE bytes, or one bounce buffer for GPU memory)."""
        with self.lock:
            self.cancelled = True
            if self.state is ReadState.IN_PROGRESS:
                self.state, self.reason = ReadState.FAILED, "cancelled"
                if self.sock is not None:
                    _shutdown(self.sock)


class _Peer:
    """The streams to one holder: ``streams`` threads, each with its own connection, taking reads in turn.
    They start at once (connecting before the first read needs them), end after ``idle_close_s`` without a read,
    and start again with the next read (``submit``). In-order reads have a stream of their own (``lane``),
    started with the first of them."""

    def __init__(self, agent: str, host: str, port: int, streams: int, io_timeout_s: float, connect_timeout_s: float,
                 idle_close_s: float = IDLE_CLOSE_S, bounces: Bounces | None = None):
        self.agent, self.address = agent, (host, port)
        self._bounces = bounces or Bounces()
        self._io_timeout_s, self._connect_timeout_s, self._idle_close_s = io_timeout_s, connect_timeout_s, idle_close_s
        self.reads: queue.Queue[_Read] = queue.Queue()
        self.lane: queue.Queue[_Read] = queue.Queue()
        """In-order reads, taken one after another by the in-order stream."""
        self._lane: threading.Thread | None = None
        self._down: tuple[float, str] | None = None
        """(until, why) after a connection attempt failed: new reads fail at once for _DOWN_S."""
        self._stop = threading.Event()
        self._streams = streams
        self._lock = threading.Lock()
        """Held to queue a read and to end an idle stream: no read is queued behind a stream that is ending."""
        self._threads: list[threading.Thread] = []
        self._started = 0
        with self._lock:
            self._start_streams()

    def _start_streams(self) -> None:
        """Brings the live streams back to ``streams`` (under ``_lock``)."""
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(self._threads) < self._streams:
            self._threads.append(self._start_stream(self.reads))

    def _start_stream(self, reads: "queue.Queue[_Read]") -> threading.Thread:
        thread = threading.Thread(target=self._stream, args=(reads,), daemon=True,
                                  name=f"tensorhub-tcp-{self.agent}-{'lane' if reads is self.lane else self._started}")
        self._started += 1
        thread.start()
        return thread

    def submit(self, read: "_Read") -> None:
        with self._lock:
            if read.in_order:
                self.lane.put(read)
                if self._lane is None or not self._lane.is_alive():
                    self._lane = self._start_stream(self.lane)
                return
            self.reads.put(read)
            self._start_streams()  # a no-op unless streams ended idle

    def _idle_exit(self, reads: "queue.Queue[_Read]") -> bool:
        """Ends this stream's thread if no read is queued for it (checked under the lock ``submit`` queues
        under)."""
        with self._lock:
            if not reads.empty():
                return False
            if self._lane is threading.current_thread():
                self._lane = None
            self._threads = [t for t in self._threads if t is not threading.current_thread()]
            return True

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self.address, timeout=self._connect_timeout_s)
        except OSError as e:
            self._down = (time.monotonic() + _DOWN_S, f"peer {self.agent} at {self.address[0]}:{self.address[1]} "
                                                      f"is unreachable: {e}")
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The holder speaks first: nothing goes to a port that is not this peer's data plane.
        wire.block_with_timeout(sock, self._connect_timeout_s)
        where = f"{self.address[0]}:{self.address[1]}"
        try:
            wire.expect_hello(sock, self.agent, where)
        except ConnectionError as e:
            sock.close()
            self._down = (time.monotonic() + _DOWN_S, f"peer {self.agent} at {where} is unreachable: {e}")
            raise
        self._down = None
        wire.block_with_timeout(sock, self._io_timeout_s)
        return sock

    def _stream(self, reads: "queue.Queue[_Read]") -> None:
        """Takes reads from ``reads``; sends each read's request one read ahead of the reply it is receiving, so
        that the holder goes from one chunk straight to the next (no round trip, no wake-up of this thread, between
        them on the wire)."""
        sock: socket.socket | None = None
        try:
            sock = self._connect()  # in the background, before the first read needs it
        except OSError:
            pass
        sent: deque[_Read] = deque()
        """Reads whose requests are on this connection, in order; their replies come in the same order."""
        bounce: list[Bounce] = []
        """This stream's bounce buffer, made at its first read into GPU memory."""
        idle_since = time.monotonic()
        while not self._stop.is_set():
            if not sent:
                try:
                    read = reads.get(timeout=_QUEUE_POLL_S)
                except queue.Empty:
                    if time.monotonic() - idle_since > self._idle_close_s and self._idle_exit(reads):
                        break
                    continue
                idle_since = time.monotonic()
                sock = self._send(read, sock, sent)
                continue
            if len(sent) < _AHEAD + 1:
                try:
                    sock = self._send(reads.get_nowait(), sock, sent)
                except queue.Empty:
                    pass
            if sent:
                sock = self._receive(sent.popleft(), sock, sent, bounce)
                idle_since = time.monotonic()
        if sock is not None:
            sock.close()
        self._broken(sent, "the transport closed")

    def _send(self, read: _Read, sock: socket.socket | None, sent: deque[_Read]) -> socket.socket | None:
        if read.cancelled:
            return sock
        try:
            if sock is None:
                sock = self._connect()
        except OSError as e:
            read.finish(ReadState.FAILED, f"{type(e).__name__}: {e}")
            return None
        read.attempts += 1
        read.landed = 0
        with read.lock:
            read.sock = sock
        try:
            sock.sendall(read.request)
        except OSError as e:
            return self._broken([read, *sent], f"{type(e).__name__}: {e}", sock, sent)
        sent.append(read)
        return sock

    def _receive(self, read: _Read, sock: socket.socket, sent: deque[_Read],
                 bounce: list[Bounce]) -> socket.socket | None:
        try:
            status, length = wire.REPLY.unpack(wire.recv_exact(sock, wire.REPLY.size))
            if status != wire.OK:
                why = wire.recv_exact(sock, min(length, wire.MAX_REASON)).decode(errors="replace")
                read.finish(ReadState.FAILED, f"peer {self.agent} refused the read: {why}")
                return self._broken(sent, "the holder refused an earlier read on this connection", sock, sent)
            for target in read.targets:
                if isinstance(target, memoryview):
                    wire.recv_into_exact(sock, target, read.advance)
                    continue
                if not bounce:
                    bounce.append(self._bounces.new())
                bounce[0].receive(sock, target, read.advance)
        except (OSError, RuntimeError) as e:  # RuntimeError: a failed host -> device copy (torch's CUDA errors)
            return self._broken([read, *sent], f"{type(e).__name__}: {e}", sock, sent)
        read.finish(ReadState.DONE)
        return sock

    def _broken(self, reads, why: str, sock: socket.socket | None = None, sent: deque[_Read] | None = None) -> None:
        """After a connection failed: closes it; its reads go back in the queue for one more try on a fresh
        connection (a pooled one may have idled out at the holder, or one read was cancelled), or fail."""
        if sock is not None:
            sock.close()
        for read in list(reads):
            if read.cancelled:
                continue
            if read.attempts < 2 and not self._stop.is_set():
                (self.lane if read.in_order else self.reads).put(read)
            else:
                read.finish(ReadState.FAILED, why)
        if sent is not None:
            sent.clear()
        return None

    def unreachable(self) -> str:
        """Why this peer could not be reached just now; empty when it may be."""
        down = self._down
        return down[1] if down is not None and time.monotonic() < down[0] else ""

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for thread in [*self._threads, *([self._lane] if self._lane is not None else [])]:
            thread.join(timeout)


@dataclass(slots=True)
class _Registration:
    region: Region
    storage: StorageWeakRef
    bounced: bool
    """Its bytes cross the socket through a bounce buffer (``TcpPlane._bounced``: GPU memory)."""


class TcpPlane(DataPlane[_Read]):
    """The TCP data plane (see the module docstring). ``host`` is the address peers reach this process on (the
    server listens there only). Its server checks every read against a grant the hub signed with
    ``grant_key``; reads land on the streams' threads, which wake the fetch loop. CPU and CUDA memory (tcp_bounce.py)."""

    name = "tcp"
    needs_grant = True
    lands_on_own_threads = True
    reports_progress = True
    max_copies = wire.MAX_RANGES
    in_order_reads = True

    @classmethod
    def from_config(cls, agent_name: str, config: TcpConfig, hub_url: str, io_timeout_s: float) -> "TcpPlane":
        return cls(agent_name, config.host or advertised_host(hub_url), streams=config.streams,
                   io_timeout_s=io_timeout_s, preconnect_peers=config.preconnect_peers,
                   bounce_bytes=config.bounce_bytes)

    def __init__(self, agent_name: str, host: str, *, streams: int = 2, io_timeout_s: float = 30.0,
                 connect_timeout_s: float = 5.0, idle_close_s: float = IDLE_CLOSE_S, preconnect_peers: int = 4,
                 bounce_bytes: int = DEFAULT_BOUNCE_BYTES):
        """``bounce_bytes``: size of each bounce buffer GPU memory crosses the socket through (one per server
        connection, one per reader stream)."""
        if streams < 1:
            raise errors.ConfigError(f"streams must be >= 1, got {streams}")
        super().__init__(agent_name)
        self.preconnect_peers = preconnect_peers
        self._streams, self._io_timeout_s, self._connect_timeout_s = streams, io_timeout_s, connect_timeout_s
        self._idle_close_s = idle_close_s
        self.bounces = Bounces(bounce_bytes)
        """The plane's bounce buffers, holder and reader side: how many were made and the pieces they carried."""
        self._lock = threading.Lock()
        self._registered: list[_Registration] = []
        self._peers: dict[str, tuple[bytes, _Peer]] = {}
        self._server = ReadServer(host, self.grant_key, self._resolve, bounces=self.bounces,
                                  io_timeout_s=io_timeout_s, name=f"tensorhub-tcp-{agent_name}", agent=agent_name)

    def register(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Records the tensors' storages as servable (CPU or CUDA memory) and as places reads may land; the
        metadata never changes, so this returns False."""
        with self._lock:
            self._registered = [r for r in self._registered if not r.storage.expired()]
            for tensor in tensors:
                if tensor.numel() == 0:
                    continue
                if tensor.device.type not in ("cpu", "cuda"):
                    raise errors.ConfigError(f"the TCP data plane serves CPU and CUDA memory, not {tensor.device}")
                storage = tensor.untyped_storage()
                cuda = storage.device.type == "cuda"
                whole = Region(storage.data_ptr(), storage.nbytes(), storage.device.index or 0 if cuda else 0,
                               "VRAM" if cuda else "DRAM")
                if not any(_inside(r.region, whole.addr, whole.nbytes) for r in self._registered):
                    self._registered.append(_Registration(whole, StorageWeakRef(storage),
                                                          self._bounced(whole.mem)))
        return False

    def unregister(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stops serving the tensors' storages: the server refuses every later read of them, grant or not."""
        gone = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors if t.numel()}
        with self._lock:
            self._registered = [r for r in self._registered if not r.storage.expired()
                                and (r.region.addr, r.region.nbytes) not in gone]

    def _resolve(self, addr: int, nbytes: int, mem: str | None = None) -> "memoryview | torch.Tensor | None":
        """The span as the socket reads or writes it, when it lies in live registered memory (of kind ``mem``,
        when given): a byte view of CPU memory, or a uint8 tensor view of the storage for a bounced region."""
        with self._lock:
            found = next((r for r in self._registered if _inside(r.region, addr, nbytes)
                          and (mem is None or r.region.mem == mem) and not r.storage.expired()), None)
        if found is None:
            return None
        if found.bounced:
            return tcp_bounce.view(found.storage, found.region.addr, addr, nbytes)
        return wire.memory(addr, nbytes)

    def _bounced(self, mem: str) -> bool:
        """Whether memory of kind ``mem`` crosses the socket through a bounce buffer: GPU memory only, since a
        socket reads and writes host memory."""
        return mem == "VRAM"

    def _target(self, copy: Copy) -> "memoryview | torch.Tensor":
        """Where a copy lands: CPU memory as a byte view of its address; bounced memory (``_bounced``) only
        inside a registered storage, as a tensor view of it."""
        if copy.local_mem == "DRAM" and not self._bounced(copy.local_mem):
            return wire.memory(copy.local_addr, copy.length)
        target = self._resolve(copy.local_addr, copy.length, copy.local_mem)
        if target is None:
            raise ReadError(f"{copy.length} bytes at {copy.local_addr:#x} ({copy.local_mem}) are not in memory "
                            f"registered with the TCP plane: register the destination tensors before reading")
        return target

    def metadata(self) -> bytes:
        return wire.encode_metadata(self.agent_name, self._server.host, self._server.port)

    def load_peer(self, agent_name: str, metadata: bytes) -> None:
        try:
            agent, host, port = wire.decode_metadata(metadata)
        except (ValueError, KeyError, TypeError) as e:
            raise ReadError(f"metadata of peer {agent_name} is unusable: {e}") from e
        if agent != agent_name:
            raise ReadError(f"metadata registered as agent {agent_name!r} describes agent {agent!r}")
        with self._lock:
            known = self._peers.get(agent_name)
            if known is not None and known[0] == metadata:
                return
            peer = _Peer(agent, host, port, self._streams, self._io_timeout_s, self._connect_timeout_s,
                         self._idle_close_s, self.bounces)
            self._peers[agent_name] = (metadata, peer)
        if known is not None:
            known[1].close()

    def _start_read(self, peer: str, copies: list[Copy], grant: Grant | None,
                    wake: threading.Event | None) -> _Read:
        return self._submit(peer, copies, grant, wake, in_order=False)

    def _start_in_order(self, peer: str, copies: list[Copy], grant: Grant | None,
                        wake: threading.Event | None) -> _Read:
        return self._submit(peer, copies, grant, wake, in_order=True)

    def _submit(self, peer: str, copies: list[Copy], grant: Grant | None, wake: threading.Event | None, *,
                in_order: bool) -> _Read:
        if grant is None:  # refused by DataPlane.start_read already; kept for direct callers of the hook
            raise ReadError(f"a read from {peer} over TCP needs the hub's grant")
        with self._lock:
            known = self._peers.get(peer)
        if known is None:
            raise ReadError(f"no metadata for peer {peer}")
        if why := known[1].unreachable():
            raise ReadError(why)
        if any(c.local_mem not in ("DRAM", "VRAM") or c.remote_mem not in ("DRAM", "VRAM") for c in copies):
            raise ReadError("the TCP data plane reads CPU (DRAM) and CUDA (VRAM) memory only")
        wanted = [(c.remote_addr, c.length) for c in copies]
        signed = list(grant.ranges) or wanted
        if not copies or len(signed) > wire.MAX_RANGES or len(copies) > wire.MAX_RANGES or \
                len(grant.token) > wire.MAX_GRANT:
            raise ReadError(f"a read of {len(copies)} ranges with a {len(grant.token)}-character grant cannot be "
                            f"sent")
        encoded = grant.token.encode("ascii")
        parts = wanted if signed != wanted else []  # none: all of the granted ranges
        request = wire.REQUEST.pack(wire.MAGIC, len(encoded), len(signed), len(parts)) + encoded + \
            b"".join(wire.RANGE.pack(addr, n) for addr, n in signed + parts)
        read = _Read(request, [self._target(c) for c in copies], wake, in_order)
        known[1].submit(read)
        return read

    def poll(self, handle: _Read) -> ReadState:
        return handle.state

    def landed_bytes(self, handle: _Read) -> int:
        return handle.landed

    def failure(self, handle: _Read) -> str:
        return handle.reason

    def release(self, handle: _Read) -> None:
        handle.cancel()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            peers = [peer for _, peer in self._peers.values()]
            self._peers.clear()
        for peer in peers:
            peer.close()


def _inside(region: Region, addr: int, nbytes: int) -> bool:
    return region.addr <= addr and addr + nbytes <= region.addr + region.nbytes


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
