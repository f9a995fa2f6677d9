"""The TCP data plane's frames, and raw-memory views, shared by its server (holder) and its reader.

    reader -> holder   REQUEST  magic "THR2" | grant length u16 | granted u32 | wanted u32 | grant
                                | granted (addr u64, length u64)* | wanted (addr u64, length u64)*
    holder -> reader   REPLY    status u8 | length u64 | the wanted ranges' bytes, in order (status OK)
                                                       | why, utf-8 (status REFUSED; then the holder hangs up)

One request is one lease's chunk. ``granted`` are the exact ranges the lease's grant signs (the chunk's
segments); ``wanted`` the parts of them the reader reads (a tensor-parallel rank's slice), each inside one
granted range; none: all of the granted ranges. A connection carries one request at a time, many in a row.
Integers are big-endian. No pickle, no JSON on this path: fixed structs, sizes capped before anything is read.
"""

from __future__ import annotations

import ctypes
import json
import socket
import struct

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


def recv_into_exact(sock: socket.socket, view: memoryview, hasher=None) -> None:
    """Fills ``view`` from ``sock`` (whose timeout bounds each wait). ConnectionError when the peer hangs up.
    ``hasher``: updated with each piece just after it lands, while the piece is still in the CPU's cache."""
    received, total = 0, len(view)
    while received < total:
        try:
            n = sock.recv_into(view[received:received + RECV_PIECE], 0, socket.MSG_WAITALL)
        except BlockingIOError as e:  # the kernel's receive timeout (block_with_timeout)
            raise TimeoutError(f"timed out: no bytes within the timeout, after {received} of {total}") from e
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {received} of {total} bytes")
        if hasher is not None:
            hasher.update(view[received:received + n])
        received += n


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
