"""`tensorhub hub --shards K` / `--regions`: K hub processes, one per shard (``ros/client/shares.py``) or per region
(``ros/wire/regions.py``), started and stopped together.

Each shard is a plain `tensorhub hub` with the same flags, on port ``--port`` + i (any free port with
``--port 0``). Clients connect to the comma-separated list of their URLs, in shard order (``connect``), which
this prints and writes to ``--url-file``. Every shard takes the same token; each worker gives every shard its
own plane's grant key at registration. When one shard exits, the others are stopped: a hub with a shard missing
serves no version.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorhub_verl.errors import HubUnavailable

logger = logging.getLogger("tensorhub_verl.ros.hub.shard_launcher")

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


def shard_argv(argv: list[str]) -> list[str]:
    """The flags every shard is started with: ``argv`` less --shards, --port and --url-file (set per shard)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--shards", "--regions", "--port", "--url-file"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def run_shards(count: int, port: int, argv: list[str], url_file: str | None, names: list[str] | None = None) -> int:
    """Starts ``count`` shards, prints their URLs, and waits until one exits or a signal stops them all.
    ``names``: the regions the processes serve (``tensorhub hub --regions``): the URLs are printed as the
    ``REGION=URL`` list that ``connect`` takes."""
    procs: list[subprocess.Popen] = []
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    with tempfile.TemporaryDirectory(prefix="tensorhub-shards-") as tmp:
        try:
            files = [Path(tmp) / f"shard{i}.url" for i in range(count)]
            for i, file in enumerate(files):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tensorhub_verl.cli", "hub", *shard_argv(argv),
                     "--port", str(port + i if port else 0), "--url-file", str(file)]))
            urls = _await_urls(procs, files)
            joined = ",".join(urls if names is None else (f"{n}={u}" for n, u in zip(names, urls)))
            what = "shards" if names is None else "regions"
            print(f"tensorhub hub: {count} {what} listening on {joined}", flush=True)
            if url_file:
                Path(url_file).write_text(joined)
            while stop["signal"] is None and all(p.poll() is None for p in procs):
                time.sleep(0.2)
            exited = [i for i, p in enumerate(procs) if p.poll() is not None]
            if exited:
                logger.error("hub shard(s) %s exited; stopping the others", exited)
                return 1
            return 0
        finally:
            _stop_all(procs)


def _await_urls(procs: list[subprocess.Popen], files: list[Path]) -> list[str]:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                raise HubUnavailable(f"hub shard {i} exited with {p.returncode} while starting (see its output above)")
        if all(f.exists() and f.read_text() for f in files):
            return [f.read_text().strip() for f in files]
        time.sleep(0.1)
    raise HubUnavailable(f"hub shards did not all start within {_START_TIMEOUT_S:.0f} s")


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(_STOP_TIMEOUT_S)
