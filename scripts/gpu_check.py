"""The offline GPU check: one command that installs the core's wheelhouse and runs every GPU path of the core,
each step under its own time limit, inside one budget for the whole run.

    python scripts/gpu_check.py --out DIR [--wheels .gpu_wheels] [--device cuda] [--size-mb 1024] [--budget-s 510]

Steps, in order (a step that fails or runs out of time is recorded and the next one runs):

==================  ===========================================================================================
install             checks the wheelhouse's SHA256SUMS, notes which of its modules this Python imports without it
                    (none, on the host it is built for), installs it with ``pip --no-index --no-deps --target``
                    into a temporary folder (unpacking the wheels where pip is missing), and imports the core
env                 GPU, driver, torch and its CUDA, the NIXL build and UCX that load, where libcuda,
                    libnvidia-ml and libcudart come from, what UCX lacks to move CUDA memory (``gpu_env.py``)
probe               NIXL alone, 1 GiB between two processes and within one, bytes checked, GB/s, with
                    ``UCX_PROTO_INFO=y``: UCX's protocol tables name the transport it chose (``gpu_probe.py``)
tests               ``tests/gpu`` without the engine tests (vLLM, verl): ``-m "not engine and not slow"``
digest              chunk and block digest throughput on the device (``tensorhub_verl.bench.digest``)
transport_nixl      ``bench transport --device D --wire ucx``, 1 and 4 readers, beside torch's copy on the device
transport_tcp       the same with ``--wire tcp`` (pinned bounce buffers on a GPU)
lab                 (cuda only) the delta lab, ``bench modes --delta`` cross-dc then standalone, TensorHub against
                    every rollout pulling the delta from the trainer, on a host with a core per emulated host
                    (``gpu_lab.py``; needs root and iproute2, else it says why and passes)
==================  ===========================================================================================

Written to ``--out`` (8 files at most): ``summary.json`` (rewritten after every step, so it is there whatever
happens: each step's status, return code, seconds, limit and the JSON object its output ended with) and one
``<step>.log`` per step (its output, cut to its first and last MiB past 4 MiB), except the install step's, whose
last lines go in the summary. ``--device cpu`` runs every step
on the CPU, to check the check itself where there is no GPU (the GPU tests then skip; the CUDA guards' tests and
the GPU tier's collection test run beside them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FILES = 8
LOG_CAP = 4 << 20
SUMMARY_TAIL = 4000
"""Characters of a step's output kept in the summary when it writes no log file."""
STEP_SECONDS_ENV = "GPU_CHECK_STEP_S"
"""Set for every step: the seconds it is given (its limit, or less where the budget left is shorter)."""
RESERVE_S = 8.0
"""Seconds kept back from the budget for killing a step and writing the summary."""
WHEELHOUSE_MODULES = ("fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn", "httptools", "anyio",
                      "zstandard", "nixl_cu13", "nixl_cu12")
"""Modules the wheelhouse brings (the ones a GPU host lacks)."""
CORE_IMPORTS = ("tensorhub_verl", "tensorhub_verl.ros.hub.app", "tensorhub_verl.ros.planes.nixl",
                "tensorhub_verl.ros.planes.tcp", "tensorhub_verl.bench.transport",
                "uvicorn.protocols.http.httptools_impl", "tensorhub_verl.ros.wire.delta_codec")


@dataclass(slots=True)
class Step:
    """One command of the check. ``limit_s``: its own limit (the budget left may cut it shorter)."""

    name: str
    argv: list[str]
    limit_s: float
    env: dict[str, str] = field(default_factory=dict)
    status: str = "not run"
    """ok | failed | timeout | skipped (no budget left) | not run"""
    rc: int | None = None
    seconds: float = 0.0
    given_s: float = 0.0
    result: object = None
    notes: dict = field(default_factory=dict)
    log_file: bool = True
    """Whether its output goes to ``<name>.log``; else its last ``SUMMARY_TAIL`` characters go in the summary."""


