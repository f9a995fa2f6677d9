"""Thin wrapper over `ip` and `tc`: every call has a timeout and a typed error that names the command."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from tensorhub_dev.netlab.errors import NetlabError, NetlabUnavailable

log = logging.getLogger("tensorhub_dev.netlab")

CMD_TIMEOUT_S = 20.0


def check_available() -> None:
    """Raise NetlabUnavailable with the reason when this process cannot build namespaces."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        raise NetlabUnavailable("network namespaces need Linux")
    if os.geteuid() != 0:
        raise NetlabUnavailable("building network namespaces needs root (euid 0)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetlabUnavailable(f"`{tool}` not found: install iproute2")
    if not os.path.isdir("/proc/sys/net"):
        raise NetlabUnavailable("/proc/sys/net is missing: no network namespace support")


def run(argv: list[str], *, timeout: float = CMD_TIMEOUT_S, check: bool = True) -> str:
    """Run one command; return stdout. Raises NetlabError on failure (when `check`) or timeout."""
    log.debug("run %s", " ".join(argv))
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise NetlabError(f"`{' '.join(argv)}` timed out after {timeout:.0f}s") from e
    except FileNotFoundError as e:
        raise NetlabUnavailable(f"`{argv[0]}` not found: install iproute2") from e
    if check and res.returncode != 0:
        raise NetlabError(f"`{' '.join(argv)}` failed (rc={res.returncode}): {res.stderr.strip()}")
    return res.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    return run(["ip", *(["-n", netns] if netns else []), *args], check=check)


def tc(*args: str, netns: str | None = None, check: bool = True) -> str:
    return run(["tc", *(["-n", netns] if netns else []), *args], check=check)


def in_netns(netns: str, argv: list[str], *, check: bool = True) -> str:
    return run(["ip", "netns", "exec", netns, *argv], check=check)


def list_netns() -> list[str]:
    """Names of the named network namespaces (first column of `ip netns list`)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    out = ip("netns", "pids", netns, check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]
