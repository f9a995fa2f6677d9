"""Suite-wide: no process started by a test outlives the run. Every process the run starts carries a marker in
its environment; at the end, any that is still alive after a grace period (a hub, a vLLM engine, a Ray node, a
role of a benchmark, ...) is listed, killed, and fails the run (``tests/test_orphan_check.py`` checks this
check)."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "dev"
# The developer tools (dev/, the package tensorhub_dev) serve the tests from this checkout: in this process and
# in every process a test starts (scripts/setup.sh also installs them: `pip install -e dev/`).
if str(DEV) not in sys.path:
    sys.path.insert(0, str(DEV))
if str(DEV) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DEV), os.environ.get("PYTHONPATH")]))

from tensorhub_dev.testing.leftovers import Leftover, with_marker  # noqa: E402

SESSION_ENV = "TENSORHUB_TEST_SESSION"
GRACE_ENV = "TENSORHUB_TEST_GRACE_S"
"""Seconds the processes of the run get to end after its last test (default 30)."""
# Python's own helpers that live as long as the pytest process and end with it: exempt when the pytest process
# started them itself. A process forked by the fork server shows the server's command line, and is checked.
_EXEMPT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def pytest_configure(config: pytest.Config) -> None:
    # Every run marks its own processes, a pytest run inside a test too: taking the outer run's marker, it would
    # count the outer run's processes (its fork server) as its own leftovers and kill them. xdist workers share
    # their controller's marker, which checks for them.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[SESSION_ENV] = uuid.uuid4().hex


def _started_by_this_run(marker: str) -> list[Leftover]:
    return [p for p in with_marker(marker, name=SESSION_ENV)
            if not (p.ppid == os.getpid() and any(e in p.cmdline for e in _EXEMPT))]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    marker = os.environ.get(SESSION_ENV)
    if not marker or hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + float(os.environ.get(GRACE_ENV, "30"))
    left = _started_by_this_run(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _started_by_this_run(marker)
    if not left:
        return
    for proc in left:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = (f"\n{len(left)} process(es) started by this test run outlived it (killed now):\n"
            + "\n".join(f"  {p}" for p in left))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
