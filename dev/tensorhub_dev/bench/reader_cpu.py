"""`python -m tensorhub_dev.bench.reader_cpu`: the CPU a fetch costs each process, on this host, over TCP.

The lab's workload (`bench modes`: a version of ``--size-mb`` MiB in chunks of ``--chunk-mb``, ``--readers``
readers fetching it at once, window 4) with its own processes (`bench.modes_roles`: an embedded hub, a trainer
that publishes, one process per reader), on loopback with the TCP data plane (``UCX_TLS=tcp``, as in the lab).
Per round: each reader's CPU over its fetch (what it reports), and the hub's and the trainer's CPU from go to
the last reader's return (psutil, every thread). ``--profile DIR`` also samples every process during the
fetches with py-spy (``DIR/<role>.txt``, collapsed stacks: one line per stack, its sample count last) and prints
the readers' samples grouped by part (``profile_shares``).

Loopback moves the bytes far faster than the lab's 200 Mbit/s NICs, so costs that grow with a fetch's
duration (polls, timers) weigh less here than there; costs per chunk, per read and per exchange are the same.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tensorhub_dev.bench.modes import LabProcess

_ROLES = [sys.executable, "-m", "tensorhub_dev.bench.modes_roles"]
_TIMEOUT_S = 120.0


def _role(args: list[str], name: str, env: dict[str, str]) -> LabProcess:
    """A `modes_roles` role as a plain process of this host (``LabProcess`` reads its JSON lines)."""
    return LabProcess.on_this_host([*_ROLES, *args], name, env)


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _spy(pid: int, out: Path) -> subprocess.Popen:
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--nonblocking", "--rate", "250", "--format",
                             "raw", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(size_mb: float, chunk_mb: float, readers: int, window: int, rounds: int, profile: Path | None) -> dict:
    env = {"UCX_TLS": "tcp"}  # the lab's plane; torch keeps its default threads, as in the lab
    work = Path(tempfile.mkdtemp(prefix="reader-cpu-"))
    stop = work / "stop"
    procs: list[LabProcess] = []
    try:
        hub = _role(["hub", "--host", "127.0.0.1", "--port", "0", "--stop", str(stop),
                     "--timeout", str(_TIMEOUT_S * (rounds + 2))], "hub", env)
        procs.append(hub)
        url = hub.expect("ready", 60)["url"]
        trainer = _role(["trainer", "--hub", url, "--location", "dc=dc0,rack=r0,node=trainer",
                         "--size-mb", str(size_mb), "--chunk-mb", str(chunk_mb), "--stop", str(stop),
                         "--timeout", str(_TIMEOUT_S * (rounds + 2))], "trainer", env)
        procs.append(trainer)
        trainer.expect("ready", 120)
        out = []
        for r in range(rounds):
            out.append(_round(url, work / f"round-{r}", readers, window, env, hub, trainer,
                              None if profile is None or r != rounds - 1 else profile))
    finally:
        stop.touch()
        for p in procs:
            p.wait(30)
    reader_cpu = [c for o in out for c in o["reader_cpu_s"]]
    return {"bench": "reader_cpu", "size_mb": size_mb, "chunk_mb": chunk_mb, "readers": readers, "window": window,
            "rounds": out, "reader_cpu_s_median": statistics.median(reader_cpu),
            "hub_cpu_s_median": statistics.median(o["hub_cpu_s"] for o in out),
            "trainer_cpu_s_median": statistics.median(o["trainer_cpu_s"] for o in out)}


def _round(url: str, work: Path, readers: int, window: int, env: dict, hub: LabProcess, trainer: LabProcess,
           profile: Path | None) -> dict:
    work.mkdir()
    go, stop = work / "go", work / "stop"
    roles = [_role(["reader", "--hub", url, "--worker", f"{work.name}-r{i}",
                    "--location", f"dc=dc0,rack=r{1 + i % 2},node={work.name}-n{i}", "--window", str(window),
                    "--go", str(go), "--stop", str(stop), "--timeout", str(_TIMEOUT_S), "--hold"], f"reader-{i}", env)
             for i in range(readers)]
    spies = []
    try:
        for r in roles:
            r.expect("ready", _TIMEOUT_S)
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spies = [_spy(p.proc.pid, profile / f"{p.name}.txt") for p in (hub, trainer, *roles)]
            time.sleep(1.0)  # py-spy attaches
        hub0, trainer0, t0 = _cpu(hub.proc.pid), _cpu(trainer.proc.pid), time.monotonic()
        go.touch()
        fetched = [r.expect("fetched", _TIMEOUT_S) for r in roles]
        wall = time.monotonic() - t0
        hub_cpu, trainer_cpu = _cpu(hub.proc.pid) - hub0, _cpu(trainer.proc.pid) - trainer0
    finally:
        for s in spies:
            s.send_signal(signal.SIGINT)
        for s in spies:
            s.wait(30)
        stop.touch()
        for r in roles:
            r.wait(30)
    return {"wall_s": round(wall, 3), "seconds": [round(f["seconds"], 3) for f in fetched],
            "reader_cpu_s": [round(f["cpu_s"], 3) for f in fetched],
            "exchanges": [len(f["exchanges"]) for f in fetched],
            "hub_cpu_s": round(hub_cpu, 3), "trainer_cpu_s": round(trainer_cpu, 3)}


_WAITS = ("Condition.wait", "Event.wait", "wait_file", "socket.accept", "_worker (", "Thread.start", "Runner.run")
"""Leaf frames of a thread that waits: left out of the shares."""
_PARTS = (("the digest", "lindigest"), ("TCP plane: receiving reads", "_Peer._receive"),
          ("TCP plane: serving peers' reads", "ReadServer"), ("hub exchanges (HTTP client, JSON)", "HubClient"),
          ("TCP plane: connecting to peers", "_Peer._connect"), ("the fetch loop's bookkeeping", "ChunkFetcher"))
"""(part, a frame name that puts a stack in it), the first match wins."""


def profile_shares(files: list[Path]) -> dict[str, float]:
    """Each part's share of the samples in py-spy's collapsed stacks whose leaf is not a wait. py-spy counts a
    runnable thread waiting for a core as busy: shares of running or runnable time, not exact CPU."""
    counts: dict[str, int] = {}
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            stack, n = line.rsplit(" ", 1)
            leaf = stack.split(";")[-1]
            if not leaf or leaf.startswith(_WAITS):
                continue
            part = next((name for name, frame in _PARTS if frame in stack), "the rest")
            counts[part] = counts.get(part, 0) + int(n)
    busy = sum(counts.values()) or 1
    return {part: round(n / busy, 3) for part, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.reader_cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=64.0)
    ap.add_argument("--chunk-mb", type=float, default=2.0)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=Path, help="py-spy every process during the last round's fetches, into DIR")
    a = ap.parse_args(argv)
    res = run(a.size_mb, a.chunk_mb, a.readers, a.window, a.rounds, a.profile)
    if a.profile is not None:
        res["profile_shares"] = profile_shares(sorted(a.profile.glob("reader-*.txt")))
        for part, share in res["profile_shares"].items():
            print(f"readers' samples: {share:6.1%} {part}")
    for i, o in enumerate(res["rounds"]):
        print(f"round {i}: wall {o['wall_s']:.2f}s  reader CPU s {o['reader_cpu_s']}  hub {o['hub_cpu_s']:.3f}s  "
              f"trainer {o['trainer_cpu_s']:.3f}s  exchanges {o['exchanges']}")
    print(f"median reader CPU per fetch {res['reader_cpu_s_median']:.3f}s, hub {res['hub_cpu_s_median']:.3f}s, "
          f"trainer {res['trainer_cpu_s_median']:.3f}s per round")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
