"""Child process trees end with their launcher: ``stop_group`` takes a command's whole group (grandchildren
included), and ``exit_with_parent_if_asked`` makes a child die with a parent killed outright. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tensorhub_verl.process_group import EXIT_WITH_PARENT_ENV, start_group, stop_group
from tensorhub_dev.testing.leftovers import alive, wait_gone


def _read_pid(path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"no pid in {path} within {timeout} s")


def test_stop_group_takes_the_grandchildren_of_a_child_that_ignores_sigterm(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # The child ignores SIGTERM and leaves a grandchild that outlives it unless the group is killed.
    script = f"trap '' TERM; sleep 300 & echo $! > {pid_file}; wait"
    proc = start_group(["bash", "-c", script])
    grandchild = _read_pid(pid_file)
    code = stop_group(proc, timeout=1.0)
    assert code == -signal.SIGKILL
    assert not wait_gone([grandchild], 10), "the grandchild outlived its group"


def test_a_child_asked_to_exit_with_its_parent_dies_when_the_parent_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import pathlib, time
        from tensorhub_verl.process_group import exit_with_parent_if_asked
        assert exit_with_parent_if_asked()
        pathlib.Path({str(pid_file)!r}).write_text(str(__import__("os").getpid()))
        time.sleep(300)
    """)
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys, time
        os.environ[{EXIT_WITH_PARENT_ENV!r}] = str(os.getpid())
        subprocess.Popen([sys.executable, "-c", {child!r}])
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    try:
        pid = _read_pid(pid_file)
        assert psutil.Process(pid).ppid() == parent.pid
        parent.kill()  # SIGKILL: the launcher cannot clean up
        parent.wait(10)
        assert not wait_gone([pid], 10), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


def test_the_launcher_itself_is_not_tied_to_its_parent(monkeypatch):
    from tensorhub_verl.process_group import exit_with_parent_if_asked

    monkeypatch.setenv(EXIT_WITH_PARENT_ENV, str(os.getpid()))
    assert exit_with_parent_if_asked() is False
    monkeypatch.delenv(EXIT_WITH_PARENT_ENV)
    assert exit_with_parent_if_asked() is False


def test_a_group_leader_started_to_end_with_its_launcher_gets_sigterm_when_the_launcher_is_killed(tmp_path):
    """The demo's children: its launcher SIGKILLed (no finally runs), the leader still gets SIGTERM, the signal
    on which ``attach-vllm`` and a Ray driver stop their own trees."""
    pid_file, term_file = tmp_path / "leader.pid", tmp_path / "leader.term"
    leader = textwrap.dedent(f"""
        import os, pathlib, signal, sys, time
        def on_term(*_):
            pathlib.Path({str(term_file)!r}).write_text("TERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))
        time.sleep(300)
    """)
    launcher = textwrap.dedent(f"""
        import sys, time
        from tensorhub_verl.process_group import start_group
        start_group([sys.executable, "-c", {leader!r}], term_with_parent=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    pid = None
    try:
        pid = _read_pid(pid_file)
        parent.kill()
        parent.wait(10)
        assert not wait_gone([pid], 10), "the leader outlived its SIGKILLed launcher"
        assert term_file.read_text() == "TERM"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        if pid is not None and alive([pid]):
            os.killpg(pid, signal.SIGKILL)
