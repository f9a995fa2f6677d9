"""`tensorhub bench fanout`: one publisher, N readers started together, on this machine.

Runs the same workload twice on the same transport: TensorHub (readers serve each other while they
fill) and naive (every reader pulls everything from the publisher). On loopback the 2 cores, not a
link, are the limit, so time cannot show the gain here; the publisher's load can.
"""

from __future__ import annotations

import argparse
import json
import time

from tensorhub_verl.bench.procs import Role, checksum, random_weights
from tensorhub_verl.ros.planes.config import PROGRESS_MODES


def _publisher(results, control, hub_url: str, size_mb: float, chunk_mb: float, progress: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, "publisher", chunk_bytes=int(chunk_mb * (1 << 20)), progress=progress)
    weights = random_weights(size_mb, seed=7)
    client.publish("policy", 1, weights)
    results.put(("ok", checksum(weights)))
    control.get(timeout=900)
    client.close()


def _reader(results, control, hub_url: str, name: str, hold: bool, progress: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, name, progress=progress)
    buffers = client.manifest("policy", 1).allocate()
    results.put(("ok", "ready"))
    control.get(timeout=300)  # start together
    stats = client.fetch("policy", 1, into=buffers, hold=hold)
    results.put(("ok", {"seconds": stats.seconds, "sources": stats.sources, "bytes": stats.bytes,
                        "partial_source_bytes": stats.partial_source_bytes,
                        "failed_reads": stats.failed_reads, "revoked_reads": stats.revoked_reads, "checksum": checksum(buffers),
                        "finished_at": time.time()}))
    control.get(timeout=900)  # keep holding until everyone is done
    client.close()


def run_once(readers: int, size_mb: float, chunk_mb: float, cooperative: bool, progress: str = "events") -> dict:
    import tensorhub_verl as th

    config = th.HubConfig(planner=th.PlannerConfig(cooperative=cooperative,
                                                   max_inflight_per_source=8 if cooperative else 8 * readers))
    hub = th.start_hub(config=config)
    roles: list[Role] = []
    try:
        publisher = Role(_publisher, hub.url, size_mb, chunk_mb, progress)
        roles.append(publisher)
        expected = publisher.result(120)
        group = [Role(_reader, hub.url, f"reader-{i}", cooperative, progress) for i in range(readers)]
        roles += group
        for role in group:
            role.result(120)
        started = time.time()
        for role in group:
            role.send("go")
        outcomes = [role.result(900) for role in group]
        wall = max(o["finished_at"] for o in outcomes) - started
        for role in roles:
            role.send("stop")
    finally:
        for role in roles:
            role.stop()
        hub.stop()
    bad = [i for i, o in enumerate(outcomes) if abs(o["checksum"] - expected) > 1e-6 * max(1.0, abs(expected))]
    if bad:
        raise RuntimeError(f"readers {bad} got bytes that differ from the publisher's")
    return {"seconds": wall, "version_bytes": outcomes[0]["bytes"],
            "publisher_bytes": sum(o["sources"].get("publisher", 0) for o in outcomes),
            "partial_source_bytes": sum(o["partial_source_bytes"] for o in outcomes),
            "per_reader_s": [round(o["seconds"], 3) for o in outcomes],
            "failed_reads": sum(o["failed_reads"] for o in outcomes),
            "revoked_reads": sum(o["revoked_reads"] for o in outcomes)}


def run(readers: int, size_mb: float, chunk_mb: float, progress: str = "events") -> dict:
    tensorhub = run_once(readers, size_mb, chunk_mb, cooperative=True, progress=progress)
    naive = run_once(readers, size_mb, chunk_mb, cooperative=False, progress=progress)
    return {
        "bench": "fanout", "readers": readers, "size_mb": size_mb, "chunk_mb": chunk_mb, "progress": progress,
        "version_bytes": tensorhub["version_bytes"],
        "publisher_bytes_tensorhub": tensorhub["publisher_bytes"],
        "publisher_bytes_naive": naive["publisher_bytes"],
        "publisher_load_ratio": round(tensorhub["publisher_bytes"] / tensorhub["version_bytes"], 3),
        "peer_bytes_while_filling": tensorhub["partial_source_bytes"],
        "tensorhub_s": round(tensorhub["seconds"], 3), "naive_s": round(naive["seconds"], 3),
        "speedup_vs_naive": round(naive["seconds"] / tensorhub["seconds"], 3),
        "failed_reads": tensorhub["failed_reads"], "revoked_reads": tensorhub["revoked_reads"],
        "tensorhub_per_reader_s": tensorhub["per_reader_s"], "naive_per_reader_s": naive["per_reader_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench fanout", description=__doc__)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--chunk-mb", type=float, default=8)
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="events")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    result = run(args.readers, args.size_mb, args.chunk_mb, args.progress)
    if not args.json:
        v = result["version_bytes"]
        print(f"{args.readers} readers, {v / 1e6:.0f} MB version")
        print(f"  publisher served: tensorhub {result['publisher_bytes_tensorhub'] / v:.2f} x version, "
              f"naive {result['publisher_bytes_naive'] / v:.2f} x version")
        print(f"  wall time:        tensorhub {result['tensorhub_s']:.2f} s, naive {result['naive_s']:.2f} s")
    print(json.dumps(result))
    return 0
