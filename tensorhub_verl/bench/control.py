"""`tensorhub bench control`: the hub's cost per update, alone (no data plane), over a sweep of sizes.

For each model size (``--chunks``: chunks of ``--chunk-mib`` in the version) and reader count (``--readers``): a
fresh hub process, one trainer worker that publishes the version, and ``--procs`` load processes
(``bench.control_readers``) driving the synthetic readers over the real protocol (begin, exchanges, end holding
the version). Reads "land" at once, or at ``--rate`` chunks/s per reader. Readers sit ``--gpus-per-node`` to a
node and ``--nodes-per-rack`` nodes to a rack; the trainer is on a node of its own in the first rack.

Per point it prints the hub process's CPU (user + system) for the update, per exchange (begins included) and
per chunk read, exchanges per reader, and the longest time a reader waited for an answer that carried work
(idle long-polls of 0.2 s are not waits). A point that does not finish in ``--max-seconds`` stops there: its
per-exchange and per-read figures are measured on what it did, and its CPU per update is extrapolated from the
CPU per chunk read (``extrapolated: true``). The last line is JSON.

``--run-chunks N`` has each reader ask for leases that cover runs of up to N consecutive chunks (``auto``: sized
from ``--rate`` as the fetcher sizes them from its measured throughput, ``--run-target-s`` of reads per run);
a chunk read is then one chunk of a run, and the JSON also gives leases and chunks per exchange.

``--shards K`` runs the hub as K hub processes (``ros/client/shares.py``): the version is published as K shares of about
chunks / K chunks, one per shard, and each reader fetches the K shares at once. The hub's CPU is then summed over
the shards, and the busiest shard's CPU is the critical path (each shard on a core of its own). ``--split
readers`` measures the other way to split, regions (``ros/wire/regions.py``): every shard serves the whole version to
a share of the readers (contiguous blocks of nodes), each reader talking to its shard only; its extrapolation
keeps the readers per hub process as measured and adds processes (1,024 / that many regions). With
``--relay-fanout F`` the regions form a tree of F children per region (``regions.relay_parents``): the trainer's
copy in a region with a parent is a standby, that region's readers wait until a reader of the parent region that
completed the version registers its copy there (``<reader>~relay``), as ``RegionalClient`` does. Every point
reports the chunk reads the trainer served (``trainer_copies``: in copies of the version) and those served by
relays.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

import httpx
import psutil

from tensorhub_verl.bench import positive_ints
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.ros.wire.integrity import ALGORITHM
from tensorhub_verl.ros.wire.manifest import TensorSpec, layout_digest
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER, MAX_RUN_CHUNKS, STANDBY_SUFFIX
from tensorhub_verl.ros.wire.regions import relay_children, relay_layout, relay_parents
from tensorhub_verl.ros.client.shares import share_layout

_CHUNK_BYTES = 4096
"""The chunk size the hub sees: the hub's work per chunk does not depend on it, and a small one keeps the
synthetic regions small. Model sizes are reported in ``--chunk-mib`` chunks."""
_TARGET_READERS = 1024
_TARGET_CHUNKS = 12_800
"""The extrapolation target: 1,024 readers of a 100 GB version in 8 MiB chunks."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench control", description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=positive_ints, default=(256, 1024), help="chunks in the version, e.g. 256,12800")
    parser.add_argument("--readers", type=positive_ints, default=(8, 64), help="synthetic readers, e.g. 8,64,256")
    parser.add_argument("--chunk-mib", type=float, default=8.0, help="chunk size the model sizes are given in")
    parser.add_argument("--window", type=int, default=8, help="reads a reader asks for per exchange (ClientConfig.window)")
    parser.add_argument("--rate", type=float, default=0.0, help="chunks/s each reader lands (0: at once)")
    parser.add_argument("--run-chunks", default="1",
                        help="longest run of chunks per lease a reader asks for (1..1024), or 'auto': from --rate")
    parser.add_argument("--run-target-s", type=float, default=0.05,
                        help="with --run-chunks auto: a run takes this long at --rate (ClientConfig.run_target_s)")
    parser.add_argument("--procs", type=int, default=2, help="load processes sharing the readers")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes-per-rack", type=int, default=8)
    parser.add_argument("--grants", action="store_true", help="workers register grant keys (the TCP plane's cost)")
    parser.add_argument("--shards", type=int, default=1, help="hub processes, each serving a share of the version")
    parser.add_argument("--split", choices=("chunks", "readers"), default="chunks",
                        help="with --shards: each shard serves a share of the chunks to every reader (a sharded "
                             "client), or the whole version to a share of the readers")
    parser.add_argument("--relay-fanout", type=int, default=0,
                        help="with --split readers: regions fed by a reader of a parent region, this many "
                             "children per region (0: every region from the trainer)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop a point after this long")
    parser.add_argument("--connections", type=int, default=64, help="HTTP connections per load process")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.window < 1 or args.procs < 1 or args.rate < 0 or args.max_seconds <= 0 or args.shards < 1:
        parser.error("--window, --procs and --shards must be >= 1, --rate >= 0, --max-seconds > 0")
    if args.relay_fanout < 0 or (args.relay_fanout and args.split != "readers"):
        parser.error("--relay-fanout needs --split readers and must be >= 0")
    if any(chunks < args.shards for chunks in args.chunks):
        parser.error("every --chunks must be >= --shards (a shard serves at least one chunk)")
    args.run_chunks = _run_chunks(args, parser)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    points = []
    for chunks in args.chunks:
        for readers in args.readers:
            point = run_point(chunks, readers, args)
            points.append(point)
            if not args.json:
                print(_row(point), flush=True)
    report = {"bench": "control", "shards": args.shards, "split": args.split, "relay_fanout": args.relay_fanout,
              "window": args.window, "rate": args.rate, "run_chunks": args.run_chunks,
              "chunk_mib": args.chunk_mib,
              "grants": args.grants, "points": points, "extrapolated_1024_readers_100GB": _extrapolate(points)}
    if not args.json:
        print(f"extrapolated to {_TARGET_READERS} readers x {_TARGET_CHUNKS} chunks (from the largest point; with "
              f"--split readers, as regions of the readers one shard served): "
              f"{report['extrapolated_1024_readers_100GB']}")
    print(json.dumps(report))
    return 0


