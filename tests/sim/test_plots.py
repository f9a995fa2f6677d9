"""`--plots` writes its PNGs from a bench result (sim panels at a reduced scale)."""

from __future__ import annotations

import pytest

from tensorhub_dev.sim import plots
from tensorhub_dev.sim.calibrate import LabWorkload, simulate_lab
from tests.requires import require


def test_plot_all_writes_three_pngs(tmp_path, monkeypatch):
    require("matplotlib")
    monkeypatch.setattr(plots, "cluster_vs_readers", lambda readers=(8, 16, 32, 64), base=None:
                        {"tensorhub": [1.0] * 4, "pull_from_trainer": [2.0] * 4})
    monkeypatch.setattr(plots, "cluster_vs_size", lambda sizes_gb=(), base=None, rollouts=32:
                        {"tensorhub": [1.0] * 5, "pull_from_trainer": [2.0] * 5})
    params = {"size_mb": 4.0, "chunk_mb": 1.0, "rollouts": 2}
    sim = simulate_lab(LabWorkload(**params), ("standalone",))["standalone"]
    result = {"params": params, "modes": {"standalone": {"runs": sim, "ratio": 2.0, "paper_ratio": 6.7}}}
    paths = plots.plot_all(result, tmp_path)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["lab_modes.png", "time_vs_readers.png", "time_vs_size.png"]
    for p in paths:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
