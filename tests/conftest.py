"""Suite-wide: no process started by a test outlives the run. Every process the run starts carries a marker in
its environment; at the end, any that is still alive after a grace period (a hub, a vLLM engine, a Ray node, a
role of a benchmark, ...) is listed, killed, and fails the run."""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

SESSION_ENV = "TENSORHUB_TEST_SESSION"
GRACE_S = 30.0
# Python's own helpers that live as long as the pytest process and end with it.
_EXEMPT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)


def _started_by_this_run(marker: str) -> list[psutil.Process]:
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(SESSION_ENV) != marker or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if any(e in " ".join(proc.info["cmdline"] or ()) for e in _EXEMPT):
            continue
        found.append(proc)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    marker = os.environ.get(SESSION_ENV)
    if not marker or hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + GRACE_S
    left = _started_by_this_run(marker)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _started_by_this_run(marker)
    if not left:
        return
    lines = []
    for proc in left:
        try:
            lines.append(f"  pid {proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"\n{len(lines)} process(es) started by this test run outlived it (killed now):\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
