"""``tensorhub demo --mode standalone|elastic|cross_dc --hosts N``: verl's tiny job on a Ray cluster across N
network-lab hosts on this machine, TensorHub against pulling from the trainer (``netlab.verl_modes``).

Prints the demo's step table for each variant, a comparison, a plot of the TensorHub run and one JSON object as
the last line. The lab builds network namespaces and needs root: without it, ``available()`` says why and the
caller runs the single-host demo.
"""

from __future__ import annotations

import time
from pathlib import Path

from tensorhub_dev.demo.task import TaskFiles

_COLUMNS = ("step", "version", "reward", "stall s", "pull s", "MB", "peer %")


def unavailable_reason() -> str | None:
    """Why the network lab cannot run here (root, iproute2), or None."""
    from tensorhub_dev.netlab import NetlabUnavailable, check_available

    try:
        check_available()
    except NetlabUnavailable as e:
        return str(e)
    return None


def run(task: TaskFiles, out: Path, *, mode: str, hosts: int, steps: int, quiet: bool = False) -> dict:
    from tensorhub_dev.demo.plot import plot_steps
    from tensorhub_dev.netlab.verl_modes import VARIANTS, compare, mode_lab, run_variant, step_rows

    lab = mode_lab(mode, hosts)  # refuses a mode or host count it cannot build, before anything starts
    started = time.monotonic()
    runs = {}
    for variant in VARIANTS:
        if not quiet:
            print(f"verl GRPO across {hosts} lab hosts, +tensorhub={mode}, {variant.replace('_', ' ')}: "
                  f"{steps} steps, {len(lab.rollout_hosts)} replicas on {', '.join(lab.rollout_hosts)}"
                  + (f", an elastic node joins from {lab.elastic_host}" if lab.elastic_host else ""), flush=True)
        result = run_variant(task, out, mode, hosts, variant, steps)
        runs[variant] = {k: result[k] for k in ("steps", "summary", "wan_rx_bytes_by_dc", "seconds")}
        runs[variant]["actors"] = _where(result)
        if "elastic_node" in result:
            runs[variant]["elastic_node"] = result["elastic_node"]
        if not quiet:
            _print_table(result)
    plot = plot_steps(step_rows(runs["tensorhub"]), out / f"{mode}-hosts{hosts}.png")
    ratios = compare(runs)
    if not quiet:
        th, base = runs["tensorhub"]["summary"], runs["pull_from_trainer"]["summary"]
        print(f"\ncopies of each version from the trainer: {th['trainer_copies_per_version']:.2f} with TensorHub, "
              f"{base['trainer_copies_per_version']:.2f} pulling from the trainer; mean stall "
              f"{th['stall_s_mean']:.3f} s vs {base['stall_s_mean']:.3f} s; plot: {plot}")
        if "joiner_pull_ratio" in ratios:
            th_node, base_node = (runs[v]["elastic_node"]["first"] for v in VARIANTS)
            print(f"elastic node's first pull: {th_node['pull_s']:.3f} s, {th_node['peer_fraction']:.0%} from peers "
                  f"with TensorHub; {base_node['pull_s']:.3f} s, {base_node['peer_fraction']:.0%} from peers "
                  f"pulling from the trainer", flush=True)
    return {"demo": "ok", "mode": mode, "hosts": hosts, "runs": runs, "compare": ratios, "plot": str(plot),
            "seconds": round(time.monotonic() - started, 1)}


def _print_table(result: dict) -> None:
    print(" ".join(f"{c:>{w}}" for c, w in zip(_COLUMNS, (4, 7, 7, 8, 7, 6, 6))), flush=True)
    for s in result["steps"]:
        print(f"{s['step']:>4} {s['version']:>7} {s['reward_mean']:>7.3f} {s['stall_s']:>8.3f} {s['pull_s']:>7.3f} "
              f"{s['bytes'] / 1e6:>6.2f} {100 * s['peer_fraction']:>6.0f}", flush=True)
    print(f"  where Ray ran the job: {', '.join(_where(result))}", flush=True)
    node = result.get("elastic_node")
    if node and node["first"]:
        first = node["first"]
        print(f"  elastic node on {node['host']} (started after step {node['started_after_step']}): first pulled "
              f"v{first['version']} in {first['pull_s']:.3f} s, {first['bytes'] / 1e6:.2f} MB, "
              f"{first['peer_fraction']:.0%} from peers; then followed {len(node['followed'])} versions to "
              f"v{node['served']}", flush=True)


def _where(result: dict) -> list[str]:
    """``Class@host`` of every actor the run had (verl's colocated workers are a local class: its last name)."""
    return sorted({f"{a['class'].rsplit('.', 1)[-1]}@{a['host']}" for a in result["actors"]})


__all__ = ["run", "unavailable_reason"]
