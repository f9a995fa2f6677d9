"""`tensorhub bench transport-lab --lab-mbit M`: TensorHub against raw sockets with the wire as the limit.

On loopback (the default) all processes share this machine's cores, so the comparison measures CPU per byte.
Here every process runs in its own network-lab host (`tensorhub_dev.netlab`: a namespace whose NIC is shaped to
``M`` Mbit/s), as on separate machines: the holder (bench modes' "trainer" role) publishes one version, then for
each reader count N, rounds alternate between

- TensorHub: N fresh reader processes, one per host, fetch the version at once (each also serves the others
  what it has, so the holder's NIC is not the only way out);
- raw sockets: the holder's host sends the same bytes to the same N hosts at once, one plain TCP flow each
  (`netlab.measure_flows`), so they share the holder's NIC as any N pulls from one server do.

Aggregate rate = N x bytes / (last reader done - first started), median over rounds. Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tensorhub_dev.bench.modes import LabBenchParams, Phase, start_control, stop_control
from tensorhub_dev.netlab import Lab
from tensorhub_dev.netlab.measure import measure_flows
from tensorhub_dev.sim.calibrate import TRAINER, lab_spec
from tensorhub_verl.bench import positive_ints


def run(readers: list[int], size_mb: float, chunk_mb: float, window: int, repeats: int, nic_mbit: float) -> list[dict]:
    """One row per reader count: TensorHub's and raw sockets' aggregate Mbit/s, their ratio, peer share."""
    p = LabBenchParams(size_mb=size_mb, chunk_mb=chunk_mb, rollouts=max(readers), nic_mbit=nic_mbit, window=window,
                       broadcast=False)
    spec, hosts = lab_spec(p, "standalone")
    rows = []
    with Lab(spec) as lab, tempfile.TemporaryDirectory(prefix="bench-transport-lab-") as tmp:
        url, control = start_control(lab, Path(tmp), p, copies=0)
        try:
            for n in readers:
                ours, raw, peer_bytes, moved = [], [], 0, 0
                for round_ in range(repeats):
                    fetched = _tensorhub_round(lab, Path(tmp), f"readers{n}-round{round_}", url, p, hosts[:n])
                    span = max(f["started"] + f["seconds"] for f in fetched) - min(f["started"] for f in fetched)
                    nbytes = sum(f["bytes"] for f in fetched)
                    ours.append(nbytes * 8 / span / 1e6)
                    moved += nbytes
                    peer_bytes += sum(b for f in fetched for w, b in f["sources"].items() if w != TRAINER)
                    flows = measure_flows(lab, [(TRAINER, h) for h in hosts[:n]], fetched[0]["bytes"])
                    raw.append(sum(f["bytes"] for f in flows) * 8 / max(f["seconds"] for f in flows) / 1e6)
                ratios = [a / b for a, b in zip(ours, raw)]
                rows.append({"wire": f"lab {nic_mbit:g} Mbit/s", "readers": n,
                             "tensorhub_mbit_s": round(statistics.median(ours), 1),
                             "raw_socket_mbit_s": round(statistics.median(raw), 1),
                             "ratio": round(statistics.median(ratios), 3),
                             "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                             "peer_fraction": round(peer_bytes / moved, 3)})
        finally:
            stop_control(control)
    return rows


def _tensorhub_round(lab: Lab, workdir: Path, name: str, url: str, p: LabBenchParams, hosts: list[str]) -> list[dict]:
    phase = Phase(lab, workdir, name, url, p)
    gos = [phase.add_reader(host, "policy", hold=False) for host in hosts]
    phase.ready()
    for go in gos:
        go.touch()
    try:
        return phase.collect()
    finally:
        phase.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench transport-lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-mbit", type=float, default=1000,
                        help="every process on its own lab host with a NIC shaped to this many Mbit/s")
    parser.add_argument("--readers", default=(1,), type=positive_ints, help="comma-separated reader counts, e.g. 1,4")
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mb", type=float, default=8)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.lab_mbit <= 0:
        parser.error(f"--lab-mbit must be > 0, got {args.lab_mbit:g}")
    rows = run(list(args.readers), args.size_mb, args.chunk_mb, args.window, args.repeats, args.lab_mbit)
    if not args.json:
        print(f"{'wire':18} {'readers':>7} {'TensorHub Mbit/s':>16} {'raw Mbit/s':>10} {'ratio':>6} {'range':>11} {'peer %':>6}")
        for row in rows:
            print(f"{row['wire']:18} {row['readers']:>7} {row['tensorhub_mbit_s']:>16.1f} {row['raw_socket_mbit_s']:>10.1f} "
                  f"{row['ratio']:>6.2f} {row['ratio_range'][0]:>5.2f}-{row['ratio_range'][1]:<5.2f} "
                  f"{100 * row['peer_fraction']:>6.0f}")
    print(json.dumps({"bench": "transport", "lab_mbit": args.lab_mbit, "size_mb": args.size_mb, "repeats": args.repeats,
                      "chunk_mb": args.chunk_mb, "window": args.window, "ratio": rows[0]["ratio"], "rows": rows,
                      "unit": "Mbit/s delivered to all readers (N x bytes / span), median of rounds; rounds alternate "
                              "TensorHub, raw sockets"}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
