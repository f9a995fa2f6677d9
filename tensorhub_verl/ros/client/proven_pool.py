"""A connection pool to the hub whose every new connection is proven before it carries anything secret.

Each connection urllib3 opens first sends the token-less challenge (``hub_proof``) on the fresh socket and reads
the answer, inside ``connect()``: the first request that carries the bearer token, a job key or a worker
credential goes out only on a connection whose peer proved it holds the token. A hub that restarted (a new
process on the same port) is met on new connections, so it is proven again before the client re-registers;
an impostor that bound the port after the hub died never gets past the challenge.

Two answers end a connection at once:
- the peer speaks TLS to a plain ``http://`` URL (``PlainHttpToTls``, not retried: the URL is wrong);
- the peer gives no valid proof (``NotProven``, an ``urllib3`` error, so ``HubClient`` backs off and tries
  again within its retry budget: the real hub may come back on the port).

A client without a token has nothing to prove the hub with: it checks only that an HTTP server answers.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl

import urllib3

from tensorhub_verl.errors import PlainHttpToTls
from tensorhub_verl.ros.wire import hub_proof

logger = logging.getLogger("tensorhub_verl.ros.client")

_MAX_HELLO_BYTES = 4096
_TLS_RECORD_TYPES = (b"\x15", b"\x16")  # alert, handshake: what a TLS server sends to a plaintext client


class NotProven(urllib3.exceptions.HTTPError):
    """The peer on this connection did not prove it holds the hub's token; nothing secret was sent."""


def proven_pool(url: str, token: str | None, **pool_args) -> urllib3.HTTPConnectionPool:
    """urllib3's pool for ``url`` (``connection_from_url``), each of whose connections proves the hub first."""
    pool = urllib3.connection_from_url(url, **pool_args)
    base = pool.ConnectionCls

    class ProvenConnection(base):  # type: ignore[misc, valid-type]
        proven_instance: str | None = None

        def connect(self) -> None:
            super().connect()
            try:
                self.proven_instance = _challenge(self.sock, self.host, self.port, token, url)
            except BaseException:
                self.close()
                raise

    pool.ConnectionCls = ProvenConnection
    return pool


def _challenge(sock, host: str, port: int, token: str | None, url: str) -> str | None:
    """Sends the hello on ``sock`` and checks the answer; returns the hub's instance id (None: unproven, which
    only a client without a token accepts)."""
    nonce = hub_proof.new_nonce()
    authority = f"[{host}]" if ":" in host else host
    sock.sendall(f"GET {hub_proof.HELLO_PATH}?nonce={nonce} HTTP/1.1\r\nHost: {authority}\r\n"
                 f"Accept: application/json\r\n\r\n".encode("ascii"))
    stream = sock.makefile("rb")
    try:
        first = stream.peek(2)[:2]
        if not first and url.startswith("http://") and _speaks_tls(host, port, sock.gettimeout()):
            first = b"\x16\x03"  # a TLS server closes on a plaintext request without a word: asked in TLS, it answers
        if first[:1] in _TLS_RECORD_TYPES and first[1:2] == b"\x03":
            raise PlainHttpToTls(f"hub {url} answers in TLS on a plain http:// URL; connect with its https:// "
                                 f"URL (and tls_ca_file / --ca-file for a private CA). Nothing was sent but a "
                                 f"token-less hello")
        if not first:
            raise NotProven(f"{url} closed the connection without answering the hub's hello")
        response = http.client.HTTPResponse(_Buffered(stream), method="GET")
        try:
            response.begin()
            body = response.read(_MAX_HELLO_BYTES + 1)
        except (http.client.HTTPException, ValueError) as e:
            raise NotProven(f"{url} answered the hub's hello with something that is not HTTP ({e})") from None
    finally:
        stream.close()
    if token is None:
        return None  # nothing to check it against: an open hub, or a client that sends no secret but a credential
    try:
        answer = json.loads(body) if response.status == 200 and len(body) <= _MAX_HELLO_BYTES else None
    except ValueError:
        answer = None
    instance = answer.get("hub_instance") if isinstance(answer, dict) else None
    if not isinstance(instance, str) or not hub_proof.proven(token, nonce, instance, answer.get("proof")):
        logger.debug("the process at %s did not prove that it holds the hub's token; sent it nothing secret, "
                       "waiting for the real hub", url)
        raise NotProven(f"the process at {url} did not prove that it holds the hub's token (HTTP "
                        f"{response.status}): an impostor on the hub's port, a hub with another token, or a "
                        f"hub of an older version")
    return instance


def _speaks_tls(host: str, port: int, timeout: float | None) -> bool:
    """Whether the server at ``host:port`` completes a TLS handshake (nothing verified, nothing sent after it):
    asked only after it closed a plaintext connection without answering."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout or 5.0) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


class _Buffered:
    """What ``http.client.HTTPResponse`` needs of a socket, over a stream already opened (and peeked into)."""

    def __init__(self, stream):
        self._stream = stream

    def makefile(self, *_args, **_kwargs):
        return self._stream
