"""The delta lab on a host with a core per emulated host: `bench modes --delta` (TensorHub with deltas against
every rollout pulling the delta from the trainer), cross-datacenter first, then standalone, each within what is
left of ``--limit-s``.

    python scripts/gpu_lab.py [--limit-s S] [--size-mb 256]

On a 2-core machine the 8 readers of that lab share two cores, so the apply of every reader queues behind the
others' (docs/benchmarks.md, "Deltas in the lab"); a host with 16 cores gives each reader its own. The GPU check
runs this as its ``lab`` step: the lab needs root and iproute2 (`ip`, `tc`), and where the host lacks them the
step says why and passes. Each mode runs as its own process, stopped with SIGTERM (the lab then removes its
namespaces) when its share of the limit runs out; labs left behind by a killed run are removed at the end.
Prints one JSON object: the host's cores, and per mode the stall ratios, goals and WAN bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "dev"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_check import STEP_SECONDS_ENV  # noqa: E402  (the seconds the GPU check gives this step)

MODES = ("cross_dc", "standalone")
STOP_GRACE_S = 20.0
"""Seconds a mode's bench gets, after SIGTERM, to take its lab down."""


def _brief(mode: str, result: dict) -> dict:
    """What the check keeps of a mode's JSON: stall totals, ratios, goals, WAN bytes and the delta."""
    m = result["modes"][mode]
    runs = m["runs"]
    return {"tensorhub_s": m["tensorhub_s"], "baseline_s": m["baseline_s"], "ratio_vs": m["ratio_vs"],
            "goals": m.get("goals"), "delta": m.get("delta"), "wan_over_delta": m.get("wan_over_delta"),
            "seconds": {v: [round(s, 3) for s in r["seconds"]] for v, r in runs.items()},
            "cpu_s": {v: r.get("cpu_s") for v, r in runs.items()},
            "control_cpu_s": {v: r.get("control_cpu_s") for v, r in runs.items()},
            "update_wall_s": {v: r.get("update_wall_s") for v, r in runs.items()},
            "apply_after_wire_s": {v: r["delta"]["apply_after_wire_s"] for v, r in runs.items() if "delta" in r}}


def run_mode(mode: str, size_mb: int, seconds: float, env: dict[str, str]) -> dict:
    out_file = Path(tempfile.mkdtemp(prefix="tensorhub-gpu-lab-")) / f"{mode}.json"
    argv = [sys.executable, "-m", "tensorhub_dev.bench.modes", "--delta", "--modes", mode, "--size-mb",
            str(size_mb), "--delta-variants", "delta_from_trainer", "--broadcast", "false", "--json",
            "--out", str(out_file)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=max(1.0, seconds - STOP_GRACE_S))
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
        status = "timeout"
    result = json.loads(out_file.read_text()) if out_file.exists() else None
    shutil.rmtree(out_file.parent, ignore_errors=True)
    row = {"status": status, "rc": proc.returncode, "seconds": round(time.monotonic() - started, 1)}
    if result and mode in result.get("modes", {}):
        row.update(_brief(mode, result))
    else:
        row["stderr_tail"] = (err or "")[-3000:]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit-s", type=float, default=float(os.environ.get(STEP_SECONDS_ENV, 200)) - 10,
                    help="the whole lab's limit, in seconds (default: 10 s less than the GPU check gives its step, "
                         "else 190)")
    ap.add_argument("--size-mb", type=int, default=256)
    a = ap.parse_args(argv)
    from tensorhub_dev.netlab import cleanup_stale
    from tensorhub_dev.netlab.iproute import check_available
    from tensorhub_dev.netlab.errors import NetlabUnavailable

    info = {"cpus": os.cpu_count(), "size_mb": a.size_mb}
    try:
        check_available()
    except NetlabUnavailable as e:
        print(json.dumps({**info, "skipped": f"the lab cannot run on this host: {e}"}))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "dev"), os.environ.get("PYTHONPATH", "")])}
    deadline = time.monotonic() + a.limit_s
    modes = {}
    try:
        for i, mode in enumerate(MODES):
            left = deadline - time.monotonic()
            if left < 60:
                modes[mode] = {"status": "skipped", "why": f"{left:.0f} s left of the lab's limit"}
                continue
            # the first mode may use all but a minute of what is left; the next, the rest
            share = left - 60 if i + 1 < len(MODES) else left
            modes[mode] = run_mode(mode, a.size_mb, share, env)
            print(f"row: {json.dumps({mode: modes[mode]})}", flush=True)
    finally:
        removed = cleanup_stale()
    print(json.dumps({**info, "modes": modes, "stale_labs_removed": len(removed)}))
    return 0 if all(m["status"] in ("ok", "skipped") for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
