"""PNGs for `tensorhub bench modes --plots DIR`: the lab's measurements, and the simulator where the lab can't reach.

- `lab_modes.png`: total stall per mode, TensorHub beside each baseline (measured in the network lab).
- `time_vs_readers.png`: total stall vs number of rollouts; left, the lab topology (simulated for 1..R
  rollouts, with the lab's measured points); right, a 400 Gbit/s cluster (simulated).
- `time_vs_size.png`: worst rollout's wait vs version size; left, the lab topology (simulated, with the
  lab's measured point); right, the cluster from 100 GB to 2 TB (simulated).

Every simulated series says "sim" in its legend; measured points are markers labelled "lab".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from tensorhub_dev.sim.calibrate import LabWorkload, simulate_lab
from tensorhub_dev.sim.modes import ModeParams, standalone

COLORS = {"tensorhub": "tab:blue", "pull_from_trainer": "tab:gray", "broadcast": "tab:orange",
          "ring": "tab:green", "tree": "tab:red"}
CLUSTER = ModeParams(racks=16, nodes_per_rack=8, chunks=32, weights_gb=100.0)
"""Cluster for the right-hand panels: 128 nodes (1,024 GPUs), 400 Gbit/s NICs, 2:1 rack uplinks."""


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(points: Iterable[dict], value: Callable[[dict], float]) -> dict[str, list[float]]:
    """{strategy: [value of its report at each point]} from one {strategy: report} dict per point."""
    out: dict[str, list[float]] = {}
    for runs in points:
        for s, rep in runs.items():
            out.setdefault(s, []).append(value(rep))
    return out


def cluster_vs_readers(readers=(8, 16, 32, 64), base: ModeParams = CLUSTER) -> dict[str, list[float]]:
    """Standalone at cluster scale: total stall (s) per strategy for each number of rollouts."""
    return _series((standalone(replace(base, rollouts=r))["runs"] for r in readers),
                   lambda rep: rep["mean_s"] * rep["readers"])


def cluster_vs_size(sizes_gb=(100, 250, 500, 1000, 2000), base: ModeParams = CLUSTER, rollouts: int = 32):
    """Standalone at cluster scale: worst rollout's wait (s) per strategy for each version size."""
    return _series((standalone(replace(base, weights_gb=float(gb), rollouts=rollouts))["runs"] for gb in sizes_gb),
                   lambda rep: rep["max_s"])


def lab_vs_readers(w: LabWorkload, readers: list[int]) -> dict[str, list[float]]:
    """Standalone on the lab topology: total stall (s) per strategy for each number of rollouts."""
    return _series((simulate_lab(replace(w, rollouts=r), ("standalone",))["standalone"] for r in readers),
                   lambda rep: rep["total_s"])


def lab_vs_size(w: LabWorkload, sizes_mb: list[float]) -> dict[str, list[float]]:
    """Standalone on the lab topology: worst rollout's wait (s) per strategy for each version size."""
    return _series((simulate_lab(replace(w, size_mb=mb), ("standalone",))["standalone"] for mb in sizes_mb),
                   lambda rep: rep["max_s"])


def plot_all(result: dict, out_dir: Path) -> list[str]:
    """Writes the three PNGs for a `bench modes` result; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    w = LabWorkload.from_params(result["params"])
    paths = []

    # 1. the lab's modes
    modes = result["modes"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    variants = ["tensorhub", "pull_from_trainer", "broadcast"]
    for k, v in enumerate(variants):
        xs, ys = [], []
        for i, r in enumerate(modes.values()):
            if v in r["runs"]:
                xs.append(i + 0.27 * (k - 1))
                ys.append(r["runs"][v]["total_s"])
        if xs:
            ax.bar(xs, ys, width=0.27, color=COLORS[v], label=v)
    ax.set_xticks(range(len(modes)),
                  [f"{m}\n{r['ratio']:.1f}x (paper {r['paper_ratio']}x)" for m, r in modes.items()])
    ax.set_ylabel("total stall, s (sum over rollouts)")
    ax.set_title(f"network lab (measured): {w.rollouts} rollouts, {w.size_mb:g} MiB, NIC {w.nic_mbit:g} Mbit/s, "
                 f"WAN {w.wan_mbit:g}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, plt, out_dir / "lab_modes.png"))

    # 2. time vs readers
    readers = sorted({1, 2, 4, w.rollouts} | {r for r in (6, 8) if r <= w.rollouts})
    lab_r = lab_vs_readers(w, readers)
    cl_readers = (8, 16, 32, 64)
    cl_r = cluster_vs_readers(cl_readers)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for s, ys in lab_r.items():
        a1.plot(readers, ys, "-", color=COLORS[s], label=f"{s} (sim)")
    sa = modes.get("standalone")
    if sa:
        for s, rep in sa["runs"].items():
            a1.plot([len(rep["seconds"])], [rep["total_s"]], "o", color=COLORS[s], ms=8, label=f"{s} (lab)")
    a1.set_xlabel("rollouts")
    a1.set_ylabel("total stall, s")
    a1.set_title(f"lab topology: {w.size_mb:g} MiB, NIC {w.nic_mbit:g} Mbit/s", fontsize=9)
    a1.legend(fontsize=7)
    for s, ys in cl_r.items():
        a2.plot(cl_readers, ys, "-o", color=COLORS[s], label=f"{s} (sim)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("rollout nodes (8 GPUs each)")
    a2.set_ylabel("total stall, s")
    a2.set_title(f"cluster (sim): {CLUSTER.weights_gb:g} GB, NIC {CLUSTER.nic_gbps:g} Gbit/s", fontsize=9)
    a2.legend(fontsize=7)
    fig.suptitle("standalone: time vs number of readers")
    fig.tight_layout()
    paths.append(_save(fig, plt, out_dir / "time_vs_readers.png"))

    # 3. time vs model size
    sizes_mb = [16.0, 32.0, 64.0, 128.0, 256.0]
    lab_s = lab_vs_size(w, sizes_mb)
    sizes_gb = (100, 250, 500, 1000, 2000)
    cl_s = cluster_vs_size(sizes_gb)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for s, ys in lab_s.items():
        a1.plot(sizes_mb, ys, "-", color=COLORS[s], label=f"{s} (sim)")
    if sa:
        for s, rep in sa["runs"].items():
            a1.plot([w.size_mb], [rep["max_s"]], "o", color=COLORS[s], ms=8, label=f"{s} (lab)")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("version size, MiB")
    a1.set_ylabel("worst rollout's wait, s")
    a1.set_title(f"lab topology: {w.rollouts} rollouts, NIC {w.nic_mbit:g} Mbit/s", fontsize=9)
    a1.legend(fontsize=7)
    for s, ys in cl_s.items():
        a2.plot(sizes_gb, ys, "-o", color=COLORS[s], label=f"{s} (sim)")
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("version size, GB")
    a2.set_ylabel("worst rollout's wait, s")
    a2.set_title(f"cluster (sim): 32 rollout nodes, NIC {CLUSTER.nic_gbps:g} Gbit/s", fontsize=9)
    a2.legend(fontsize=7)
    fig.suptitle("standalone: time vs model size")
    fig.tight_layout()
    paths.append(_save(fig, plt, out_dir / "time_vs_size.png"))
    return paths


def _save(fig, plt, path: Path) -> str:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
