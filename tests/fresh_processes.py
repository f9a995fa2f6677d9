"""A module's fresh-process checks, run two at a time in the background.

Some checks need a fresh interpreter each (Hydra's global state, verl's plugin registry and platform
singletons are per process), and each such process spends ~10 s importing verl. Run one after another they
leave one of CI's two cores idle; here a module names its checks once, the first test that needs one starts
all the checks whose tests were collected, and each test waits for its own. Every check is still its own
process with its own environment; a test reads the same ``CompletedProcess`` it would have run itself.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

AT_ONCE = 2
"""Processes running at once: CI's core count (each check is one busy interpreter)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One fresh process: ``argv`` run with ``env`` (the whole environment) in ``cwd``, output captured."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    timeout: float = 240.0


class FreshProcesses:
    """The checks of one module, started at most ``AT_ONCE`` at a time; ``result(name)`` waits for one."""

    def __init__(self, checks: Mapping[str, Check]):
        self._pool = ThreadPoolExecutor(AT_ONCE, thread_name_prefix="tests-fresh-process")
        self._runs: dict[str, Future] = {name: self._pool.submit(self._run, check) for name, check in checks.items()}

    @staticmethod
    def _run(check: Check) -> subprocess.CompletedProcess:
        # subprocess.run kills the child when its timeout passes: nothing outlives the check.
        return subprocess.run(list(check.argv), capture_output=True, text=True, timeout=check.timeout,
                              env=None if check.env is None else dict(check.env), cwd=check.cwd)

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The finished process of check ``name`` (its timeout, if it ran past it, is raised here)."""
        if name not in self._runs:
            raise KeyError(f"check {name!r} was not started: its test was not collected, or it is not in the "
                           f"module's checks ({sorted(self._runs)})")
        return self._runs[name].result()

    def close(self) -> None:
        """Drops the checks not yet started and waits for the running ones (each bounded by its timeout)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def fresh_processes(request: pytest.FixtureRequest, checks_by_test: Mapping[str, Callable[[], Mapping[str, Check]]]
                    ) -> FreshProcesses:
    """Starts the checks of the module's collected tests: ``checks_by_test`` maps a test function's name to a
    function returning its checks (built only when that test runs in this session)."""
    module = request.module.__name__
    collected = {item.originalname for item in request.session.items
                 if getattr(item, "module", None) is not None and item.module.__name__ == module}
    checks: dict[str, Check] = {}
    for test, build in checks_by_test.items():
        if test in collected:
            checks.update(build())
    return FreshProcesses(checks)


__all__ = ["AT_ONCE", "Check", "FreshProcesses", "fresh_processes"]
