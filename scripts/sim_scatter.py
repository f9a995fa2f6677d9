"""Issue 21 item 5: the lab's standalone workload on the simulator, the planner's first reads from the publisher.

    PYTHONPATH=.:dev python scripts/sim_scatter.py

Runs the real planner (`sim.tensorhub.TensorHub`) on the lab's topology (`sim.calibrate.lab_cluster`: 8 readers
of 32 chunks of 2 MiB from one trainer, 200 Mbit/s NICs, window 4, 8 reads per source) with readers that begin
`stagger` seconds apart, as the lab's do (its readers' first exchanges reach the hub within ~20 ms), and a lag
`report_lag_s` between a chunk landing and its booking at the hub. Prints one row per setting of
`PlannerConfig.first_complete_reads` and stagger: the total stall summed over the 8 readers (each from its own
begin) at each lag, then the rows as JSON.
"""

import json

from tensorhub_verl.ros.hub.planner import PlannerConfig
from tensorhub_dev.sim import calibrate as C
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.swarm import Swarm
from tensorhub_dev.sim.tensorhub import TensorHub

LAGS = (0.0, 0.02, 0.03, 0.05, 0.08, 0.1)
STAGGERS = (0.0, 0.005, 0.02)
FIRST_READS = (None, 1, 2)


def run(lag: float, stagger: float, first_complete_reads: int | None) -> float:
    """Total stall (s) summed over the lab's readers, each counted from its own begin."""
    w = C.LabWorkload()
    cluster, hosts = C.lab_cluster(w, "standalone")
    sim = FlowSim(cluster)
    swarm = Swarm(sim, w.nchunks, w.chunk_bytes)
    swarm.add_holder("trainer", "trainer")
    names = [f"rollout-{i}" for i in range(w.rollouts)]
    config = PlannerConfig(max_inflight_per_source=w.max_inflight_per_source,
                           first_complete_reads=first_complete_reads)
    hub = TensorHub(swarm, config, window=w.window, report_lag_s=lag)
    for i, (name, host) in enumerate(zip(names, hosts)):
        sim.at(i * stagger, lambda name=name, host=host: hub.join(name, host))
    sim.run(until=lambda: len(swarm.readers()) == len(names) and swarm.all_done())
    return round(sum(swarm.members[n].done_at - i * stagger for i, n in enumerate(names)), 2)


if __name__ == "__main__":
    rows = {}
    for stagger in STAGGERS:
        for first in FIRST_READS:
            key = f"first_complete_reads={first}, readers begin {stagger * 1000:g} ms apart"
            rows[key] = [run(lag, stagger, first) for lag in LAGS]
            print(f"{key}: {rows[key]}", flush=True)
    print(json.dumps({"lags_s": LAGS, "total_s": rows}))