def _last_json(text: str) -> object:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _rows(text: str) -> list:
    """The ``row: {...}`` lines a benchmark prints as it goes."""
    rows = []
    for line in text.splitlines():
        if line.startswith("row: {"):
            try:
                rows.append(json.loads(line[5:]))
            except ValueError:
                continue
    return rows


def _capped(text: str) -> str:
    if len(text) <= LOG_CAP:
        return text
    keep = 1 << 20
    return text[:keep] + f"\n[... {len(text) - 2 * keep} characters cut ...]\n" + text[-keep:]


def ucx_transports(log: str) -> list[str]:
    """Transport/device pairs named in UCX's protocol tables (``UCX_PROTO_INFO=y``), e.g. ``cuda_ipc/cuda``."""
    return sorted(set(re.findall(r"\|\s*([a-z][a-z0-9_]*/[A-Za-z0-9_:.\-]+)\s*\|", log)))


def run_step(step: Step, out: Path, deadline: float, base_env: dict[str, str]) -> None:
    """Runs ``step`` in its own process group for at most its limit and the budget left; writes its log."""
    left = deadline - time.monotonic() - RESERVE_S
    if left < 1:
        step.status = "skipped"
        step.notes["why"] = "no time left in the run's budget"
        return
    step.given_s = round(min(step.limit_s, left), 1)
    start = time.monotonic()
    # STEP_SECONDS_ENV tells the step the seconds it has, so that one that cleans up after itself can stop in time
    env = {**base_env, **step.env, STEP_SECONDS_ENV: str(step.given_s)}
    proc = subprocess.Popen(step.argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=step.given_s)
        step.rc = proc.returncode
        step.status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the step's whole process group: its children too
        output, _ = proc.communicate(timeout=30)
        step.rc, step.status = proc.returncode, "timeout"
    except BaseException:  # the check itself is stopped (SIGTERM, Ctrl-C): no step outlives it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise
    step.seconds = round(time.monotonic() - start, 2)
    text = output.decode(errors="replace")
    step.result = _last_json(text)
    if step.result is None and (rows := _rows(text)):  # a benchmark cut short: the rows it finished
        step.result = {"partial": True, "rows": rows}
    if "UCX_PROTO_INFO" in step.env:
        step.notes["ucx_transports"] = ucx_transports(text)
    if not step.log_file:
        step.notes["output_tail"] = text[-SUMMARY_TAIL:]
        return
    header = f"$ {' '.join(step.argv)}\n# status {step.status}, rc {step.rc}, {step.seconds} s of {step.given_s} s\n"
    (out / f"{step.name}.log").write_text(header + _capped(text))


def write_summary(out: Path, info: dict, steps: list[Step]) -> None:
    rows = []
    for s in steps:
        row = asdict(s)
        row.pop("env")
        row["log"] = f"{s.name}.log" if s.log_file and s.status not in ("skipped", "not run") else None
        rows.append(row)
    summary = {**info, "elapsed_s": round(time.monotonic() - info["_t0"], 1), "steps": rows,
               "ok": all(s.status == "ok" for s in steps)}
    summary.pop("_t0")
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    tmp.replace(out / "summary.json")


def files_written(steps: list[Step]) -> int:
    """The files a run of ``steps`` leaves in ``--out``: a log per step that writes one, and the summary."""
    return sum(s.log_file for s in steps) + 1


def run_all(steps: list[Step], out: Path, budget_s: float, base_env: dict[str, str], info: dict) -> list[Step]:
    """Every step in order within ``budget_s``; the summary is rewritten after each one and at the end."""
    if files_written(steps) > MAX_FILES:
        raise ValueError(f"{len(steps)} steps write {files_written(steps)} files; at most {MAX_FILES} come back")
    out.mkdir(parents=True, exist_ok=True)
    info = {**info, "_t0": time.monotonic(), "budget_s": budget_s}
    deadline = time.monotonic() + budget_s
    try:
        for step in steps:
            write_summary(out, info, steps)
            run_step(step, out, deadline, base_env)
    finally:
        write_summary(out, info, steps)
    return steps


