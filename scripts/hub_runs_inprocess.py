"""The hub's CPU for one update with no HTTP: ``HubState`` driven in-process by synthetic readers.

    PYTHONPATH=. python scripts/hub_runs_inprocess.py RUN_CHUNKS [READERS] [CHUNKS]

One trainer (another node of the readers' rack) publishes CHUNKS chunks (default 12,800); READERS readers
(default 8, one node) fetch them, each asking for a window of 8 leases of up to RUN_CHUNKS chunks and landing
every assigned read at once (as ``bench control`` does, without its HTTP and load processes). Prints the process
CPU time of the whole update and the exchanges it took: the hub's own work per update (docs/control-plane.md);
and the share of chunk reads that peers served (the swarm spreading), not the trainer.
"""

from __future__ import annotations

import sys
import time

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.wire.convert import manifest_to_msg

_CHUNK = 4096


def main(run: int, readers: int, chunks: int) -> None:
    tensor = TensorSpec("w", (chunks * _CHUNK,), "uint8", chunks * _CHUNK)
    manifest = Manifest("m", 1, "hf", (tensor,), _CHUNK, "f")
    hub = HubState(HubConfig(lease_ttl_s=3600, worker_timeout_s=3600))
    key = dict(model="m", version=1, layout="hf")

    def register(worker: str, node: str) -> None:
        hub.register_worker(msg.RegisterWorker(worker=worker, location=msg.LocationMsg(node=node),
                                               agent_name=f"{worker}-agent", agent_metadata_b64="AAAA"))

    register("trainer", "trainer")
    manifest_msg = manifest_to_msg(manifest).model_copy(update={"chunk_digests": ["0" * 16] * chunks})
    hub.publish(msg.Publish(worker="trainer", holder="trainer", manifest=manifest_msg,
                            regions=[msg.RegionMsg(addr=1 << 20)]))  # the hub stores digests; readers check them
    names = [f"r{i}" for i in range(readers)]
    for name in names:
        register(name, "n0")
        hub.begin_fetch(msg.BeginFetch(worker=name, holder=name, digest=manifest.digest,
                                       regions=[msg.RegionMsg(addr=1 << 20)], **key))
    landed: dict[str, list[int]] = {name: [] for name in names}
    done: set[str] = set()
    exchanges = leases = from_trainer = 0
    started = time.process_time()
    while len(done) < readers:
        for name in names:
            if name in done:
                continue
            reply = hub.exchange(msg.Exchange(worker=name, holder=name, completed=landed[name], want=8,
                                              run_chunks=run, **key))
            exchanges += 1
            landed[name] = [a.lease for a in reply.assignments]
            leases += len(reply.assignments)
            for a in reply.assignments:
                from_trainer += a.count if a.source == "trainer" else 0
            if reply.have == reply.total and not landed[name]:
                hub.end_fetch(msg.EndFetch(worker=name, holder=name, ok=True, hold=True, **key))
                done.add(name)
    cpu = time.process_time() - started
    print(f"runs of {run}, {readers} readers x {chunks} chunks: hub CPU {cpu:.3f} s, {exchanges} exchanges, "
          f"{1e6 * cpu / (readers * chunks):.2f} us per chunk read, {leases / exchanges:.2f} leases per exchange, "
          f"{1 - from_trainer / (readers * chunks):.1%} of chunk reads from peers")


if __name__ == "__main__":
    given = [int(a) for a in sys.argv[1:4]]
    run_chunks, n_readers, n_chunks = given + [1, 8, 12_800][len(given):]
    main(run_chunks, n_readers, n_chunks)
