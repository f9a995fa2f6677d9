"""The TCP data plane's frames, and raw-memory views, shared by its server (holder) and its reader.

    holder -> reader   HELLO    magic "THH1" | agent length u16 | agent, utf-8    (once, when it accepts)
    reader -> holder   REQUEST  magic "THR2" | grant length u16 | granted u32 | wanted u32 | grant
                                | granted (addr u64, length u64)* | wanted (addr u64, length u64)*
    holder -> reader   REPLY    status u8 | length u64 | the wanted ranges' bytes, in order (status OK)
                                                       | why, utf-8 (status REFUSED; then the holder hangs up)

One request is one lease's read: a chunk, or a run of chunks. ``granted`` are the exact ranges the lease's grant
signs (the chunks' segments, merged where contiguous); ``wanted`` the parts of them the reader reads (a
tensor-parallel rank's slice, a run's merged ranges that differ from the signed ones), each inside one granted
range; none: all of the granted ranges. A connection carries one request at a time, many in a row.

The holder speaks first: a reader sends nothing on a connection until the hello names the agent it meant to
reach. An address and port come from a worker's own metadata; a port there that is some other service (another
process's data plane, an SSH server) never gets a request frame, whatever the metadata says.
Integers are big-endian. No pickle, no JSON on this path: fixed structs, sizes capped before anything is read.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import ipaddress
import json
import socket
import struct
from typing import Callable

MAGIC = b"THR2"
REQUEST = struct.Struct("!4sHII")
RANGE = struct.Struct("!QQ")
REPLY = struct.Struct("!BQ")
OK, REFUSED = 0, 1
MAX_GRANT = 256
MAX_RANGES = 1 << 16
MAX_REASON = 4096
RECV_PIECE = 1 << 20
"""Largest single recv_into: a cancelled read stops writing the reader's buffer within one piece."""
METADATA_PREFIX = b"tensorhub-tcp/1\n"
HELLO_MAGIC = b"THH1"
HELLO = struct.Struct("!4sH")
MAX_AGENT = 256


def memory(addr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` at ``addr`` in this process (registered, live CPU memory only)."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def block_with_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Blocking mode with the kernel's send/receive timeouts, instead of Python's (which makes the socket
    non-blocking and polls): a ``MSG_WAITALL`` receive then fills a whole piece in one call, without taking the
    GIL back for every few kilobytes that arrive. A receive that times out raises TimeoutError (recv_into_exact)."""
    sock.settimeout(None)
    seconds = int(timeout_s)
    timeval = struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    buffer = bytearray(nbytes)
    recv_into_exact(sock, memoryview(buffer))
    return bytes(buffer)


def recv_into_exact(sock: socket.socket, view: memoryview, progress: Callable[[int], None] | None = None) -> None:
    """Fills ``view`` from ``sock`` (whose timeout bounds each wait), calling ``progress(n)`` after each ``n``
    bytes that land. ConnectionError when the peer hangs up."""
    received, total = 0, len(view)
    while received < total:
        try:
            n = sock.recv_into(view[received:received + RECV_PIECE], 0, socket.MSG_WAITALL)
        except BlockingIOError as e:  # the kernel's receive timeout (block_with_timeout)
            raise TimeoutError(f"timed out: no bytes within the timeout, after {received} of {total}") from e
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {received} of {total} bytes")
        received += n
        if progress is not None:
            progress(n)


def encode_hello(agent: str) -> bytes:
    name = agent.encode()[:MAX_AGENT]
    return HELLO.pack(HELLO_MAGIC, len(name)) + name


def expect_hello(sock: socket.socket, agent: str, where: str) -> None:
    """Reads a holder's hello and checks that it names ``agent``; ConnectionError otherwise (the caller then
    sends nothing on this connection). The socket's timeout bounds the wait: a service that never speaks first
    costs one timeout."""
    try:
        magic, length = HELLO.unpack(recv_exact(sock, HELLO.size))
    except (TimeoutError, OSError) as e:
        raise ConnectionError(f"{where} sent no TensorHub hello ({e}): not agent {agent!r}'s TCP data plane; "
                              f"nothing was sent to it") from e
    if magic != HELLO_MAGIC or length > MAX_AGENT:
        raise ConnectionError(f"{where} is not a TensorHub TCP data plane (no hello): nothing was sent to it")
    name = recv_exact(sock, length).decode("utf-8", errors="replace")
    if name != agent[:MAX_AGENT]:
        raise ConnectionError(f"{where} serves agent {name!r}, not {agent!r}: the metadata names another "
                              f"process's port; nothing was sent to it")


def encode_metadata(agent_name: str, host: str, port: int) -> bytes:
    return METADATA_PREFIX + json.dumps({"agent": agent_name, "host": host, "port": port}).encode()


def decode_metadata(metadata: bytes) -> tuple[str, str, int]:
    """(agent, host, port); ValueError when ``metadata`` is not this plane's (e.g. a NIXL agent's)."""
    if not metadata.startswith(METADATA_PREFIX) or len(metadata) > 4096:
        raise ValueError("not TCP data-plane metadata (the peer may use another data plane)")
    fields = json.loads(metadata[len(METADATA_PREFIX):])
    agent, host, port = fields["agent"], fields["host"], fields["port"]
    if not isinstance(agent, str) or not isinstance(host, str) or not isinstance(port, int) or \
            not 0 < port < 65536:
        raise ValueError(f"malformed TCP data-plane metadata: {fields!r}")
    return agent, host, port


def advertised_host_problem(metadata: bytes, registered_from: str | None) -> str | None:
    """Why a worker registering from ``registered_from`` may not advertise ``metadata``, or None.

    Joiners connect to the address a worker advertises, so a worker may advertise only an address of its own:
    the one it registered from, or, registering over loopback, any address of this host. Otherwise a token
    holder could point every joiner at some other host's port. Metadata of another plane is not checked here."""
    try:
        _agent, host, _port = decode_metadata(metadata)
    except (ValueError, KeyError, TypeError):
        return None
    if registered_from is None or host == registered_from:
        return None
    try:
        source = ipaddress.ip_address(registered_from)
        advertised = ipaddress.ip_address(host)
    except ValueError:
        return f"the TCP plane's address must be an IP address, got {host!r}"
    if source.is_loopback and (advertised.is_loopback or str(advertised) in _local_addresses()):
        return None
    return (f"the TCP plane's advertised address {host} is not the address this worker registered from "
            f"({registered_from}): peers would connect to a host that is not this worker. Set "
            f"TcpConfig.host to this host's address on the route to the hub")


def advertises_own_address(metadata_b64: str, registered_from: str | None) -> bool:
    """Whether base64 ``metadata_b64`` is TCP-plane metadata naming exactly the address its worker registered
    from (the port is the worker's word; whether it is its data plane shows in the reads it served)."""
    try:
        _agent, host, _port = decode_metadata(base64.b64decode(metadata_b64, validate=True))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return False
    return registered_from is not None and host == registered_from


def _local_addresses() -> set[str]:
    """Every IP address of this host's interfaces."""
    import psutil

    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}