# ------------------------------------------------------------------------------------------ the steps
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_wheelhouse(wheels: Path) -> list[Path]:
    """The wheels listed in ``wheels/SHA256SUMS``, each checked; raises naming the first that is missing or
    differs, or a wheel that is not listed."""
    sums = wheels / "SHA256SUMS"
    if not sums.is_file():
        raise SystemExit(f"{sums} is missing: build the wheelhouse with scripts/gpu_wheels.sh")
    listed = {}
    for line in sums.read_text().split("\n"):
        if line.strip():
            digest, name = line.split(maxsplit=1)
            listed[name.strip().lstrip("*")] = digest
    unlisted = sorted(p.name for p in wheels.glob("*.whl") if p.name not in listed)
    if unlisted:
        raise SystemExit(f"wheels not in SHA256SUMS: {unlisted}")
    for name, digest in listed.items():
        path = wheels / name
        if not path.is_file():
            raise SystemExit(f"{name} is listed in SHA256SUMS but missing from {wheels}")
        if _sha256(path) != digest:
            raise SystemExit(f"{name} does not match SHA256SUMS: rebuild the wheelhouse")
    return [wheels / n for n in sorted(listed)]


def importable(python: str, modules: tuple[str, ...], env: dict[str, str]) -> dict[str, bool]:
    code = ("import importlib.util, json, sys; print(json.dumps({m: importlib.util.find_spec(m) is not None "
            "for m in sys.argv[1:]}))")
    done = subprocess.run([python, "-c", code, *modules], env=env, capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def install(wheels: Path, site: Path, python: str) -> dict:
    """Installs every wheel into ``site`` with pip (no index, no dependencies), or unpacks them where this
    Python has no pip (each of these wheels installs by unpacking: none has a ``.data`` folder)."""
    files = verify_wheelhouse(wheels)
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    before = importable(python, WHEELHOUSE_MODULES, bare)
    has_pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0
    if has_pip:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                        "--no-deps", "--no-compile", "--target", str(site), *map(str, files)],
                       check=True, timeout=240, env={**bare, "PIP_CONFIG_FILE": os.devnull})
    else:
        for f in files:
            with zipfile.ZipFile(f) as z:
                if any(".data/" in n for n in z.namelist()):
                    raise SystemExit(f"{f.name} has a .data folder: install it with pip")
                z.extractall(site)
    after_env = {**bare, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    after = importable(python, WHEELHOUSE_MODULES, after_env)
    core = subprocess.run([python, "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
                           *CORE_IMPORTS], env=after_env, capture_output=True, text=True, timeout=120)
    return {"wheels": [f.name for f in files], "wheelhouse_mib": round(sum(f.stat().st_size for f in files) / 2**20, 2),
            "installer": "pip --no-index --no-deps --target" if has_pip else "unpacked (no pip)",
            "importable_before": [m for m, ok in before.items() if ok],
            "importable_after": [m for m, ok in after.items() if ok],
            "core_imports": "ok" if core.returncode == 0 else core.stderr[-2000:]}


GPU_CASES_IN = ("tests/ros/test_lindigest_device.py", "tests/ros/test_block_digests.py", "tests/ros/test_delta_codec.py",
                "tests/ros/test_delta_form.py", "tests/ros/test_delta_slice_apply.py")
"""Core test files with ``gpu``-marked cases; the check runs only those cases of them on a GPU."""


LAB_LIMIT_S = 180
"""The lab step's limit: the last step, it takes what the budget has left up to this."""


def plan(device: str, size_mb: int, python: str, wheels: Path, site: Path) -> list[Step]:
    """The steps for ``device`` (cuda: the GPU host; cpu: the same steps in host memory)."""
    me = [python, str(Path(__file__).resolve())]
    # The GPU tier's core part and the GPU cases of the core's own test files (digests, codec on the device).
    tests, marks = ["tests/gpu", *GPU_CASES_IN], "gpu and not engine and not slow"
    if device == "cpu":  # the GPU tests skip here: the CUDA guards' tests and the tier's collection test run instead
        tests, marks = ["tests/gpu", "tests/ros/test_ucx_cuda.py", "tests/test_gpu_tier_collects.py"], "not engine and not slow"
    bench = [python, "-m", "tensorhub_verl.cli", "bench", "transport", "--device", device, "--readers", "1,4",
             "--size-mb", str(size_mb), "--repeats", "3", "--first-mb", "0", "--chunk-mb", "8"]
    steps = [
        Step("install", [*me, "--install-only", "--wheels", str(wheels), "--site", str(site)], 90, log_file=False),
        Step("env", [python, "scripts/gpu_env.py", "--device", device], 40),
        Step("probe", [python, "scripts/gpu_probe.py", "--device", device, "--size-mb", str(size_mb),
                       "--repeats", "3", "--timeout", "40"], 75, {"UCX_PROTO_INFO": "y"}),
        Step("tests", [python, "-m", "pytest", *tests, "-m", marks, "-q", "-p", "no:cacheprovider",
                       "-o", "addopts=", "--timeout", "100", "-ra"], 120, {"TENSORHUB_CORE_ONLY": "1"}),
        Step("digest", [python, "-m", "tensorhub_verl.bench.digest", "--size-mb", str(size_mb), "--repeats", "3",
                        "--devices", device], 45),
        Step("transport_nixl", [*bench, "--wire", "ucx"], 170),
        Step("transport_tcp", [*bench, "--wire", "tcp"], 170),
    ]
    if device == "cuda":  # the lab does not touch the GPU: it wants the host's cores, which a CPU run here lacks
        steps.append(Step("lab", [python, "scripts/gpu_lab.py"], LAB_LIMIT_S))
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for summary.json and the steps' logs (8 files at most)")
    parser.add_argument("--wheels", type=Path, default=REPO / ".gpu_wheels")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size-mb", type=int, default=1024, help="bytes each transfer moves (MiB)")
    parser.add_argument("--budget-s", type=float, default=510.0, help="the whole run's limit, in seconds")
    parser.add_argument("--python", default=sys.executable, help="the Python (with torch) the steps run with")
    parser.add_argument("--site", type=Path, help="the install folder (default: a temporary one, removed after)")
    parser.add_argument("--install-only", action="store_true", help="the install step alone (the check runs it)")
    args = parser.parse_args(argv)
    if args.install_only:
        result = install(args.wheels.resolve(), args.site, args.python)
        print(json.dumps(result))
        return 0 if result["core_imports"] == "ok" else 1
    if args.out is None:
        parser.error("--out is required: the folder the summary and the logs go to")
    # SIGTERM unwinds like Ctrl-C, so the running step's process group is killed and the summary written.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    site = args.site or Path(tempfile.mkdtemp(prefix="tensorhub-gpu-site-"))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    # The test suite marks the processes of a run in their environment and, at its end, kills those still alive:
    # the tests step is a run of its own, which must not count this check (started by an outer run) as its own.
    env.pop("TENSORHUB_TEST_SESSION", None)
    steps = plan(args.device, args.size_mb, args.python, args.wheels.resolve(), site)
    info = {"check": "gpu", "device": args.device, "size_mb": args.size_mb, "python": args.python,
            "wheels": str(args.wheels), "repo_commit": _commit()}
    try:
        run_all(steps, args.out, args.budget_s, env, info)
    finally:
        if args.site is None:
            shutil.rmtree(site, ignore_errors=True)
    for s in steps:
        print(f"{s.name:15} {s.status:8} rc={s.rc!s:5} {s.seconds:7.1f} s of {s.given_s:6.1f}")
    print(json.dumps({"gpu_check": "done", "ok": all(s.status == "ok" for s in steps),
                      "steps": {s.name: s.status for s in steps}}))
    return 0 if all(s.status == "ok" for s in steps) else 1


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
