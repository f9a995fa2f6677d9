"""``scripts/setup.sh``'s air-gapped flags, dry: ``--wheelhouse DIR`` (build every wheel of a build on a connected
machine) and ``--offline DIR`` (install from DIR alone), printed with ``--dry-run``, and every misuse refused
with exit code 2 and a message naming the fix. Nothing is downloaded or installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def setup(*args: str, venv: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TENSORHUB_VENV": str(venv or "/nonexistent/venv")}
    env.pop("TENSORHUB_BUILD", None)
    return subprocess.run(["bash", "scripts/setup.sh", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


def commands(done: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]


def test_wheelhouse_builds_every_wheel_of_the_gpu_build_at_its_pins_and_installs_nothing(tmp_path):
    done = setup("--gpu", "--wheelhouse", str(tmp_path / "wh"), "--dry-run")
    assert done.returncode == 0, done.stderr
    cmds = commands(done)
    assert all(" -w " + str(tmp_path / "wh") in c for c in cmds if "pip wheel" in c)
    assert any("pip wheel" in c and ".[dev,verl,gpu]" in c and "constraints-gpu.txt" in c for c in cmds)
    assert any("--no-deps" in c and "TransferQueue==0.1.11" in c for c in cmds)
    assert not any(" install " in c or " venv " in c for c in cmds)
    assert not (tmp_path / "wh").exists()  # a dry run creates nothing


def test_offline_installs_from_the_wheelhouse_alone(tmp_path):
    done = setup("--gpu", "--offline", str(tmp_path), "--dry-run", venv=tmp_path / "venv")
    assert done.returncode == 0, done.stderr
    installs = [c for c in commands(done) if " install " in c]
    assert len(installs) == 4 and all(f"--no-index --find-links {tmp_path}" in c for c in installs)
    assert any(c.endswith("tensorhub_verl[dev,verl,gpu]") for c in installs)  # the package's wheel, not -e .
    core = commands(setup("--cpu", "--core", "--offline", str(tmp_path), "--dry-run", venv=tmp_path / "venv"))
    assert core[-1].endswith("-c requirements/constraints.txt tensorhub_verl[dev]")


@pytest.mark.parametrize("args, message", [
    (["--offline"], "--offline needs a folder"),
    (["--wheelhouse", "--gpu"], "--wheelhouse needs a folder"),
    (["--gpu", "--offline", "/nonexistent/wheels"], "holds no wheels; build it with --wheelhouse"),
    (["--gpu", "--wheelhouse", "/tmp/a", "--offline", "/tmp/b"], "are separate runs"),
    (["--wheelhouse", "/tmp/a", "--dry-run"], "--wheelhouse needs --gpu or --cpu"),
    (["--bogus"], "unknown argument '--bogus'"),
])
def test_misuse_is_refused_naming_the_fix(args, message):
    done = setup(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
