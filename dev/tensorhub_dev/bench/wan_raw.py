"""Raw TCP flows over the cross-dc lab's WAN: `python -m tensorhub_dev.bench.wan_raw`.

What the lab's WAN carries without TensorHub, on the topology `bench modes --modes cross_dc` builds (trainer in
dc0, the readers in dc1 behind one shaped WAN): one plain TCP flow of the version from the trainer to one reader
(the rate a single stream gets: the seed's ceiling), the same flow while the other readers send to each other
at their NICs' rate in a ring (what TensorHub's readers do inside dc1 while the seed reads: the bridges' and
veths' work on this host's cores), then one flow to every reader at once (the pull baseline's shape, with no
hub, no chunks and no digests). Each flow is timed by its receiver, first byte to EOF
(`netlab.measure_flows`); the floor is the version's bytes through the WAN with every frame's headers
(`modes_gap.copy_seconds`). Needs root and iproute2; prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sys

from tensorhub_dev.bench.modes_gap import copy_seconds
from tensorhub_dev.netlab import Lab
from tensorhub_dev.netlab.measure import measure_flows
from tensorhub_dev.sim.calibrate import TRAINER, LabWorkload, lab_spec


def run(w: LabWorkload) -> dict:
    spec, readers = lab_spec(w, "cross_dc")
    nbytes = int(w.size_mb * (1 << 20))
    floor = copy_seconds(w.size_mb, w.wan_mbit)
    with Lab(spec) as lab:
        one = measure_flows(lab, [(TRAINER, readers[0])], nbytes)[0]
        busy = _with_ring(lab, readers[0], readers[1:], nbytes) if len(readers) > 2 else one
        many = measure_flows(lab, [(TRAINER, r) for r in readers], nbytes, port_base=47100, timeout=600.0)
    secs = sorted(f["seconds"] for f in many)
    return {"bench": "wan_raw", "size_mb": w.size_mb, "wan_mbit": w.wan_mbit, "floor_one_copy_s": round(floor, 3),
            "one_flow": {"seconds": round(one["seconds"], 3), "mbit_s": round(one["mbit_s"], 2),
                         "of_floor": round(floor / one["seconds"], 3)},
            "one_flow_dc1_busy": {"seconds": round(busy["seconds"], 3), "mbit_s": round(busy["mbit_s"], 2),
                                  "of_floor": round(floor / busy["seconds"], 3), "ring_flows": len(readers) - 1 if len(readers) > 2 else 0},
            "all_flows": {"flows": len(secs), "seconds": [round(s, 2) for s in secs], "total_s": round(sum(secs), 2),
                          "last_s": round(secs[-1], 2), "fair_total_s": round(len(secs) ** 2 * floor, 2),
                          "wan_share": round(len(secs) * floor / secs[-1], 3)}}


def _with_ring(lab: Lab, seed: str, ring: list[str], nbytes: int) -> dict:
    """The WAN flow to ``seed`` (``nbytes``) while each host of ``ring`` sends twice that to the next one: at twice
    the WAN's rate, the ring's flows outlast the WAN flow."""
    pairs = [(TRAINER, seed), *((a, b) for a, b in zip(ring, ring[1:] + ring[:1]))]
    return measure_flows(lab, pairs, [nbytes] + [2 * nbytes] * len(ring), port_base=47050)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.wan_raw", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default = LabWorkload()
    ap.add_argument("--size-mb", type=float, default=default.size_mb)
    ap.add_argument("--rollouts", type=int, default=default.rollouts)
    ap.add_argument("--wan-mbit", type=float, default=default.wan_mbit)
    a = ap.parse_args(argv)
    out = run(LabWorkload(size_mb=a.size_mb, rollouts=a.rollouts, wan_mbit=a.wan_mbit))
    o, m = out["one_flow"], out["all_flows"]
    print(f"one flow: {o['seconds']:.3f} s ({o['mbit_s']:.1f} Mbit/s of payload; {o['of_floor']:.1%} of the floor "
          f"{out['floor_one_copy_s']:.3f} s)")
    b = out["one_flow_dc1_busy"]
    print(f"one flow while {b['ring_flows']} readers send to each other in dc1: {b['seconds']:.3f} s "
          f"({b['mbit_s']:.1f} Mbit/s; {b['of_floor']:.1%} of the floor)")
    print(f"{m['flows']} flows at once: {m['seconds']} s; summed {m['total_s']:.1f} s (all equal, each at "
          f"{m['flows']} x the floor: {m['fair_total_s']:.1f} s); the last done at {m['last_s']:.2f} s "
          f"(WAN {m['wan_share']:.1%} busy)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
