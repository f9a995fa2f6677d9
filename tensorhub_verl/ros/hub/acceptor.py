"""The hub's accept loop: takes connections off its listening socket a bounded batch at a time, and survives
running out of file descriptors.

uvloop's own server accepts every queued connection in one pass, before any protocol can run, and closes the
listening server for good when an accept fails for want of a descriptor: a burst of strangers' connections
would leave the hub deaf with no error. Here each pass accepts at most ``batch`` connections and then lets the
event loop run, so the connection limits (``http_guard``: the oldest untrusted connection closes when too many
are open) act between batches; an accept that finds no descriptor pauses accepting for ``pause_s`` and
resumes. Each accepted socket is handed to the loop's ``connect_accepted_socket`` with uvicorn's protocol
(and TLS context, if any), as uvicorn's server would.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from typing import Callable

logger = logging.getLogger("tensorhub_verl.ros.hub")

_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Acceptor:
    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol],
                 ssl_context: ssl.SSLContext | None, handshake_timeout_s: float, max_handshakes: int,
                 batch: int = 64, pause_s: float = 0.1):
        self._sock = sock
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._handshake_timeout_s = handshake_timeout_s
        self._max_handshakes = max_handshakes
        self._batch = batch
        self._pause_s = pause_s
        self._handshakes = 0
        """TLS handshakes under way: connections that no protocol counts yet (``http_guard``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self._tasks: set[asyncio.Task] = set()

    def start(self) -> None:
        """Starts accepting, on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._resume()

    def stop(self) -> None:
        self._stopped = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())

    def _resume(self) -> None:
        if not self._stopped:
            self._loop.add_reader(self._sock.fileno(), self._accept_batch)

    def _accept_batch(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    logger.warning("accepting a connection failed: %s", e)
                    return
                logger.warning("no file descriptor for a new connection (%s): accepting again in %g s",
                               e.strerror, self._pause_s)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(self._pause_s, self._resume)
                return
            if self._ssl is not None and self._handshakes >= self._max_handshakes:
                conn.close()  # strangers holding TLS handshakes open: each would cost a descriptor for long
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        if self._ssl is None:
            try:
                await self._loop.connect_accepted_socket(self._factory, conn)
            except OSError:
                conn.close()
            return
        self._handshakes += 1
        try:
            await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl,
                                                     ssl_handshake_timeout=self._handshake_timeout_s)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as e:
            logger.debug("a TLS connection failed before its first request: %s", e)
            conn.close()
        finally:
            self._handshakes -= 1
