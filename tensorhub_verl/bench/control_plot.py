"""The plot of `tensorhub bench control` sweeps: hub CPU per exchange and per chunk read against the version's
chunk count, one line per reader count, before (dashed) and after (solid) a change.

    python -m tensorhub_verl.bench.control_plot BEFORE.txt AFTER.txt docs/img/control_plane.png

Each input is the output of a `bench control` run (its last line is the JSON). Points that did not finish in
the run's time limit are measured on what they did (per exchange, per read) and drawn hollow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tensorhub_verl.sim.plots import _plt

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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    plot(load(args[0]), load(args[1]), args[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
