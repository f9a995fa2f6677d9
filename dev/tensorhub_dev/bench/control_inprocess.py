"""The hub's CPU for one update with no HTTP and no load processes: ``HubState`` driven in-process.

    PYTHONPATH=.:dev python -m tensorhub_dev.bench.control_inprocess --readers 64 --chunks 12800 --run-chunks 1024

One trainer (a node of its own in the first rack) publishes ``--chunks`` chunks; ``--readers`` readers, placed as
``bench control`` places them (``--gpus-per-node`` to a node, ``--nodes-per-rack`` nodes to a rack), fetch it, each
asking for a window of ``--window`` leases of up to ``--run-chunks`` chunks and landing every assigned read at once.
Prints the process CPU of the update, exchanges, CPU per exchange and per reader (``--profile``: the top of a
cProfile of it). The hub's own work per update, apart from HTTP (docs/control-plane.md). The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub import fetch_routes
from tensorhub_verl.ros.hub.state_calls import InlineCalls
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_verl.ros.wire.convert import manifest_to_msg

_CHUNK = 4096
_WAIT_S = 0.2
"""A parked reader's ``wait_s`` (``--parked``), as the fetcher's."""


def run(readers: int, chunks: int, run_chunks: int, window: int, gpus_per_node: int, nodes_per_rack: int,
        config: HubConfig | None = None, parked: bool = False) -> dict:
    tensor = TensorSpec("w", (chunks * _CHUNK,), "uint8", chunks * _CHUNK)
    manifest = Manifest("m", 1, "hf", (tensor,), _CHUNK, "f")
    hub = HubState(config or HubConfig(lease_ttl_s=3600, worker_timeout_s=3600))
    plans = [0]
    plan = hub.exchange

    def counted(*args):
        plans[0] += 1
        return plan(*args)
    hub.exchange = counted
    key = dict(model="m", version=1, layout="hf")

    credentials: dict[str, str] = {}

    def register(worker: str, rack: str, node: str) -> None:
        credentials[worker] = hub.register_worker(msg.RegisterWorker(
            worker=worker, location=msg.LocationMsg(dc="dc0", rack=rack, node=node), agent_name=f"{worker}-agent",
            agent_metadata_b64="AAAA")).credential

    register("trainer", "k0", "trainer")
    manifest_msg = manifest_to_msg(manifest).model_copy(update={"chunk_digests": ["0" * 16] * chunks})
    hub.publish(msg.Publish(worker="trainer", holder="trainer", manifest=manifest_msg,
                            regions=[msg.RegionMsg(addr=1 << 20)]))
    names = [f"r{i}" for i in range(readers)]
    for i, name in enumerate(names):
        register(name, f"k{i // (gpus_per_node * nodes_per_rack)}", f"n{i // gpus_per_node}")
        hub.begin_fetch(msg.BeginFetch(worker=name, holder=name, digest=manifest.digest,
                                       regions=[msg.RegionMsg(addr=1 << 20)], **key))
    landed: dict[str, list[int]] = {name: [] for name in names}
    done: set[str] = set()
    exchanges = leases = from_trainer = 0
    started = time.process_time()
    if parked:
        exchanges, leases, from_trainer = asyncio.run(_parked_readers(hub, names, credentials, key, window,
                                                                      run_chunks))
        done.update(names)
    while len(done) < readers:
        for name in names:
            if name in done:
                continue
            reply = hub.exchange(msg.Exchange(worker=name, holder=name, completed=landed[name], want=window,
                                              run_chunks=run_chunks, **key))
            exchanges += 1
            landed[name] = [a.lease for a in reply.assignments]
            leases += len(reply.assignments)
            from_trainer += sum(a.count for a in reply.assignments if a.source == "trainer")
            if reply.have == reply.total and not landed[name]:
                hub.end_fetch(msg.EndFetch(worker=name, holder=name, ok=True, hold=True, **key))
                done.add(name)
    cpu = time.process_time() - started
    extra = {"woken": hub.changes.woken, "plans": plans[0]} if parked else {}
    return extra | {"readers": readers, "chunks": chunks, "run_chunks": run_chunks, "hub_cpu_s": round(cpu, 3),
            "exchanges": exchanges, "exchanges_per_reader": round(exchanges / readers, 1),
            "hub_cpu_per_exchange_ms": round(1000 * cpu / exchanges, 3),
            "hub_cpu_per_reader_ms": round(1000 * cpu / readers, 2),
            "leases_per_exchange": round(leases / exchanges, 2),
            "peer_read_share": round(1 - from_trainer / (readers * chunks), 4)}


async def _parked_readers(hub: HubState, names: list[str], credentials: dict[str, str], key: dict, window: int,
                          run_chunks: int) -> tuple[int, int, int]:
    """Every reader a coroutine that reports its landed reads in an exchange that waits for work (``wait_s``), as
    ``bench control``'s readers do, through the hub's own route (``fetch_routes.exchange``: parking and wakes);
    the state calls run on the loop (no threads). Returns exchanges, leases and chunk reads from the trainer."""
    counts = [0, 0, 0]

    async def reader(name: str) -> None:
        completed: list[int] = []
        while True:
            reply = await fetch_routes.exchange(hub, InlineCalls(), msg.Exchange(
                worker=name, holder=name, completed=completed, want=window, run_chunks=run_chunks,
                wait_s=_WAIT_S, **key), credentials[name])
            counts[0] += 1
            completed = [a.lease for a in reply.assignments]
            counts[1] += len(completed)
            counts[2] += sum(a.count for a in reply.assignments if a.source == "trainer")
            if reply.have == reply.total and not completed:
                hub.end_fetch(msg.EndFetch(worker=name, holder=name, ok=True, hold=True, **key))
                return
            await asyncio.sleep(0)  # the reads "land": other readers run meanwhile

    await asyncio.gather(*(reader(name) for name in names))
    return counts[0], counts[1], counts[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.control_inprocess",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=12_800)
    parser.add_argument("--run-chunks", type=int, default=1024)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes-per-rack", type=int, default=8)
    parser.add_argument("--max-partial-sources", type=int, default=None,
                        help="PlannerConfig.max_partial_sources (0: None, every partial holder; default: the default)")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of the update")
    parser.add_argument("--parked", action="store_true",
                        help="readers report in exchanges that wait for work, parked and woken by the hub's route")
    args = parser.parse_args(argv)
    planner = PlannerConfig() if args.max_partial_sources is None else \
        PlannerConfig(max_partial_sources=args.max_partial_sources or None)
    config = HubConfig(lease_ttl_s=3600, worker_timeout_s=3600, planner=planner)
    point = lambda: run(args.readers, args.chunks, args.run_chunks, args.window, args.gpus_per_node,  # noqa: E731
                        args.nodes_per_rack, config, args.parked)
    if args.profile:
        profile = cProfile.Profile()
        result = profile.runcall(point)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    else:
        result = point()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