def _run_chunks(args, parser) -> int:
    """The run length readers ask for: as given, or as the fetcher sizes it (``ChunkFetcher._run_chunks``)."""
    if args.run_chunks == "auto":
        if not args.rate or args.run_target_s <= 0:
            parser.error("--run-chunks auto needs --rate and --run-target-s > 0")
        return max(1, min(MAX_RUN_CHUNKS, int(args.rate * args.run_target_s)))
    try:
        run = int(args.run_chunks)
    except ValueError:
        parser.error(f"--run-chunks must be an integer or 'auto', got {args.run_chunks!r}")
    if not 1 <= run <= MAX_RUN_CHUNKS:
        parser.error(f"--run-chunks must be in [1, {MAX_RUN_CHUNKS}]")
    return run


def run_point(chunks: int, readers: int, args) -> dict:
    """One fresh hub, one version of ``chunks`` chunks, ``readers`` synthetic readers fetching it at once."""
    hubs: list[HubProcess] = []
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(args.shards):
            hubs.append(HubProcess(args=("--worker-timeout", "3600", "--lease-ttl", "3600",
                                         "--plane", "tcp" if args.grants else "nixl")).start())
        model = "m"
        shards = []
        regions = [f"dc0/r{i}" for i in range(args.shards)]  # one per hub process, in order
        parents = relay_parents(regions, args.relay_fanout)
        children = relay_children(regions, args.relay_fanout)
        for index, hub in enumerate(hubs):
            by_chunks = args.split == "chunks"
            layout = share_layout("hf", index, args.shards) if by_chunks else "hf"
            share = chunks // args.shards + (index < chunks % args.shards) if by_chunks else chunks
            fed = parents[regions[index]] is not None
            holder = "trainer" + STANDBY_SUFFIX if fed else "trainer"
            shards.append({"url": hub.url, "layout": layout, "fed": fed, "manifest": _manifest(model, share, layout),
                           "marker_manifest": _manifest(model, 1, relay_layout(layout)),
                           "children": [regions.index(child) for child in children[regions[index]]],
                           "digest": _publish(hub.url, model, share, args.grants, layout=layout, holder=holder)})
        names = [f"r{i}" for i in range(readers)]
        locations = [{"dc": "dc0", "rack": f"k{i // (args.gpus_per_node * args.nodes_per_rack)}",
                      "node": f"n{i // args.gpus_per_node}"} for i in range(readers)]
        everyone = list(range(args.shards))
        reader_shards = [everyone if args.split == "chunks" else [i * args.shards // readers]
                         for i in range(readers)]
        env = dict(os.environ)
        for p in range(min(args.procs, readers)):
            job = {"shards": shards, "reader_shards": reader_shards[p::args.procs], "model": model,
                   "readers": names[p::args.procs],
                   "locations": locations[p::args.procs], "window": args.window, "rate": args.rate,
                   "run_chunks": args.run_chunks,
                   "location_of": dict(zip(names, locations)) if args.relay_fanout else {},
                   "grants": args.grants, "max_seconds": args.max_seconds, "connections": args.connections}
            proc = subprocess.Popen([sys.executable, "-m", "tensorhub_verl.bench.control_readers"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            procs.append(proc)
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a load process failed to register its readers (see its stderr)")
        hub_procs = [psutil.Process(hub.pid) for hub in hubs]
        cpu0, started = [cpu_seconds(p) for p in hub_procs], time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=args.max_seconds + 600)
            if proc.returncode != 0:
                raise RuntimeError(f"a load process exited with {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.perf_counter() - started
        cpus = [cpu_seconds(p) - before for p, before in zip(hub_procs, cpu0)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for hub in hubs:
            hub.stop()
    return _summarize(chunks, readers, args, cpus, wall, results)


def _summarize(chunks: int, readers: int, args, cpus: list[float], wall: float, results: list[dict]) -> dict:
    """``cpus``: each shard's hub CPU. Per update, the shards' sum and the busiest shard's share of it (the
    critical path); an unfinished point scales both by its CPU per chunk read."""
    cpu = sum(cpus)
    exchanges = sum(r["exchanges"] for r in results)
    reads = sum(r["reads"] for r in results)
    leases = sum(r["leases"] for r in results)
    done = sum(r["done"] for r in results)
    waits = sorted(w for r in results for w in r["waits"])
    complete = done == readers
    per_read = cpu / reads if reads else None
    scale = 1.0 if complete or not reads else readers * chunks / reads
    return {
        "chunks": chunks, "readers": readers, "model_gb": round(chunks * args.chunk_mib / 1024, 2),
        "complete": complete, "readers_done": done, "reads": reads, "leases": leases,
        "shards": len(cpus), "hub_cpu_s": round(cpu, 3), "hub_cpu_per_shard_s": [round(c, 3) for c in cpus],
        "wall_s": round(wall, 3),
        "critical_path_per_update_s": round(max(cpus) * scale, 3), "split": args.split, "chunks_scale": round(scale, 4),
        "hub_cpu_per_update_s": round(cpu if complete else (per_read or 0) * readers * chunks, 3),
        "extrapolated": not complete,
        "hub_cpu_per_exchange_ms": round(1000 * cpu / exchanges, 4) if exchanges else None,
        "hub_cpu_per_chunk_read_ms": round(1000 * per_read, 5) if per_read else None,
        "exchanges_per_reader": round(exchanges / readers, 1),
        "exchanges_per_reader_per_shard": round(exchanges / readers / (len(cpus) if args.split == "chunks" else 1), 1),
        "reads_per_exchange": round(reads / exchanges, 2) if exchanges else None,
        "leases_per_exchange": round(leases / exchanges, 2) if exchanges else None,
        "peer_read_share": round(sum(r.get("from_peers", 0) for r in results) / reads, 3) if reads else None,
        "trainer_reads": sum(r["from_trainer"] for r in results),
        "trainer_copies": round(sum(r["from_trainer"] for r in results) / chunks, 2),
        "relay_reads": sum(r["from_relays"] for r in results), "relays": sum(r["relays"] for r in results),
        "relay_polls": sum(r["relay_polls"] for r in results),
        "slowest_reader_s": round(max((s for r in results for s in r["reader_seconds"]), default=0.0), 3),
        "idle_waits_per_reader": round(sum(r["idle_waits"] for r in results) / readers, 1),
        "max_wait_s": round(max(r["max_wait_s"] for r in results), 4),
        "p50_wait_ms": round(1000 * waits[len(waits) // 2], 3) if waits else None,
        "p99_wait_ms": round(1000 * waits[min(len(waits) - 1, int(len(waits) * 0.99))], 3) if waits else None,
    }


def _extrapolate(points: list[dict]) -> dict:
    """Hub CPU for 1,024 readers x 12,800 chunks, scaled from the point with the most chunk reads: its CPU per
    chunk read times the target's reads (an extrapolation: it assumes the per-read cost stays what it was there).
    The critical path scales the same way, by the busiest shard's share of the CPU."""
    best = max((p for p in points if p["hub_cpu_per_chunk_read_ms"]), key=lambda p: (p["readers"] * p["chunks"]),
               default=None)
    if best is None:
        return {}
    per_read_s = best["hub_cpu_per_chunk_read_ms"] / 1000
    total = per_read_s * _TARGET_READERS * _TARGET_CHUNKS
    busiest = max(best["hub_cpu_per_shard_s"]) / best["hub_cpu_s"] if best["hub_cpu_s"] else 1.0
    out = {"from_readers": best["readers"], "from_chunks": best["chunks"], "extrapolated": True,
           "shards": best["shards"], "hub_cpu_per_update_s": round(total, 1),
           "critical_path_per_update_s": round(total * busiest, 2)}
    if best.get("split") == "readers" and best["shards"] > 1:
        # Regions: keep each hub process's readers as measured and add processes (1,024 / readers per process of
        # them), so the critical path is the busiest process's CPU per update scaled to the target's chunks only.
        per_region = best["readers"] / best["shards"]
        critical = max(best["hub_cpu_per_shard_s"]) * best["chunks_scale"] * _TARGET_CHUNKS / best["chunks"]
        out.update(readers_per_region=per_region, regions=round(_TARGET_READERS / per_region),
                   hub_cpu_per_update_s=round(best["hub_cpu_per_update_s"] * _TARGET_READERS / best["readers"]
                                              * _TARGET_CHUNKS / best["chunks"], 1),
                   critical_path_per_update_s=round(critical, 3))
    return out


def _manifest(model: str, chunks: int, layout: str, digests: bool = True) -> dict:
    """The synthetic version's manifest as a publish carries it: one tensor of ``chunks`` chunks; ``digests``: with
    placeholder chunk digests (the hub stores them; only readers check them), else none."""
    tensor = TensorSpec("w", (chunks * _CHUNK_BYTES,), "uint8", chunks * _CHUNK_BYTES)
    return {"model": model, "version": 1, "layout": layout, "chunk_bytes": _CHUNK_BYTES,
            "tensors": [{"name": tensor.name, "shape": list(tensor.shape), "dtype": tensor.dtype,
                         "nbytes": tensor.nbytes}],
            "chunk_digests": ["0" * 16] * chunks if digests else [], "digest_algorithm": ALGORITHM}


def _publish(url: str, model: str, chunks: int, grants: bool, digests: bool = True, layout: str = "hf",
             holder: str = "trainer") -> str:
    """Publishes one version of ``chunks`` chunks as a trainer that registered no memory; ``digests``: with
    placeholder chunk digests, else none (a hub started with ``--allow-unverified`` takes it)."""
    import base64

    tensor = TensorSpec("w", (chunks * _CHUNK_BYTES,), "uint8", chunks * _CHUNK_BYTES)
    with httpx.Client(base_url=url, timeout=120) as http:
        body = {"worker": "trainer", "location": {"dc": "dc0", "rack": "k0", "node": "trainer"},
                "agent_name": "trainer-agent", "agent_metadata_b64": "AAAA"}
        if grants:
            body["grant_key_b64"] = base64.b64encode(os.urandom(32)).decode()
            body["plane"] = "tcp"
        reply = http.post("/v1/workers/register", json=body)
        reply.raise_for_status()
        headers = {CREDENTIAL_HEADER: reply.json()["credential"]}
        reply = http.post("/v1/publish", headers=headers, json={
            "worker": "trainer", "holder": holder, "regions": [{"addr": 1 << 20}],
            "manifest": _manifest(model, chunks, layout, digests)})
        reply.raise_for_status()
    return layout_digest(layout, [tensor], _CHUNK_BYTES)


def cpu_seconds(process: psutil.Process) -> float:
    """A process's CPU seconds so far (user + system): the hub's, for ``bench control`` and ``bench hub``."""
    times = process.cpu_times()
    return times.user + times.system


def _row(p: dict) -> str:
    mark = " (extrapolated)" if p["extrapolated"] else ""
    return (f"readers {p['readers']:>4}  chunks {p['chunks']:>6} ({p['model_gb']:g} GB)  hub CPU/update "
            f"{p['hub_cpu_per_update_s']:.3f} s{mark}  critical path ({p['shards']} shard(s)) "
            f"{p['critical_path_per_update_s']:.3f} s  /exchange {p['hub_cpu_per_exchange_ms']} ms  /chunk read "
            f"{p['hub_cpu_per_chunk_read_ms']} ms  exchanges/reader {p['exchanges_per_reader']}  chunks/exchange "
            f"{p['reads_per_exchange']}  leases/exchange {p['leases_per_exchange']}  from peers "
            f"{p['peer_read_share']}  max wait "
            f"{p['max_wait_s']} s  wall {p['wall_s']} s")


if __name__ == "__main__":
    sys.exit(main())
