"""Runs the hub: embedded in a thread (``start_hub``), or in the foreground (``tensorhub hub``).

The same ``HubServer`` object is what a Ray actor wraps to run the hub inside a verl job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import socket
import threading
import time
from pathlib import Path

import uvicorn

from tensorhub_verl.errors import ConfigError, HubAddressInUse, HubUnavailable
from tensorhub_verl.ros.hub.app import DEFAULT_MAX_BODY_BYTES, create_app
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.hub.acceptor import Acceptor
from tensorhub_verl.ros.hub.http_guard import ConnectionLimits, guarded_protocol, listen_backlog, \
    raise_open_files_limit, untrusted_cap
from tensorhub_verl.ros.hub.liveness import StallMeter

logger = logging.getLogger("tensorhub_verl.ros.hub")

_SWEEP_INTERVAL_S = 0.25


def resolve_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """An explicit token wins; else the file; else None. (Environment defaults belong to the CLI.)"""
    if token is not None and token_file is not None:
        raise ConfigError("give either a token or a token file, not both")
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise ConfigError(f"cannot read token file {path}: {e}") from e
        if not token:
            raise ConfigError(f"token file {path} is empty; write the token into it")
    if token is not None and (not token or any(c.isspace() for c in token)):
        raise ConfigError("a token must be non-empty and contain no whitespace")
    return token


class HubServer:
    """A hub listening on ``host:port`` (port 0 picks a free one). ``url`` is valid once started.

    With ``tls_cert`` and ``tls_key`` (PEM files) it serves HTTPS only; clients verify it against the system
    trust store or a CA file of their own (``ClientConfig.tls_ca_file``). ``connection_limits`` bound what a
    connection may cost before a request reaches the hub (``http_guard.py``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 config: HubConfig | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 tls_cert: str | os.PathLike | None = None, tls_key: str | os.PathLike | None = None,
                 connection_limits: ConnectionLimits | None = None):
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("TLS needs both a certificate and its key (tls_cert and tls_key)")
        for what, path in (("certificate", tls_cert), ("key", tls_key)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"TLS {what} file {path} does not exist")
        self.tls = tls_cert is not None
        open_files = raise_open_files_limit()
        backlog = listen_backlog(open_files)
        self._socket = _listen(host, port, backlog)
        # Accepted connections inherit this. uvicorn sets it only on sockets it creates itself; without
        # it every response waits for a delayed ACK (~40 ms per request).
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host, self.port = self._socket.getsockname()[:2]
        try:
            self.state = HubState(config, hub_url=self.url)  # its plane's 'auto' resolves for this URL
        except BaseException:
            self._socket.close()
            raise
        token = resolve_token(token)
        app = create_app(self.state, token=token, max_body_bytes=max_body_bytes)
        limits = connection_limits or ConnectionLimits()
        self._server = _ProbedServer(self.state.stall, self._socket, limits, open_files, uvicorn.Config(
            app, http=guarded_protocol(limits, token, open_files),
            log_level="warning", access_log=False, timeout_keep_alive=30, lifespan="off", backlog=backlog,
            ssl_certfile=str(tls_cert) if tls_cert else None, ssl_keyfile=str(tls_key) if tls_key else None))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "HubServer":
        # No sockets for uvicorn's own server: the acceptor takes connections off ours (``acceptor.py``).
        serve = threading.Thread(target=self._server.run, kwargs={"sockets": []},
                                 name="tensorhub-hub", daemon=True)
        sweep = threading.Thread(target=self._sweep, name="tensorhub-hub-sweep", daemon=True)
        self._threads = [serve, sweep]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not serve.is_alive():
                raise HubUnavailable(f"hub did not start on {self.url} within {timeout} s")
            time.sleep(0.01)
        logger.info("hub %s listening on %s", self.state.instance, self.url)
        return self

    def serve_forever(self) -> None:
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()

    def _sweep(self) -> None:
        while not self._stop.wait(_SWEEP_INTERVAL_S):
            try:
                self.state.sweep()
            except Exception:  # the sweeper must outlive a bug in one pass
                logger.exception("hub sweep failed")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.state.changes.close()  # parked long-polls answer now: uvicorn's shutdown waits for every request
        self._server.should_exit = True
        for t in self._threads:
            t.join(timeout)
        try:
            self._socket.close()
        except OSError:
            pass

    def __enter__(self) -> "HubServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """The hub's listening socket; a clear error naming the address when it cannot be had."""
    try:
        return socket.create_server((host, port), reuse_port=False, backlog=backlog)
    except OSError as e:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            raise HubAddressInUse(
                f"cannot listen on {where}: the address is in use by another process (a hub still running, or "
                f"another program on that port). Stop that process (its clients wait for this hub for their retry "
                f"budget and send nothing secret to a process that cannot prove it holds the token), or start "
                f"the hub on another port (--port, start_hub(port=...))") from e
        raise ConfigError(f"cannot listen on {where}: {e.strerror or e}; choose an address of this host "
                          f"(--host) and a port you may bind (--port)") from e


class _ProbedServer(uvicorn.Server):
    """uvicorn's server, fed by the hub's own accept loop (``acceptor.Acceptor``) from ``sock``, plus a probe on
    its event loop, which answers heartbeats: the probe's late ticks measure how long the hub itself could not
    hear anyone (``liveness.StallMeter``)."""

    def __init__(self, stall: StallMeter, sock: socket.socket, limits: ConnectionLimits, open_files: int,
                 config: uvicorn.Config):
        super().__init__(config)
        self._stall = stall
        self._sock = sock
        self._limits = limits
        self._open_files = open_files
        self._probe: asyncio.Task | None = None
        self._acceptor: Acceptor | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=self.server_state,
                                              app_state=self.lifespan.state)

        self._acceptor = Acceptor(self._sock, protocol, config.ssl, self._limits.head_timeout_s,
                                  max_handshakes=untrusted_cap(self._open_files))
        self._acceptor.start()
        self._probe = asyncio.get_running_loop().create_task(self._tick_forever())

    async def shutdown(self, sockets=None) -> None:
        if self._acceptor is not None:
            self._acceptor.stop()
        if self._probe is not None:
            self._probe.cancel()
        await super().shutdown(sockets)

    async def _tick_forever(self) -> None:
        while True:
            self._stall.tick()
            await asyncio.sleep(self._stall.tick_s)


def start_hub(host: str = "127.0.0.1", port: int = 0, token: str | None = None,
              config: HubConfig | None = None, tls_cert: str | os.PathLike | None = None,
              tls_key: str | os.PathLike | None = None, owners: tuple[str, ...] | None = None,
              connection_limits: ConnectionLimits | None = None, plane: str | None = None) -> HubServer:
    """Starts an embedded hub in background threads; ``hub.url`` to connect, ``hub.stop()`` to end it.
    ``owners``: "MODEL_GLOB=WORKER_GLOB" rules (``HubConfig.owners``), e.g. ``("policy=trainer-*",)``; ``plane``:
    the data plane of its workers (``HubConfig.plane``)."""
    if owners is not None:
        config = dataclasses.replace(config or HubConfig(), owners=tuple(owners))
    if plane is not None:
        config = dataclasses.replace(config or HubConfig(), plane=plane)
    return HubServer(host, port, token, config, tls_cert=tls_cert, tls_key=tls_key,
                     connection_limits=connection_limits).start()
