"""Measure real TCP rates between lab hosts with the probe (several flows at once, each its own port)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from tensorhub_dev.netlab.errors import NetlabError
from tensorhub_dev.netlab.lab import Lab

_PROBE = [sys.executable, "-m", "tensorhub_dev.netlab.probe"]


def measure_flows(lab: Lab, pairs: Sequence[tuple[str, str]], nbytes: int | Sequence[int], *, port_base: int = 47000,
                  timeout: float = 120.0) -> list[dict]:
    """Send `nbytes` (one count for every pair, or one per pair) from src to dst for every (src, dst) pair at once;
    return the receivers' reports (bytes, seconds, mbit_s) in pair order, plus the WAN bytes that crossed during
    the run."""
    sizes = [nbytes] * len(pairs) if isinstance(nbytes, int) else list(nbytes)
    if len(sizes) != len(pairs):
        raise NetlabError(f"measure_flows: {len(sizes)} byte counts for {len(pairs)} pairs")
    servers: list[subprocess.Popen] = []
    for i, (_, dst) in enumerate(pairs):
        h = lab.host(dst)
        proc = h.popen([*_PROBE, "serve", "--host", h.ip, "--port", str(port_base + i), "--timeout", str(timeout)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = _readline(proc, timeout)
        if line.strip() != "READY":
            raise NetlabError(f"probe server on {dst} did not start: {line!r} {proc.stderr.read()[-500:]}")
        servers.append(proc)
    wan0 = lab.wan_tx_bytes()
    senders = [lab.host(src).popen([*_PROBE, "send", "--host", lab.host(dst).ip, "--port", str(port_base + i),
                                    "--bytes", str(sizes[i]), "--timeout", str(timeout)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i, (src, dst) in enumerate(pairs)]
    results = []
    for (src, dst), srv, snd in zip(pairs, servers, senders):
        try:
            out, err = srv.communicate(timeout=timeout)
            snd.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise NetlabError(f"probe {src}->{dst} timed out after {timeout:.0f}s") from e
        if srv.returncode != 0:
            raise NetlabError(f"probe {src}->{dst} failed: {err[-500:]}")
        rep = json.loads(out.strip().splitlines()[-1])
        rep.update(src=src, dst=dst)
        results.append(rep)
    wan = lab.wan_tx_bytes() - wan0
    for r in results:
        r["wan_bytes_during_run"] = wan
    return results


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """readline with a deadline (a stuck child must not hang the caller)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise NetlabError(f"no output from {proc.args[:6]} within {timeout:.0f}s")
    return proc.stdout.readline()


def measure_nixl(lab: Lab, holder: str, reader: str, nbytes: int, *, reps: int = 2,
                 timeout: float = 180.0) -> dict:
    """NIXL (UCX over TCP) READ of `nbytes` by `reader` from `holder`'s registered memory.
    Returns the reader's report (bytes, seconds per rep, mbit_s of the best rep, ok = bytes verified)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="thl-nixl-") as d:
        common = ["--dir", d, "--timeout", str(timeout)]
        hold = lab.host(holder).popen([sys.executable, "-m", "tensorhub_dev.netlab.nixl_probe", "hold",
                                       "--bytes", str(nbytes), *common],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wan0 = lab.wan_tx_bytes()
        res = lab.host(reader).run([sys.executable, "-m", "tensorhub_dev.netlab.nixl_probe", "read",
                                    "--reps", str(reps), *common], timeout=timeout, check=False)
        wan = lab.wan_tx_bytes() - wan0
        try:
            hold.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise NetlabError(f"NIXL holder on {holder} did not exit within {timeout:.0f}s") from e
        lines = res.stdout.strip().splitlines()
        if not lines:
            raise NetlabError(f"NIXL reader on {reader} printed nothing (rc={res.returncode}): {res.stderr[-1500:]}")
        rep = json.loads(lines[-1])
        rep.update(holder=holder, reader=reader, wan_bytes_during_run=wan)
        return rep
