"""The baseline of `bench transport`: one server process sending the same bytes over plain TCP sockets to
``readers`` client processes, one connection each, each copy started on the parent's "go"."""

from __future__ import annotations

import socket
import threading
import time

import torch

from tensorhub_verl.bench.procs import Role

_TIMEOUT_S = 600.0


def server(results, control, nbytes: int, readers: int) -> None:
    payload = memoryview(torch.randint(0, 255, (nbytes,), dtype=torch.uint8).numpy())

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_TIMEOUT_S)
            while conn.recv(1):
                conn.sendall(payload)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(_TIMEOUT_S)
        results.put(("ok", listener.getsockname()[1]))
        threads = []
        for _ in range(readers):
            conn, _ = listener.accept()
            threads.append(threading.Thread(target=serve, args=(conn,), daemon=True))
            threads[-1].start()
        for thread in threads:
            thread.join(_TIMEOUT_S)
    results.put(("ok", "done"))


def client(results, control, port: int, nbytes: int) -> None:
    view = memoryview(torch.zeros(nbytes, dtype=torch.uint8).numpy())
    with socket.create_connection(("127.0.0.1", port), timeout=_TIMEOUT_S) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        copy(conn, view)  # warm-up
        results.put(("ok", "ready"))
        while control.get(timeout=_TIMEOUT_S) == "go":
            start = time.time()
            copy(conn, view)
            results.put(("ok", {"start": start, "end": time.time(), "bytes": nbytes}))


def copy(conn: socket.socket, view: memoryview) -> None:
    conn.sendall(b"g")
    received = 0
    while received < len(view):
        n = conn.recv_into(view[received:])
        if n == 0:
            raise ConnectionError("server closed early")
        received += n


def start(nbytes: int, readers: int) -> tuple[Role, list[Role]]:
    """The server and its ready clients."""
    srv = Role(server, nbytes, readers)
    port = srv.result(60)
    clients = [Role(client, port, nbytes) for _ in range(readers)]
    for c in clients:
        c.result(120)
    return srv, clients
