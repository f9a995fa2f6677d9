"""The suite-wide check of ``tests/conftest.py``: a run whose test leaves a process alive fails, and the process
is killed; a run whose test ends its process passes. Each case is a pytest run of its own in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorhub_dev.testing.leftovers import alive, wait_gone
from tests.conftest import GRACE_ENV, SESSION_ENV

REPO = Path(__file__).resolve().parents[1]

LEAVES = """
    import subprocess, sys
    def test_starts_a_process():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({pid_file!r}, "w").write(str(p.pid))
        if {reap}:
            p.kill()
            p.wait(30)
"""


# A role (tensorhub_verl.bench.procs): forked by multiprocessing's fork server, it shows the server's command line.
LEAVES_A_ROLE = """
    import time
    from tensorhub_verl.bench.procs import Role
    def _idle(results, control):
        import os
        results.put(("ok", os.getpid()))
        time.sleep(600)
    def test_starts_a_role():
        open({pid_file!r}, "w").write(str(Role(_idle).result(120)))
"""


def _run_inner(tmp_path: Path, reap: bool, body: str = LEAVES) -> tuple[subprocess.CompletedProcess, int]:
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    pid_file = str(tmp_path / "pid")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body.format(pid_file=pid_file, reap=reap)))
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}  # the inner run marks its own processes
    env.update({GRACE_ENV: "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "dev")])})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    return proc, int(Path(pid_file).read_text())


def test_a_process_left_by_a_test_fails_the_run_and_is_killed(tmp_path):
    proc, pid = _run_inner(tmp_path, reap=False)
    try:
        assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
        assert "outlived it" in proc.stdout and f"pid {pid} " in proc.stdout, proc.stdout
        assert wait_gone([pid], 30) == [], f"the check did not kill pid {pid}"
    finally:
        if alive([pid]):
            os.kill(pid, 9)


def test_a_run_that_ends_its_processes_passes(tmp_path):
    proc, pid = _run_inner(tmp_path, reap=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "outlived" not in proc.stdout and alive([pid]) == []



def test_a_role_left_by_a_test_fails_the_run_though_its_fork_server_is_exempt(tmp_path):
    proc, pid = _run_inner(tmp_path, reap=False, body=LEAVES_A_ROLE)
    try:
        assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
        assert "1 process(es)" in proc.stdout and f"pid {pid} " in proc.stdout, proc.stdout
    finally:
        if alive([pid]):
            os.kill(pid, 9)
