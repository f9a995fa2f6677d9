"""`tensorhub hub` in a child process at a fixed port: benchmarks and fault tests kill, freeze and restart it."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import httpx

from tensorhub_verl.errors import HubUnavailable
from tensorhub_verl.ros.wire.hub_proof import HELLO_PATH, new_nonce


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubProcess:
    """A hub process on 127.0.0.1:``port`` (a free one by default); ``start`` again after ``kill`` brings up a
    new instance, which knows nothing, at the same URL. ``args`` are extra `tensorhub hub` flags."""

    def __init__(self, port: int | None = None, args: tuple[str, ...] = (), stderr_path: str | None = None,
                 open_files: int | None = None):
        """``open_files``: the child's limit of open files (soft and hard), as on a host configured so."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = tuple(args)
        self.stderr_path = stderr_path
        self.open_files = open_files
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise HubUnavailable("the hub process is not running")
        return self.process.pid

    def start(self, timeout: float = 60.0) -> "HubProcess":
        stderr = open(self.stderr_path or os.devnull, "a")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tensorhub_verl.cli", "hub", "--port", str(self.port), *self.args],
                stdout=subprocess.DEVNULL, stderr=stderr,
                preexec_fn=None if self.open_files is None else self._limit_open_files)
        finally:
            stderr.close()  # the child has its own copy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HubUnavailable(f"hub process exited with {self.process.returncode} while starting")
            try:
                # the token-less hello: answered by a hub with a token too
                if httpx.get(f"{self.url}{HELLO_PATH}", params={"nonce": new_nonce()}, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.kill()
        raise HubUnavailable(f"hub process did not answer on {self.url} within {timeout:.0f} s")

    def _limit_open_files(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL: no goodbye, every bit of soft state lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)  # a frozen hub cannot act on SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(timeout)

    def __enter__(self) -> "HubProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux /proc), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
