"""`python -m tensorhub_dev.sim.cli [--modes ...] [--rollouts 64 ...] [--out FILE]`: simulate the three modes.

Prints a short table to stderr and one JSON object as the last line of stdout (also written to --out).
Every ModeParams field is a flag (`--weights-gb`, `--chunks`, `--window`, `--nic-gbps`, `--trainer-nodes`, ...).
`--delta-changed-fraction F` (with `--delta-bytes-per-changed`, `--delta-apply-gbps`) adds, for standalone and
cross_dc, a run on the delta N-1 -> N beside the full version (``sim.modes``), printed side by side.
`--sweep FIELD=V1,V2,...` runs the modes once per value instead and reports TensorHub against the
physical floor (`tensorhub_dev.sim.sweep`).

The hub is free (answers at once) unless a cost is given: `--hub-measured` takes today's hub as `tensorhub
bench control` measured it (`sim.hub_costs.MEASURED`), `--hub-json FILE` calibrates from a saved `bench
control` output, and `--hub-exchange-ms`, `--hub-cores`, `--run-chunks`, ... set each figure (they win over
both). With the hub modeled, TensorHub also runs with a free hub, and each mode reports the hub's work, its
utilisation and the stall it adds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.hub_costs import MEASURED, calibrate_hub, load_control_report
from tensorhub_dev.sim.modes import PAPER, ModeParams, run_all
from tensorhub_dev.sim.sweep import parse_sweep, sweep

log = logging.getLogger("tensorhub_dev.sim")


def summary(result: dict) -> list[dict]:
    """One row per mode: TensorHub's time, each baseline's time, ratio, and the paper's ratio."""
    rows = []
    for mode, r in result["modes"].items():
        ratios = r.get("stall_ratio_vs") or r.get("update_ratio_vs")
        metric = "mean_s" if mode == "elastic" else "max_s"
        for base, ratio in ratios.items():
            rows.append({"mode": mode, "baseline": base, "metric": metric,
                         "tensorhub_s": round(r["runs"]["tensorhub"][metric], 3),
                         "baseline_s": round(r["runs"][base][metric], 3), "ratio": round(ratio, 2),
                         "paper_ratio": PAPER[mode]})
    return rows


def delta_summary(result: dict) -> list[dict]:
    """One row per mode with a delta run and per baseline: TensorHub's stall with full versions and with deltas,
    the baseline's with full versions and moving the delta, and TensorHub-with-deltas' ratio to each."""
    rows = []
    for mode, r in result["modes"].items():
        d = r.get("delta")
        if d is None:
            continue
        th_delta = d["runs"]["tensorhub"]["max_s"]
        for base in r["stall_ratio_vs"]:
            row = {"mode": mode, "baseline": base, "tensorhub_full_s": round(r["runs"]["tensorhub"]["max_s"], 3),
                   "tensorhub_delta_s": round(th_delta, 3), "baseline_full_s": round(r["runs"][base]["max_s"], 3),
                   "ratio_vs_full": round(d["stall_ratio_vs_full"][base], 2), "paper_ratio": PAPER[mode]}
            if base in d["stall_ratio_vs_delta"]:
                row.update(baseline_delta_s=round(d["runs"][base]["max_s"], 3),
                           ratio_vs_delta=round(d["stall_ratio_vs_delta"][base], 2))
            rows.append(row)
    return rows


def _hub_line(hub: dict) -> str:
    return (f"busy {hub['busy_s']:.2f}s on {hub['cores']} core(s) ({hub['utilisation']:.0%})  "
            f"exchanges/reader {hub['exchanges_per_reader']:.0f} "
            f"({hub['empty_exchanges'] / hub['readers']:.0f} empty)  wait mean {1e3 * hub['wait_mean_s']:.2f} ms  adds "
            f"{hub['extra_stall_s']:+.2f}s (free hub {hub['free_hub_s']:.2f}s)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tensorhub-sim", description=__doc__)
    ap.add_argument("--modes", default="standalone,elastic,cross_dc")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--json", action="store_true", help="accepted for symmetry with `bench`; JSON is always printed")
    ap.add_argument("--sweep", metavar="FIELD=V1,V2,...", help="e.g. trainer_nodes=1,2,4,8,16,32,64")
    ap.add_argument("--hub-measured", action="store_true",
                    help="model today's hub as bench control measured it")
    ap.add_argument("--hub-json", metavar="FILE",
                    help="model the hub with costs from a `bench control` output")
    ap.add_argument("-v", "--verbose", action="store_true")
    for f in dataclasses.fields(ModeParams):
        kind = float if f.type in ("float", "float | None") else int
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, help=f"default {f.default}")
    return ap


