"""A holder's TCP read server: sends registered memory to readers that present a valid grant.

One thread accepts; one thread per connection reads a request, checks it and ``sendall``s the ranges
straight from the registered tensors (CPU memory: no copy in user space; the kernel copies into the socket), or,
for GPU memory, through the connection's pinned bounce buffer (tcp_bounce.py). Every check
happens before a byte is sent: the grant (grants.py: the hub signed exactly these ranges for a live lease), that
the wanted ranges are disjoint parts of the granted ones (so one grant never yields more bytes than it signs),
and that each range lies inside memory this process registered and still holds. A refused request gets its
reason and the connection is closed.

Nobody costs the holder more than a bounded amount before proving a grant: a new connection must send a valid
request within ``first_request_s`` (an idle pooled connection may then wait ``idle_timeout_s`` between
requests), and one peer address holds at most ``max_per_peer`` of the ``max_connections`` slots.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

import torch

from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.planes import tcp_wire as wire
from tensorhub_verl.ros.planes.tcp_bounce import Bounce, Bounces

logger = logging.getLogger("tensorhub_verl.ros.tcp")

_ACCEPT_POLL_S = 0.5


class ReadServer:
    def __init__(self, host: str, key: bytes, resolve: Callable[[int, int], "memoryview | torch.Tensor | None"],
                 *, bounces: Bounces | None = None, io_timeout_s: float = 30.0, idle_timeout_s: float = 600.0,
                 first_request_s: float = 5.0, max_connections: int = 256, max_per_peer: int = 64,
                 name: str = "tensorhub-tcp", agent: str = ""):
        """``resolve(addr, nbytes)``: the span, when it lies in registered, live memory of this process: a byte
        view of CPU memory, sent as it is, or a uint8 tensor (GPU memory), sent through a bounce buffer from
        ``bounces``; else None."""
        self._key = key
        self._hello = wire.encode_hello(agent)
        """Sent first on every connection: readers check it names the agent they meant before sending anything."""
        self._resolve = resolve
        self._bounces = bounces or Bounces()
        self._io_timeout_s = io_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._first_request_s = first_request_s
        self._max_per_peer = max_per_peer
        self._per_peer: dict[str, int] = {}
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener = socket.create_server((host, 0), backlog=128)
        self._listener.settimeout(_ACCEPT_POLL_S)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._name = name
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with self._lock:
                crowded = self._per_peer.get(peer[0], 0) >= self._max_per_peer
                if not crowded:
                    self._per_peer[peer[0]] = self._per_peer.get(peer[0], 0) + 1
            if crowded or not self._slots.acquire(blocking=False):
                logger.warning("%s: refusing a connection from %s: too many open%s", self._name, peer,
                               " from that address" if crowded else "")
                if not crowded:
                    self._forget_peer(peer)
                conn.close()
                continue
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name=f"{self._name}-serve", daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._first_request_s)
            conn.sendall(self._hello)
            # A stranger proves itself with a valid request soon; a reader's pooled connection then idles between
            # requests for longer.
            wait_s = self._first_request_s
            bounce: list[Bounce] = []  # this connection's bounce buffer, made at its first GPU range
            while not self._stop.is_set():
                conn.settimeout(wait_s)
                try:
                    header = wire.recv_exact(conn, wire.REQUEST.size)
                except ConnectionError:
                    return  # the reader closed its connection: the normal end
                conn.settimeout(self._io_timeout_s)
                if not self._answer(conn, header, peer, bounce):
                    return
                wait_s = self._idle_timeout_s
        except OSError as e:  # timeouts, resets, a reader that hung up mid-reply
            logger.debug("%s: connection from %s ended: %s", self._name, peer, e)
        except RuntimeError as e:  # a failed device -> host copy (torch's CUDA errors): the reader re-plans
            logger.warning("%s: a read of GPU memory for %s failed: %s", self._name, peer, e)
        finally:
            with self._lock:
                self._connections.discard(conn)
            self._forget_peer(peer)
            conn.close()
            self._slots.release()

    def _forget_peer(self, peer) -> None:
        with self._lock:
            left = self._per_peer.get(peer[0], 0) - 1
            if left > 0:
                self._per_peer[peer[0]] = left
            else:
                self._per_peer.pop(peer[0], None)

    def _answer(self, conn: socket.socket, header: bytes, peer, bounce: list[Bounce]) -> bool:
        magic, grant_len, count, wanted_count = wire.REQUEST.unpack(header)
        if magic != wire.MAGIC or grant_len > wire.MAX_GRANT or not 0 < count <= wire.MAX_RANGES or \
                wanted_count > wire.MAX_RANGES:
            return self._refuse(conn, peer, "malformed request")
        grant = wire.recv_exact(conn, grant_len).decode("ascii", errors="replace")
        granted = _ranges(wire.recv_exact(conn, count * wire.RANGE.size), count)
        wanted = _ranges(wire.recv_exact(conn, wanted_count * wire.RANGE.size), wanted_count)
        ranges = wanted or granted
        why = grants.check(self._key, grant, granted)
        if why is None and not all(_within(granted, addr, nbytes) for addr, nbytes in wanted):
            why = "a wanted range lies outside the ranges its grant signs"
        if why is None and not _disjoint(wanted):
            why = "wanted ranges overlap: a grant's bytes are sent at most once per request"
        sources = [self._resolve(addr, nbytes) for addr, nbytes in ranges] if why is None else []
        if why is None and any(source is None for source in sources):
            why = "a range lies outside this holder's registered memory"
        if why is not None:
            return self._refuse(conn, peer, why)
        conn.sendall(wire.REPLY.pack(wire.OK, sum(n for _, n in ranges)))
        for source in sources:
            if isinstance(source, memoryview):
                conn.sendall(source)
                continue
            if not bounce:
                bounce.append(self._bounces.new())
            bounce[0].send(conn, source)
        return True

    def _refuse(self, conn: socket.socket, peer, why: str) -> bool:
        logger.warning("%s: refused a read from %s: %s", self._name, peer, why)
        reason = why.encode()[:wire.MAX_REASON]
        conn.sendall(wire.REPLY.pack(wire.REFUSED, len(reason)) + reason)
        return False

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(timeout)


def _ranges(raw: bytes, count: int) -> list[tuple[int, int]]:
    return [wire.RANGE.unpack_from(raw, i * wire.RANGE.size) for i in range(count)]


def _disjoint(ranges: list[tuple[int, int]]) -> bool:
    """No two ranges share a byte (so their total never exceeds the granted ranges' total)."""
    ordered = sorted(ranges)
    return all(a + n <= b for (a, n), (b, _) in zip(ordered, ordered[1:]))


def _within(granted: list[tuple[int, int]], addr: int, nbytes: int) -> bool:
    return nbytes > 0 and any(start <= addr and addr + nbytes <= start + length for start, length in granted)
