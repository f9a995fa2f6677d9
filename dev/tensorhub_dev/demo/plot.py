"""The main job's picture: reward and weight-update stall per step."""

from __future__ import annotations

from pathlib import Path

from tensorhub_dev.demo.progress import StepRow


def plot_steps(rows: list[StepRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.plot(steps, [r.reward_mean for r in rows], marker="o", color="tab:green")
    top.set_ylabel("reward (mean)")
    top.set_title("verl GRPO on CPU with TensorHub weight transfer")
    bottom.bar(steps, [1000 * r.stall_s for r in rows], color="tab:red", label="rollout stall (apply)")
    bottom.plot(steps, [1000 * r.pull_s for r in rows], marker=".", color="tab:blue",
                label="pull (engines keep generating)")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("training step")
    bottom.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
