"""A reader's own CPU per chunk outside the data transfer (issue 21, item 3).

    python -m tensorhub_dev.bench.reader_cost [--chunks 12800] [--runs 1,150,1024] [--window 8]

Per point: a fresh hub process (`tensorhub hub`), a version of ``--chunks`` chunks published as ``bench control``
publishes it, and one real ``Client`` fetching it with runs of up to ``--runs`` chunks, over a transport that
lands every read the moment it is posted and moves no bytes (``_LandsAtOnce``). The reader process's CPU for
the fetch (user + system, every thread) is then what the reader spends apart from moving the bytes: the
fetcher's bookkeeping (posting each lease as one read of its chunks' merged ranges, polling, booking, run sizing),
the chunks' spans, and the exchanges' HTTP and JSON on its side. Digest checks are left out (the version is
published without digests to a hub started with ``--allow-unverified``) and timed apart: ``chunk_digest`` over
one chunk of ``--chunk-mib`` (8 MiB).

Measured: the reader's CPU per chunk and per exchange (chunks of 4 KiB: the bookkeeping does not depend on the
chunk's size), and the digest's CPU per 8 MiB chunk. Derived, not measured: the share of a chunk's transfer
time at ``--gbps`` (25 GB/s: 8 MiB in 0.34 ms) that the bookkeeping (and the digest, if hashed on the CPU)
would take. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import psutil
import torch

from tensorhub_verl.bench import positive_ints
from tensorhub_verl.bench.control import _CHUNK_BYTES, _publish
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.wire.integrity import chunk_digests
from tensorhub_verl.ros.wire.manifest import split_into_chunks, TensorSpec
from tensorhub_verl.ros.planes.base import DataPlane, ReadState


class _LandsAtOnce(DataPlane):
    """A data plane whose every read has landed when it is posted: the fetcher's costs without the
    transfer's."""

    name = "nixl"  # registers as the hub's one plane; needs no grant
    needs_grant = False
    lands_on_own_threads = False

    def register(self, tensors) -> bool:
        return False

    def unregister(self, tensors) -> None:
        pass

    def metadata(self) -> bytes:
        return b"none"

    def load_peer(self, agent_name: str, metadata: bytes) -> None:
        pass

    def _start_read(self, peer, copies, grant, wake) -> object:
        return peer

    def poll(self, handle: object) -> ReadState:
        return ReadState.DONE

    def release(self, handle: object) -> None:
        pass

    def close(self) -> None:
        pass


def run_point(chunks: int, run: int, window: int) -> dict:
    hub = HubProcess(args=("--worker-timeout", "3600", "--lease-ttl", "3600", "--allow-unverified")).start()
    try:
        _publish(hub.url, "m", chunks, grants=False, digests=False)
        into = {"w": torch.empty(chunks * _CHUNK_BYTES, dtype=torch.uint8)}
        config = ClientConfig.from_fields(window=window, max_run_chunks=run, hub_retry_s=60.0, require_digests=False)
        hub_proc, me = psutil.Process(hub.pid), psutil.Process()
        with Client(hub.url, "reader", "dc=dc0,rack=k0,node=n0", config=config, plane=_LandsAtOnce("reader-agent")) as client:
            hub0, cpu0, started = _cpu(hub_proc), _cpu(me), time.perf_counter()
            stats = client.fetch("m", 1, into=into, hold=False, timeout=600)
            cpu, hub_cpu, wall = _cpu(me) - cpu0, _cpu(hub_proc) - hub0, time.perf_counter() - started
    finally:
        hub.stop()
    return {"chunks": chunks, "run_chunks": run, "window": window, "exchanges": stats.exchanges,
            "reader_cpu_s": round(cpu, 4), "reader_cpu_per_chunk_ms": round(1e3 * cpu / chunks, 5),
            "reader_cpu_per_exchange_ms": round(1e3 * cpu / max(1, stats.exchanges), 4),
            "hub_cpu_s": round(hub_cpu, 4), "wall_s": round(wall, 3)}


def digest_ms(chunk_mib: int, repeats: int = 5) -> float:
    """CPU milliseconds to digest one chunk of ``chunk_mib`` MiB as the fetcher checks it (``chunk_digests``)."""
    nbytes = chunk_mib << 20
    tensor = torch.ones(nbytes, dtype=torch.uint8)
    (chunk,) = split_into_chunks((TensorSpec("w", (nbytes,), "uint8", nbytes),), nbytes)
    started = time.process_time()
    for _ in range(repeats):
        chunk_digests([chunk], [tensor])
    return 1e3 * (time.process_time() - started) / repeats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.reader_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=12_800, help="chunks in the version")
    parser.add_argument("--runs", type=positive_ints, default=[1, 150, 1024], help="max_run_chunks, e.g. 1,150,1024")
    parser.add_argument("--window", type=int, default=8, help="ClientConfig.window")
    parser.add_argument("--chunk-mib", type=int, default=8, help="chunk size the transfer time is given for")
    parser.add_argument("--gbps", type=float, default=25.0, help="the link the overhead is compared with (GB/s)")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    transfer_ms = 1e3 * (args.chunk_mib << 20) / (args.gbps * 1e9)
    digest = digest_ms(args.chunk_mib)
    points = []
    for run in args.runs:
        point = run_point(args.chunks, run, args.window)
        point["share_of_transfer"] = round(point["reader_cpu_per_chunk_ms"] / transfer_ms, 4)
        points.append(point)
        print(f"runs of {run:>4}: {point['exchanges']} exchanges, reader CPU {point['reader_cpu_s']:.2f} s = "
              f"{point['reader_cpu_per_chunk_ms']:.4f} ms per chunk ({100 * point['share_of_transfer']:.1f}% of "
              f"{transfer_ms:.2f} ms, a {args.chunk_mib} MiB chunk at {args.gbps:g} GB/s), "
              f"{point['reader_cpu_per_exchange_ms']:.2f} ms per exchange; hub CPU {point['hub_cpu_s']:.2f} s",
              flush=True)
    print(f"digest of one {args.chunk_mib} MiB chunk on this CPU: {digest:.2f} ms "
          f"({digest / transfer_ms:.1f}x its transfer at {args.gbps:g} GB/s; not in the figures above)")
    print(json.dumps({"bench": "reader_cost", "chunk_mib": args.chunk_mib, "gbps": args.gbps,
                      "transfer_ms_per_chunk": round(transfer_ms, 4), "digest_ms_per_chunk": round(digest, 3),
                      "points": points}))
    return 0


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    raise SystemExit(main())
