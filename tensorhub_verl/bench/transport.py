"""`tensorhub bench transport`: one holder, one reader, separate processes, warm connection.

Compares a ROS fetch with a plain TCP socket copy of the same bytes between two processes, in the same run.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time

import torch

from tensorhub_verl.bench.procs import Role, random_weights
from tensorhub_verl.ros.nixl_transport import PROGRESS_MODES


def _holder(results, control, hub_url: str, size_mb: float, chunk_mb: float, progress: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, "bench-holder", chunk_bytes=int(chunk_mb * (1 << 20)), progress=progress)
    client.publish("bench", 1, random_weights(size_mb))
    results.put(("ok", "ready"))
    control.get(timeout=600)
    client.close()


def _reader(results, control, hub_url: str, repeats: int, window: int, progress: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, "bench-reader", window=window, progress=progress)
    buffers = client.manifest("bench", 1).allocate()
    client.fetch("bench", 1, into=buffers, hold=False)  # warm-up: connection set-up, registration
    seconds = []
    for _ in range(repeats):
        stats = client.fetch("bench", 1, into=buffers, hold=False)
        seconds.append(stats.seconds)
    client.close()
    results.put(("ok", {"seconds": seconds, "bytes": stats.bytes}))


def _socket_server(results, control, nbytes: int, repeats: int) -> None:
    payload = memoryview(torch.randint(0, 255, (nbytes,), dtype=torch.uint8).numpy())
    with socket.create_server(("127.0.0.1", 0)) as server:
        results.put(("ok", server.getsockname()[1]))
        conn, _ = server.accept()
        with conn:
            for _ in range(repeats + 1):
                conn.recv(1)
                conn.sendall(payload)
    results.put(("ok", "done"))


def _socket_client(results, control, port: int, nbytes: int, repeats: int) -> None:
    buffer = torch.empty(nbytes, dtype=torch.uint8).numpy()
    view = memoryview(buffer)
    seconds = []
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(repeats + 1):
            start = time.perf_counter()
            conn.sendall(b"g")
            received = 0
            while received < nbytes:
                n = conn.recv_into(view[received:], nbytes - received)
                if n == 0:
                    raise ConnectionError("server closed early")
                received += n
            if i:  # the first copy is the warm-up
                seconds.append(time.perf_counter() - start)
    results.put(("ok", seconds))


def run(size_mb: float, repeats: int, chunk_mb: float, window: int, progress: str = "events") -> dict:
    import tensorhub_verl as th

    hub = th.start_hub()
    try:
        holder = Role(_holder, hub.url, size_mb, chunk_mb, progress)
        holder.result(120)
        reader = Role(_reader, hub.url, repeats, window, progress)
        th_result = reader.result(600)
        holder.send("stop")
        for role in (reader, holder):
            role.stop()
    finally:
        hub.stop()
    nbytes = th_result["bytes"]
    server = Role(_socket_server, nbytes, repeats)
    port = server.result(60)
    client = Role(_socket_client, port, nbytes, repeats)
    raw_seconds = client.result(600)
    server.result(60)
    for role in (client, server):
        role.stop()
    th_gbps = nbytes / statistics.median(th_result["seconds"]) / 1e9
    raw_gbps = nbytes / statistics.median(raw_seconds) / 1e9
    return {"bench": "transport", "size_mb": size_mb, "bytes": nbytes, "repeats": repeats,
            "chunk_mb": chunk_mb, "window": window, "progress": progress,
            "tensorhub_gbps": round(th_gbps, 3), "raw_socket_gbps": round(raw_gbps, 3),
            "ratio": round(th_gbps / raw_gbps, 3), "unit": "GB/s (1e9 bytes/s), median of repeats"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench transport", description=__doc__)
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mb", type=float, default=8)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="events",
                        help="who drives UCX in the holder (see NixlTransport)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    result = run(args.size_mb, args.repeats, args.chunk_mb, args.window, args.progress)
    if not args.json:
        print(f"tensorhub {result['tensorhub_gbps']:.2f} GB/s   raw socket {result['raw_socket_gbps']:.2f} GB/s   "
              f"ratio {result['ratio']:.2f}  ({result['bytes'] / 1e6:.0f} MB, median of {args.repeats})")
    print(json.dumps(result))
    return 0
