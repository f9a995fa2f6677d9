"""The offline wheelhouse of the core (``scripts/gpu_wheels.sh``, ``scripts/slim_wheel.py``,
``requirements/gpu-wheels.txt``): the list covers what the core needs beyond what a GPU host brings, the slimmed
NIXL wheel keeps a valid RECORD, and (``slow``: it downloads ~66 MB from the package index) the real build's
list of wheels, its total within 40 MiB, and repository plus wheelhouse within the 64 MiB that can be brought."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LIST = REPO / "requirements" / "gpu-wheels.txt"
HOST = {"torch", "numpy", "xxhash", "httpx", "urllib3", "psutil", "prometheus-client", "pytest", "pytest-timeout",
        "transformers", "idna", "certifi", "httpcore", "sniffio"}
"""What the GPU host has (docs/gpu.md; httpx brings idna, certifi, httpcore)."""


def _slim_module():
    spec = importlib.util.spec_from_file_location("slim_wheel", REPO / "scripts" / "slim_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", LIST.read_text(), re.M)
    return {canonicalize_name(n): v for n, v in pins}


def test_every_listed_wheel_is_pinned_and_hash_checked():
    text = LIST.read_text()
    blocks = re.split(r"\n(?=[A-Za-z])", text.split("\n", 6)[-1])
    pins = [b for b in blocks if "==" in b]
    assert len(pins) == len(listed()) >= 15
    for block in pins:
        assert "--hash=sha256:" in block, block


def test_the_list_covers_the_core_beyond_what_the_host_brings():
    """Every core dependency (the NIXL build for the host's CUDA 13 in place of nixl-cu12), and every requirement
    of every listed package, is on the host or in the list, at a version the requirement accepts."""
    pins = listed()
    core = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    missing = []
    for req in core:
        name = "nixl-cu13" if canonicalize_name(req.name) == "nixl-cu12" else canonicalize_name(req.name)
        if name not in HOST and name not in pins:
            missing.append(str(req))
    for name in pins:
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # not installed here (the other NIXL build)
            continue
        for spec in map(Requirement, requires):
            if spec.marker is not None and not spec.marker.evaluate({"extra": "", "python_version": "3.12"}):
                continue
            dep = canonicalize_name(spec.name)
            if dep in HOST:
                continue
            if dep not in pins or not spec.specifier.contains(pins[dep], prereleases=True):
                missing.append(f"{name} requires {spec}")
    assert not missing, missing


def _fake_wheel(path: Path) -> None:
    files = {"nixl_cu13/__init__.py": b"x = 1\n", "nixl_cu13.libs/ucx/libuct_cuda.so.0": b"\x7fELF" * 10,
             "nixl_cu13.libs/ucx/libucx_perftest_cuda.so.0": b"perf", "nixl_ep_cu13/kernels.so": b"k" * 1000,
             "nixl_cu13-1.5.1.data/headers/nixl.h": b"/* h */", "nixl_cu13-1.5.1.data/scripts/example": b"#!",
             "nixl_cu13.scripts/nixl_example": b"bin", "nixl_cu13-1.5.1.dist-info/METADATA": b"Name: nixl-cu13\n"}
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for n, d in files.items()]
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("nixl_cu13-1.5.1.dist-info/RECORD", "\n".join(rows + ["nixl_cu13-1.5.1.dist-info/RECORD,,"]) + "\n")


def test_slimming_drops_the_unused_parts_and_keeps_the_record_valid(tmp_path):
    slim = _slim_module()
    src, dst = tmp_path / "nixl_cu13-1.5.1-cp312-cp312-manylinux_2_28_x86_64.whl", tmp_path / "slim.whl"
    _fake_wheel(src)
    assert slim.record_problems(src) == []
    result = slim.slim(src, dst)
    assert result["entries_dropped"] == 5
    names = set(zipfile.ZipFile(dst).namelist())
    assert names == {"nixl_cu13/__init__.py", "nixl_cu13.libs/ucx/libuct_cuda.so.0",
                     "nixl_cu13-1.5.1.dist-info/METADATA", "nixl_cu13-1.5.1.dist-info/RECORD"}
    assert slim.record_problems(dst) == []
    tampered = tmp_path / "tampered.whl"
    with zipfile.ZipFile(dst) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, b"y = 2\n" if name.endswith("__init__.py") else zin.read(name))
        zout.writestr("extra.txt", b"not in RECORD")
    problems = slim.record_problems(tampered)
    assert any(p.startswith("nixl_cu13/__init__.py: RECORD says") for p in problems)
    assert "extra.txt: in the wheel, not in RECORD" in problems


@pytest.mark.parametrize("args, message", [(["--cuda", "11"], "--cuda must be 12 or 13"),
                                           (["--python", "3.9"], "--python must be 3.11 or 3.12"),
                                           (["--bogus"], "unknown argument '--bogus'")])
def test_gpu_wheels_refuses_what_it_cannot_build(args, message):
    done = subprocess.run(["bash", "scripts/gpu_wheels.sh", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and message in done.stderr


def brought_bytes(wheelhouse: Path) -> int:
    """What the device tool carries: tracked and untracked-not-ignored files of the repository, plus the
    wheelhouse (a carried path)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    repo = sum((REPO / n).stat().st_size for n in names if n and (REPO / n).is_file())
    return repo + sum(f.stat().st_size for f in wheelhouse.iterdir() if f.is_file())


@pytest.mark.slow  # downloads ~66 MB from the package index and recompresses the NIXL wheel (~20 s)
def test_the_built_wheelhouse_lists_every_wheel_and_fits(tmp_path):
    dest = tmp_path / "wheels"
    done = subprocess.run(["bash", "scripts/gpu_wheels.sh", "--dest", str(dest)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    assert sorted(report["files"]) == wheels and len(wheels) == len(listed()) - 1  # one NIXL build of two
    assert {canonicalize_name(w.split("-")[0]) for w in wheels} == set(listed()) - {"nixl-cu12"}
    assert all("cp312" in w or "py3-none-any" in w for w in wheels)
    assert report["total_mib"] <= 40 and f"{report['total_mib']:8.2f} MiB  total" in done.stdout
    slim = _slim_module()
    nixl = next(dest.glob("nixl_cu13-*.whl"))
    assert slim.record_problems(nixl) == [] and not any(
        n.startswith("nixl_ep_cu13/") for n in zipfile.ZipFile(nixl).namelist())
    sums = dict(reversed(line.split()) for line in (dest / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == wheels
    assert brought_bytes(dest) <= 64 << 20
