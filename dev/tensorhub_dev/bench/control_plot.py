"""The plot of `tensorhub bench control` sweeps: hub CPU per exchange and per chunk read against the version's
chunk count, one line per reader count, before (dashed) and after (solid) a change.

    python -m tensorhub_dev.bench.control_plot BEFORE.txt AFTER.txt docs/img/control_plane.png

Each input is the output of a `bench control` run (its last line is the JSON). Points that did not finish in
the run's time limit are measured on what they did (per exchange, per read) and drawn hollow.

    python -m tensorhub_dev.bench.control_plot --regions OUT.png LABEL=RUN.txt,RUN.txt,... [LABEL=...]

The regions plot: the hub's critical path per update (the busiest hub process's CPU) against the readers one
hub process serves, from `bench control --split readers` runs at several reader and shard counts, one line per
label (e.g. main and a branch), with the 0.4 s goal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tensorhub_dev.sim.plots import _plt

_FIGURES = (("hub_cpu_per_exchange_ms", "hub CPU per exchange (ms)"),
            ("hub_cpu_per_chunk_read_ms", "hub CPU per chunk read (ms)"))


def load(path: str) -> list[dict]:
    return json.loads(Path(path).read_text().strip().splitlines()[-1])["points"]


def plot(before: list[dict], after: list[dict], out: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    readers = sorted({p["readers"] for p in before + after})
    colors = dict(zip(readers, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for ax, (field, label) in zip(axes, _FIGURES):
        for points, style, name in ((before, "--", "before"), (after, "-", "after")):
            for r in readers:
                series = sorted((p for p in points if p["readers"] == r and p[field]), key=lambda p: p["chunks"])
                if not series:
                    continue
                xs, ys = [p["chunks"] for p in series], [p[field] for p in series]
                ax.plot(xs, ys, style, color=colors[r], label=f"{r} readers, {name}")
                ax.scatter(xs, ys, color=colors[r], facecolors=["none" if p["extrapolated"] else colors[r]
                                                                for p in series], zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("chunks in the version (8 MiB each: 2 GB .. 100 GB)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("tensorhub bench control: the hub's work per exchange and per read (hollow: run cut at 40 s)")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_regions(series: dict[str, list[dict]], out: str, goal_s: float = 0.4) -> None:
    """Critical path per update against readers per hub process, one line per label."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, points in series.items():
        rows = sorted((p["readers"] / p["shards"], p["critical_path_per_update_s"], p["extrapolated"]) for p in points)
        ax.plot([r[0] for r in rows], [r[1] for r in rows], "-o", label=label)
        ax.scatter([r[0] for r in rows if r[2]], [r[1] for r in rows if r[2]], facecolors="white", zorder=3,
                   edgecolors="black")
    ax.axhline(goal_s, color="tab:red", linestyle=":", label=f"goal {goal_s} s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("readers one hub process serves (a region)")
    ax.set_ylabel("critical path: busiest hub process's CPU per update (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("bench control --split readers, 12,800 chunks (100 GB); hollow: extrapolated", fontsize=9)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 3 and args[0] == "--regions":
        series = {}
        for item in args[2:]:
            label, _, files = item.partition("=")
            series[label] = [p for f in files.split(",") for p in load(f)]
        plot_regions(series, args[1])
        return 0
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    plot(load(args[0]), load(args[1]), args[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
