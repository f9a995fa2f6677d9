"""The offline GPU check's runner (``scripts/gpu_check.py``): every step under its own limit and the run's budget,
a failing or hanging step recorded while the next still runs, the summary always written, at most 8 files; the
wheelhouse's checksums; and (``slow``) a whole ``--device cpu`` run of ``scripts/gpu_check.sh`` with a wheelhouse
built for this Python, every step ok."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
spec.loader.exec_module(gpu_check)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_steps_run_under_their_limits_and_the_budget_and_the_summary_is_always_written(tmp_path):
    out = tmp_path / "out"
    steps = [
        gpu_check.Step("fails", py("import sys; print('partial'); sys.exit(3)"), 20),
        # A step that hangs, with a child that would outlive it: both are killed at the step's limit.
        gpu_check.Step("hangs", py("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                                   "'import time; time.sleep(60)']); print('child', p.pid, flush=True); "
                                   "time.sleep(60)"), 2),
        gpu_check.Step("ok", py("import json; print('x'); print(json.dumps({'gbps': 1.5}))"), 20,
                       {"UCX_PROTO_INFO": "y"}),
        # No log file: its output's tail goes in the summary; it is told the seconds it was given.
        gpu_check.Step("quiet", py(f"import os; print('given', os.environ['{gpu_check.STEP_SECONDS_ENV}'])"), 20,
                       log_file=False),
        gpu_check.Step("cut", py("import time; print('row: {\"readers\": 1}', flush=True); time.sleep(60)"), 60),
        gpu_check.Step("late", py("print('never')"), 20),
    ]
    budget = gpu_check.RESERVE_S + 10
    start = time.monotonic()
    gpu_check.run_all(steps, out, budget, dict(os.environ), {"check": "test"})
    elapsed = time.monotonic() - start
    assert elapsed <= budget + 5
    status = {s.name: s.status for s in steps}
    assert status == {"fails": "failed", "hangs": "timeout", "ok": "ok", "quiet": "ok", "cut": "timeout",
                      "late": "skipped"}
    assert steps[0].rc == 3 and steps[2].result == {"gbps": 1.5} and steps[2].notes == {"ucx_transports": []}
    assert steps[3].notes["output_tail"] == f"given {steps[3].given_s}\n" and not (out / "quiet.log").exists()
    assert steps[4].given_s < 60  # the budget left, not its own limit
    assert steps[4].result == {"partial": True, "rows": [{"readers": 1}]}  # what it finished before the cut
    child = int((out / "hangs.log").read_text().split("child ")[1].split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    summary = json.loads((out / "summary.json").read_text())
    assert [s["status"] for s in summary["steps"]] == list(status.values()) and summary["ok"] is False
    assert summary["steps"][3]["log"] is None and summary["steps"][3]["notes"]["output_tail"].startswith("given")
    assert summary["steps"][5]["log"] is None and "partial" in (out / "fails.log").read_text()
    assert len(list(out.iterdir())) <= gpu_check.MAX_FILES


_STOPPED = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import gpu_check
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
step = gpu_check.Step("sleeps", [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"], 60)
gpu_check.run_all([step], Path(sys.argv[1]), 120, dict(os.environ), {"check": "stopped"})
"""


