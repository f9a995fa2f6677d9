"""TCP rate probe run inside lab hosts: `python -m tensorhub_dev.netlab.probe serve|send ...`.

The receiver times from the first byte to EOF and prints one JSON line; that is the measured rate
(the sender's clock would include bytes still sitting in its socket buffer).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

_BLOCK = 1 << 20


def serve(host: str, port: int, timeout: float) -> dict:
    with socket.create_server((host, port), reuse_port=False) as srv:
        srv.settimeout(timeout)
        print("READY", flush=True)
        conn, peer = srv.accept()
        with conn:
            conn.settimeout(timeout)
            buf = bytearray(_BLOCK)
            n = conn.recv_into(buf)
            t0 = time.perf_counter()
            total = n
            while n:
                n = conn.recv_into(buf)
                total += n
            dt = time.perf_counter() - t0
    return {"bytes": total, "seconds": dt, "mbit_s": total * 8 / dt / 1e6 if dt > 0 else None, "peer": peer[0]}


def send(host: str, port: int, nbytes: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=timeout)
            break
        except (ConnectionRefusedError, OSError):
            # The server may not be listening yet; retry until the deadline.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    block = b"\0" * _BLOCK
    t0 = time.perf_counter()
    with conn:
        left = nbytes
        while left > 0:
            conn.sendall(block[: min(left, _BLOCK)])
            left -= min(left, _BLOCK)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver to close: all bytes delivered
    return {"bytes": nbytes, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.netlab.probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--timeout", type=float, default=120.0)
    c = sub.add_parser("send")
    c.add_argument("--host", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--bytes", type=int, required=True)
    c.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    res = serve(a.host, a.port, a.timeout) if a.cmd == "serve" else send(a.host, a.port, a.bytes, a.timeout)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
