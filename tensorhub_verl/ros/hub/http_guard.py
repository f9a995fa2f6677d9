"""Connection limits of the hub's HTTP server, enforced before a request reaches the application.

What uvicorn leaves open: a connection that never sends a request head stays open forever (its keep-alive timer
starts only after a first response), httptools buffers a header line of any size, and nothing caps how many
sockets one peer holds. Each costs the hub a file descriptor and memory without any token; enough of them lock
every worker out. ``ConnectionLimits`` bounds all three per connection, on the event loop, in O(1):

- a request head (request line and headers) must arrive complete within ``head_timeout_s`` of its first byte,
  and a new connection must send its first within that time: else the connection is closed;
- a request head over ``max_head_bytes`` is answered 431 and the connection closed, before it is parsed whole;
- a peer (an IP address) holding ``max_per_peer`` connections gets its next one answered 503 and closed;
- connections that have not yet sent a request head with the hub's token (a hub without a token: any complete
  head) are *untrusted*; at most ``max_untrusted`` of them stay open over the whole hub, a cap derived from the
  process's open-files limit (``untrusted_cap``). A new connection past the cap closes the oldest untrusted one,
  so strangers' idle sockets cannot use up the hub's file descriptors, and a new worker, which sends its head
  within a round trip or two, always gets in.
"""

from __future__ import annotations

import hmac
import logging
import resource
from collections import Counter, OrderedDict
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tensorhub_verl.errors import ConfigError

logger = logging.getLogger("tensorhub_verl.ros.hub")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_head_bytes: int = 64 << 10
    """Largest request head (request line plus headers) accepted; the hub's own heads are under 1 KiB."""
    head_timeout_s: float = 10.0
    """A request head must be complete this long after its first byte (a new connection's first byte too)."""
    max_per_peer: int = 1024
    """Open connections one IP address may hold (a node's workers share its address: each keeps a few)."""
    max_untrusted: int | None = None
    """Open connections, over the whole hub, that have not yet sent a request head carrying the hub's token.
    None: derived from the open-files limit when the server starts (``untrusted_cap``)."""

    def __post_init__(self) -> None:
        if self.max_head_bytes < 1024:
            raise ConfigError(f"max_head_bytes must be >= 1024, got {self.max_head_bytes}")
        if not self.head_timeout_s > 0:
            raise ConfigError(f"head_timeout_s must be > 0, got {self.head_timeout_s}")
        if self.max_per_peer < 1:
            raise ConfigError(f"max_per_peer must be >= 1, got {self.max_per_peer}")
        if self.max_untrusted is not None and self.max_untrusted < 1:
            raise ConfigError(f"max_untrusted must be >= 1 or None (from the open-files limit), "
                              f"got {self.max_untrusted}")


_RESERVED_FILES = 64
"""Descriptors the hub keeps for itself (its listening socket, logs, threads' pipes) out of the open-files limit."""


def listen_backlog(open_files: int) -> int:
    """The listening socket's backlog for a hub with ``open_files`` descriptors: connections the kernel queues
    for the hub's accept loop (``acceptor.py``), kept well inside the limit."""
    return max(16, min(2048, open_files // 8))


def untrusted_cap(open_files: int) -> int:
    """Untrusted connections a hub with ``open_files`` descriptors keeps at most: half of what is left after its
    own descriptors and the listening queue (``listen_backlog``), so token holders always have the other half."""
    return max(16, (open_files - _RESERVED_FILES - listen_backlog(open_files)) // 2)


def guarded_protocol(limits: ConnectionLimits, token: str | None = None,
                     open_files: int | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``limits`` (pass it as ``uvicorn.Config(http=...)``); ``token``: the
    hub's bearer token, which makes a connection trusted. The per-peer counts and the untrusted connections
    live in this class, so each server gets its own."""
    open_per_peer: Counter[str] = Counter()
    untrusted: OrderedDict[int, "HttpToolsProtocol"] = OrderedDict()  # oldest first
    cap = limits.max_untrusted or untrusted_cap(open_files or resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    expected = None if token is None else b"bearer " + token.encode()
    evicted = [0]

    def presents_token(headers: list[tuple[bytes, bytes]]) -> bool:
        if expected is None:
            return True
        for name, value in headers:
            if name == b"authorization":
                scheme, _, rest = value.partition(b" ")
                return hmac.compare_digest(scheme.lower() + b" " + rest, expected)
        return False

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._peer = self.client[0] if self.client else ""
            open_per_peer[self._peer] += 1
            self._head_bytes = 0
            self._head_tail = b""  # the last bytes of a head still open: its end may straddle two packets
            self._head_open = True
            self._head_timer = None
            if open_per_peer[self._peer] > limits.max_per_peer:
                self._refuse(503, f"{self._peer} holds {limits.max_per_peer} connections to this hub already")
                return
            if len(untrusted) >= cap:
                _, oldest = untrusted.popitem(last=False)
                evicted[0] += 1
                if evicted[0] == 1 or evicted[0] % 1000 == 0:  # a flood must not flood the log too
                    logger.warning("%d untrusted connections (no request head with the hub's token) are open, the "
                                   "hub's cap: closing the oldest (%d closed so far; the latest from %s)", cap,
                                   evicted[0], oldest._peer)
                oldest.transport.close()
            untrusted[id(self)] = self
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            open_per_peer[self._peer] -= 1
            if open_per_peer[self._peer] <= 0:
                del open_per_peer[self._peer]
            untrusted.pop(id(self), None)
            self._cancel_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head_open:
                # Only the bytes up to the head's end count: a packet may carry the head and much of the body.
                end = (self._head_tail + data).find(b"\r\n\r\n")
                self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._head_tail))
                self._head_tail = data[-3:] if end < 0 else b""
                if self._head_bytes > limits.max_head_bytes:
                    self._refuse(431, f"request head over {limits.max_head_bytes} bytes")
                    return
                if self._head_timer is None:
                    self._arm_head_timer()
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._cancel_head_timer()
            if id(self) in untrusted and presents_token(self.headers):
                del untrusted[id(self)]
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_open, self._head_bytes, self._head_tail = True, 0, b""

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(limits.head_timeout_s, self._head_expired)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._head_open and not self.transport.is_closing():
                logger.info("closing a connection from %s: no complete request head within %g s",
                            self._peer, limits.head_timeout_s)
                self.transport.close()

        def _refuse(self, status: int, reason: str) -> None:
            body = reason.encode()
            phrase = b"Request Header Fields Too Large" if status == 431 else b"Service Unavailable"
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, phrase, len(body), body))
            self._head_open = False
            self._cancel_head_timer()
            self.transport.close()

    return GuardedHttpToolsProtocol


def raise_open_files_limit() -> int:
    """Raises this process's soft limit of open files to its hard limit (a hub holds a socket per connection);
    returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError) as e:
            logger.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, e)
    return soft
