"""Child process trees that never outlive their launcher: each command runs in its own session (process group),
and stopping it signals the whole group, so that what the child started (vLLM's engine core and workers,
Ray's raylet) goes too, even when the child itself no longer answers."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO

logger = logging.getLogger("tensorhub_verl.process_group")


def start_group(command: Sequence[str], *, env: Mapping[str, str] | None = None,
                log: IO | None = None, term_with_parent: bool = False) -> subprocess.Popen:
    """Starts ``command`` as the leader of a new session; output to ``log`` (or inherited).

    ``term_with_parent``: the kernel sends the leader SIGTERM when this process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``), so that a leader which stops its own tree on SIGTERM (``attach-vllm``, a Ray driver,
    whose cluster shares its fate) leaves nothing behind. The signal follows the thread that starts the child:
    call it from one that lives as long as the process (the main thread)."""
    return subprocess.Popen(list(command), env=dict(env) if env is not None else None, stdout=log,
                            stderr=subprocess.STDOUT if log is not None else None, start_new_session=True,
                            preexec_fn=_signal_on_parent_death(signal.SIGTERM) if term_with_parent else None)


def _signal_on_parent_death(sig: int):
    """A ``preexec_fn`` that asks for ``sig`` when the parent dies (looked up before the fork: the child only
    makes the call), and exits if the parent died before the request took effect."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(1)

    return preexec


_PR_SET_PDEATHSIG = 1


def stop_group(proc: subprocess.Popen, timeout: float = 60.0) -> int | None:
    """SIGTERM to ``proc``'s whole group, waits up to ``timeout`` s for the leader, then SIGKILLs whatever of the
    group is left (the leader's children included, even after the leader exited). Returns the leader's exit code."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("process group %d ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
        code = None
    _signal_group(proc.pid, signal.SIGKILL)
    if code is None:
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            logger.error("process %d survived SIGKILL for 30 s", proc.pid)
    return code


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is empty: everything in it has exited


EXIT_WITH_PARENT_ENV = "TENSORHUB_EXIT_WITH_PARENT"
"""Set by a launcher to its own pid: every process below it that calls ``exit_with_parent_if_asked`` (vLLM's
engine core and workers, through the ``vllm.general_plugins`` hook) is killed by the kernel when its parent
dies, so a launcher killed with SIGKILL leaves no orphans. The launcher itself is exempt."""


def exit_with_parent_if_asked() -> bool:
    """Asks the kernel (Linux ``PR_SET_PDEATHSIG``) to SIGKILL this process when its parent exits, if a launcher
    set ``TENSORHUB_EXIT_WITH_PARENT`` and this is not the launcher. Returns whether it did."""
    launcher = os.environ.get(EXIT_WITH_PARENT_ENV)
    if not launcher or launcher == str(os.getpid()) or not os.path.exists("/proc/self"):
        return False
    import ctypes

    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); this process may outlive its parent",
                       ctypes.get_errno())
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    return True


__all__ = ["EXIT_WITH_PARENT_ENV", "exit_with_parent_if_asked", "start_group", "stop_group"]