def test_a_check_that_is_stopped_leaves_no_step_running_and_its_summary_written(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _STOPPED, str(tmp_path)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "summary.json").exists() or not _step_pids(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        step_pid = _step_pids(proc.pid)[0]
        proc.terminate()
        assert proc.wait(30) == 128 + 15
        assert not psutil.pid_exists(step_pid) or psutil.Process(step_pid).status() == psutil.STATUS_ZOMBIE
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["steps"][0]["status"] == "not run" and summary["ok"] is False
    finally:
        proc.kill()
        proc.wait(10)


def _step_pids(parent: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(parent).children()]
    except psutil.NoSuchProcess:
        return []


def test_the_plan_fits_the_files_that_come_back_and_the_budget_holds_every_step():
    for device in ("cuda", "cpu"):
        steps = gpu_check.plan(device, 1024, sys.executable, Path("/w"), Path("/s"))
        assert gpu_check.files_written(steps) <= gpu_check.MAX_FILES  # a log each but the install's, the summary
        assert [s.name for s in steps][:3] == ["install", "env", "probe"]
        assert all(s.limit_s <= 180 for s in steps)
        # the delta lab wants the GPU host's 16 cores, not its GPU: it runs there, last, and not in a CPU run here
        assert [s.name for s in steps if s.name == "lab"] == (["lab"] if device == "cuda" else [])
        assert device == "cpu" or steps[-1].name == "lab"
        assert steps[2].env == {"UCX_PROTO_INFO": "y"}
        bench = [s for s in steps if s.name.startswith("transport")]
        assert all(["--device", device] == s.argv[s.argv.index("--device"):s.argv.index("--device") + 2]
                   for s in bench) and {s.argv[-1] for s in bench} == {"ucx", "tcp"}
    too_many = [gpu_check.Step(f"s{i}", py("pass"), 1) for i in range(gpu_check.MAX_FILES)]
    with pytest.raises(ValueError, match="at most 8 come back"):
        gpu_check.run_all(too_many, Path("/nonexistent"), 10, {}, {})


def test_the_tests_step_runs_every_core_file_with_gpu_cases():
    # A core test file that gains a `gpu`-marked case is run on the GPU host only if the check lists it.
    with_gpu_cases = {str(p.relative_to(REPO)) for p in (REPO / "tests" / "ros").rglob("test_*.py")
                      if "mark.gpu" in p.read_text()}
    assert with_gpu_cases <= set(gpu_check.GPU_CASES_IN), sorted(with_gpu_cases - set(gpu_check.GPU_CASES_IN))


def test_ucx_protocol_tables_name_the_transports_chosen():
    log = ("[1.2] [vm:1:0] | 0..inf | zero-copy | cma/memory |\n[1.3] [vm:1:0] |   1..16515 | zero-copy  | tcp/lo  |\n"
           "| 0..inf | rendezvous cuda_ipc | cuda_ipc/cuda |\n")
    assert gpu_check.ucx_transports(log) == ["cma/memory", "cuda_ipc/cuda", "tcp/lo"]


def test_a_wheelhouse_that_differs_from_its_checksums_is_refused(tmp_path):
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"a")
    with pytest.raises(SystemExit, match="SHA256SUMS is missing"):
        gpu_check.verify_wheelhouse(tmp_path)
    subprocess.run("sha256sum -- *.whl > SHA256SUMS", shell=True, cwd=tmp_path, check=True, timeout=10)
    assert [p.name for p in gpu_check.verify_wheelhouse(tmp_path)] == ["a-1-py3-none-any.whl"]
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"b")
    with pytest.raises(SystemExit, match="does not match SHA256SUMS"):
        gpu_check.verify_wheelhouse(tmp_path)
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"b")
    with pytest.raises(SystemExit, match="not in SHA256SUMS"):
        gpu_check.verify_wheelhouse(tmp_path)


@pytest.mark.slow  # builds a wheelhouse for this Python (~66 MB from the index), then the whole check (4-7 min)
@pytest.mark.timeout(900)
def test_the_whole_check_runs_every_step_on_the_cpu(tmp_path):
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    built = subprocess.run(["bash", "scripts/gpu_wheels.sh", "--python", version, "--dest", str(wheels)], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--out", str(out), "--device", "cpu", "--size-mb", "8",
                           "--wheels", str(wheels)], cwd=REPO, env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=700)  # the check's own budget is 510 s
    summary = json.loads((out / "summary.json").read_text())
    assert summary["elapsed_s"] <= 540 and len(list(out.iterdir())) <= gpu_check.MAX_FILES
    steps = {s["name"]: s for s in summary["steps"]}
    short = ("install", "env", "probe", "tests", "digest")
    assert all(steps[name]["status"] == "ok" for name in short), done.stdout[-3000:]
    assert steps["install"]["result"]["core_imports"] == "ok"
    assert all(case["bytes_equal"] for case in steps["probe"]["result"]["cases"])
    assert steps["probe"]["notes"]["ucx_transports"]  # UCX printed its protocol tables
    for name in ("transport_nixl", "transport_tcp"):
        # Each spawns a dozen processes that import torch: on a machine whose cores are shared with other work they
        # can outlast their limit, which the summary must then say (and keep the rows finished by then).
        step = steps[name]
        assert step["status"] in ("ok", "timeout"), done.stdout[-3000:]
        rows = (step["result"] or {}).get("rows", [])
        assert step["status"] == "timeout" or len(rows) == 2
        assert all(row["device_copy_gbps"] > 0 and row["tensorhub_gbps"] > 0 for row in rows)


def test_the_lab_step_passes_saying_why_where_the_host_cannot_build_a_lab(monkeypatch, capsys):
    lab_spec = importlib.util.spec_from_file_location("gpu_lab", REPO / "scripts" / "gpu_lab.py")
    gpu_lab = importlib.util.module_from_spec(lab_spec)
    lab_spec.loader.exec_module(gpu_lab)
    from tensorhub_dev.netlab import iproute
    from tensorhub_dev.netlab.errors import NetlabUnavailable

    def unavailable():
        raise NetlabUnavailable("building network namespaces needs root (euid 0)")

    monkeypatch.setattr(iproute, "check_available", unavailable)
    ran = []
    monkeypatch.setattr(gpu_lab, "run_mode", lambda *a, **k: ran.append(a))
    assert gpu_lab.main(["--limit-s", "100"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "needs root" in out["skipped"] and out["cpus"] == os.cpu_count() and ran == []
