"""Processes of `tensorhub bench modes`, each run inside one lab host (`python -m ... <role> ...`).

Roles talk to the hub over the lab network. They report to the orchestrator (outside the lab, no address
in it) with one JSON object per stdout line, and take orders through files in a shared directory:
a role waits for `--go` before it acts and for `--stop` before it lets go of what it holds.

- hub: an embedded hub on the host's lab address.
- trainer: publishes `policy` v1, plus the same tensors (no copy) as `pull-<i>` v1 for each baseline
  reader: a model only the trainer holds, so a baseline fetch reads every chunk from the trainer over the
  same transport, with the same client code.
- reader: allocates buffers, waits for go, fetches, reports FetchStats, holds until stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_POLL_S = 0.02


def _say(**event) -> None:
    print(json.dumps(event), flush=True)


def _wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout:.0f}s")
        time.sleep(_POLL_S)


def _location(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(","))


def hub(a: argparse.Namespace) -> None:
    import tensorhub_verl as th

    server = th.start_hub(host=a.host, port=a.port)
    _say(event="ready", url=server.url)
    try:
        _wait_file(a.stop, a.timeout)
    finally:
        server.stop()


def trainer(a: argparse.Namespace) -> None:
    import tensorhub_verl as th
    from tensorhub_verl.bench.procs import random_weights

    client = th.connect(a.hub, "trainer", _location(a.location), chunk_bytes=int(a.chunk_mb * (1 << 20)))
    weights = random_weights(a.size_mb, seed=1)
    client.publish("policy", 1, weights)
    for i in range(a.private_copies):
        client.publish(f"pull-{i}", 1, weights)
    _say(event="ready", bytes=sum(t.numel() * t.element_size() for t in weights.values()))
    try:
        _wait_file(a.stop, a.timeout)
    finally:
        client.close()


def reader(a: argparse.Namespace) -> None:
    import tensorhub_verl as th

    client = th.connect(a.hub, a.worker, _location(a.location), window=a.window)
    try:
        buffers = client.manifest(a.model, 1).allocate()
        _say(event="ready")
        _wait_file(a.go, a.timeout)
        started = time.time()
        stats = client.fetch(a.model, 1, into=buffers, hold=a.hold, timeout=a.timeout)
        _say(event="fetched", worker=a.worker, model=a.model, started=started, seconds=stats.seconds,
             bytes=stats.bytes, sources=stats.sources, partial_source_bytes=stats.partial_source_bytes)
        if a.hold:
            _wait_file(a.stop, a.timeout)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_verl.bench.modes_roles")
    ap.add_argument("role", choices=["hub", "trainer", "reader"])
    ap.add_argument("--stop", type=Path, required=True)
    ap.add_argument("--go", type=Path)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--host")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--hub")
    ap.add_argument("--location", default="dc=dc0,rack=r0,node=n0")
    ap.add_argument("--size-mb", type=float, default=32)
    ap.add_argument("--chunk-mb", type=float, default=1)
    ap.add_argument("--private-copies", type=int, default=0)
    ap.add_argument("--worker")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--hold", action="store_true")
    a = ap.parse_args(argv)
    try:
        {"hub": hub, "trainer": trainer, "reader": reader}[a.role](a)
    except Exception as e:  # report, so the orchestrator fails with the reason instead of a timeout
        _say(event="error", role=a.role, error=f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