def _hub_fields(a: argparse.Namespace) -> dict:
    """ModeParams' hub costs from --hub-measured or --hub-json (explicit --hub-* flags override them)."""
    if a.hub_measured and a.hub_json:
        raise ConfigError("give --hub-measured or --hub-json, not both")
    if a.hub_json:
        fitted = calibrate_hub(load_control_report(a.hub_json))
        return {k: fitted[k] for k in ("hub_exchange_ms", "hub_lease_ms", "hub_begin_ms", "hub_end_ms",
                                       "real_chunk_mib")}
    if a.hub_measured:
        return {"hub_exchange_ms": MEASURED.exchange_s * 1e3, "hub_lease_ms": MEASURED.lease_s * 1e3,
                "hub_begin_ms": MEASURED.begin_s * 1e3, "hub_end_ms": MEASURED.end_s * 1e3}
    return {}


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides = {f.name: getattr(a, f.name) for f in dataclasses.fields(ModeParams) if getattr(a, f.name) is not None}
    modes = tuple(m for m in a.modes.split(",") if m)
    try:
        params = ModeParams(**{**_hub_fields(a), **overrides})
        if a.sweep:
            field, values = parse_sweep(a.sweep)
            result = {"params": dataclasses.asdict(params), "sweep": sweep(params, field, values, modes)}
        else:
            result = run_all(params, modes=modes)
    except (ConfigError, OSError, ValueError) as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 2
    if a.sweep:
        for row in result["sweep"]["rows"]:
            print(f"{field}={row[field]:<6} {row['mode']:<11} tensorhub {row['metric']} {row['tensorhub_s']:>7.2f}s  "
                  f"floor {row['ideal_s']:>6.2f}s  ratio {row['vs_ideal']:>5.2f}x  trainer served "
                  f"{row['trainer_copies']:.2f} copies (ranks max/min {row['rank_bytes_max_over_min']})"
                  + (f"  hub {_hub_line(row['hub'])}" if "hub" in row else ""), file=sys.stderr)
    else:
        result["summary"] = summary(result)
        for row in result["summary"]:
            print(f"{row['mode']:<11} vs {row['baseline']:<18} tensorhub {row['tensorhub_s']:>8.2f}s  "
                  f"baseline {row['baseline_s']:>8.2f}s  ratio {row['ratio']:>6.2f}x  (paper {row['paper_ratio']}x)",
                  file=sys.stderr)
        for mode, r in result["modes"].items():
            if "hub" in r:
                print(f"{mode:<11} hub {_hub_line(r['hub'])}", file=sys.stderr)
        result["delta_summary"] = delta_summary(result)
        if result["delta_summary"]:
            p = result["params"]
            d = next(r["delta"] for r in result["modes"].values() if "delta" in r)
            apply = f"{d['apply_s']:.2f} s" if d["apply_s"] else "not modeled"
            print(f"with deltas: {100 * p['delta_changed_fraction']:g}% changed x {p['delta_bytes_per_changed']:g} "
                  f"B/changed element = {d['delta_gb']:.3g} GB of {p['weights_gb']:g} GB per version "
                  f"(apply {apply}; {'packed into wire chunks' if d['packed'] else 'one object per chunk'})",
                  file=sys.stderr)
        for row in result["delta_summary"]:
            extra = (f"  baseline with delta {row['baseline_delta_s']:>8.2f}s  ratio {row['ratio_vs_delta']:>6.2f}x"
                     if "ratio_vs_delta" in row else "")
            print(f"{row['mode']:<11} vs {row['baseline']:<18} tensorhub full {row['tensorhub_full_s']:>8.2f}s  "
                  f"delta {row['tensorhub_delta_s']:>7.3f}s  baseline full {row['baseline_full_s']:>8.2f}s  "
                  f"ratio {row['ratio_vs_full']:>7.1f}x{extra}", file=sys.stderr)
    text = json.dumps(result)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
