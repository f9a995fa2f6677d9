"""Processes left behind: every process on this host whose environment carries a marker.

A launcher puts a unique ``NAME=value`` into the environment of what it starts; every descendant inherits it
(vLLM's engine core and workers, Ray's raylet and workers, a node's children re-parented to init after their
parent died), so scanning ``/proc/<pid>/environ`` for it finds what a process tree left behind even when the
tree itself is gone. Processes that are already zombies have exited and are not listed.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER_ENV = "TENSORHUB_LEFTOVER_MARKER"
"""The variable a test sets on what it launches, to find its leftovers afterwards."""


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    ppid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}): {self.cmdline[:200]}"


def new_marker() -> str:
    return uuid.uuid4().hex


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def _state_and_ppid(proc: Path) -> tuple[str, int] | None:
    stat = _read(proc / "stat")
    if stat is None:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after "(comm)", which may hold spaces
    return fields[0].decode(), int(fields[1])


def with_marker(value: str, name: str = MARKER_ENV, proc_root: str = "/proc") -> list[Leftover]:
    """Live (not zombie) processes of this host with ``name=value`` in their environment, this one excluded."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        environ = _read(entry / "environ")
        if environ is None or wanted not in environ.split(b"\0"):
            continue
        state = _state_and_ppid(entry)
        if state is None or state[0] in ("Z", "X"):
            continue
        cmdline = (_read(entry / "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(Leftover(int(entry.name), state[1], cmdline))
    return found


def wait_none_with_marker(value: str, timeout: float, name: str = MARKER_ENV) -> list[Leftover]:
    """Waits up to ``timeout`` s for every process with the marker to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    left = with_marker(value, name)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = with_marker(value, name)
    return left


def alive(pids: list[int], proc_root: str = "/proc") -> list[int]:
    """Those of ``pids`` that are still running (a zombie has exited: it is not listed)."""
    out = []
    for pid in pids:
        state = _state_and_ppid(Path(proc_root) / str(pid))
        if state is not None and state[0] not in ("Z", "X"):
            out.append(pid)
    return out


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Waits up to ``timeout`` s for every one of ``pids`` to end; returns those still running."""
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    return left


__all__ = ["Leftover", "MARKER_ENV", "alive", "new_marker", "wait_gone", "wait_none_with_marker", "with_marker"]
