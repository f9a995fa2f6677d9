"""The GPU tier's core part collects and its engine part skips where no engine is installed, as on a GPU host that
has only torch and the core's wheelhouse: ``tests/gpu`` collected in a fresh interpreter whose imports of the
optional packages (verl, vLLM, Hydra, OmegaConf, Ray, transformers, tensordict) fail as if they were absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HIDDEN = ("verl", "vllm", "hydra", "omegaconf", "ray", "transformers", "tensordict")
CORE_MODULES = ("test_tcp_vram.py", "test_trainer_gpu_staging.py", "test_vram_transfer.py")
ENGINE_MODULES = ("test_vllm_gpu_holder.py", "test_verl_grpo_gpu.py")

_COLLECT = f"""
import importlib.abc, sys
HIDDEN = {HIDDEN!r}

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-rs", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                      "-o", "addopts=", "tests/gpu"]))
"""


def test_the_gpu_tier_collects_without_any_engine_installed():
    # No help from the core-only switch; no plugins of the hidden packages (Hydra registers one): only
    # pytest-timeout, which the suite's configuration uses.
    env = {k: v for k, v in os.environ.items() if k != "TENSORHUB_CORE_ONLY"} | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", _COLLECT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "error" not in out.lower().replace("modulenotfounderror", ""), out[-4000:]
    for module in CORE_MODULES:
        assert f"tests/gpu/{module}::" in out, f"{module} was not collected:\n{out[-4000:]}"
    assert not any(f"tests/gpu/{module}::" in out for module in ENGINE_MODULES), out[-4000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED") and "an engine test: needs" in line]
    assert len(skipped) == len(ENGINE_MODULES), out[-4000:]  # each engine module skipped, saying what it needs
