"""NIXL one-sided READ between two lab hosts: `python -m tensorhub_dev.netlab.nixl_probe hold|read ...`.

The holder registers a tensor and writes its agent metadata plus the buffer's (addr, len) to files in a
shared directory (namespaces share the filesystem); the reader adds the remote agent from that file and
READs the buffer. Run with UCX_TLS=tcp and UCX_NET_DEVICES=eth0 (Host.popen sets both) so the bytes
cross the shaped veths. Descriptors travel as JSON, never pickled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tensorhub_dev.netlab.lab import wait_file

_POLL_S = 0.001


def _agent(name: str):
    from tensorhub_verl.ros.planes.nixl_build import nixl_api

    api = nixl_api()
    return api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))


def hold(workdir: Path, nbytes: int, timeout: float) -> dict:
    import torch

    agent = _agent("holder")
    buf = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)  # a pattern the reader can check
    agent.register_memory(buf)
    (workdir / "holder.meta.tmp").write_bytes(agent.get_agent_metadata())
    os.replace(workdir / "holder.meta.tmp", workdir / "holder.meta")
    desc = {"addr": buf.data_ptr(), "len": nbytes, "dev": 0, "agent": "holder"}
    (workdir / "holder.json.tmp").write_text(json.dumps(desc))
    os.replace(workdir / "holder.json.tmp", workdir / "holder.json")
    # Memory must stay registered and unchanged until the reader says it is done.
    deadline = time.monotonic() + timeout
    while not (workdir / "reader.done").exists():
        if time.monotonic() > deadline:
            return {"role": "holder", "ok": False, "error": f"reader not done within {timeout:.0f}s"}
        time.sleep(0.05)
    return {"role": "holder", "ok": True}


def _read_once(agent, local, remote, peer: str, timeout: float) -> float:
    t0 = time.perf_counter()
    handle = agent.initialize_xfer("READ", local, remote, peer)
    state = agent.transfer(handle)
    deadline = time.monotonic() + timeout
    while state == "PROC":
        if time.monotonic() > deadline:
            raise TimeoutError(f"NIXL READ not done within {timeout:.0f}s")
        time.sleep(_POLL_S)
        state = agent.check_xfer_state(handle)
    dt = time.perf_counter() - t0
    agent.release_xfer_handle(handle)
    if state != "DONE":
        raise RuntimeError(f"NIXL READ ended in state {state}")
    return dt


def read(workdir: Path, reps: int, timeout: float) -> dict:
    import torch

    try:
        wait_file(workdir / "holder.json", timeout, poll_s=0.05)
        desc = json.loads((workdir / "holder.json").read_text())
        agent = _agent("reader")
        peer = agent.add_remote_agent((workdir / "holder.meta").read_bytes())
        n = int(desc["len"])
        buf = torch.zeros(n, dtype=torch.uint8)
        agent.register_memory(buf)
        # Warm-up on a small slice: the first READ pays for the UCX connection.
        warm = min(n, 1 << 20)
        _read_once(agent, agent.get_xfer_descs(buf[:warm]),
                   agent.get_xfer_descs([(desc["addr"], warm, desc["dev"])], "DRAM"), peer, timeout)
        local = agent.get_xfer_descs(buf)
        remote = agent.get_xfer_descs([(desc["addr"], n, desc["dev"])], "DRAM")
        times = [_read_once(agent, local, remote, peer, timeout) for _ in range(reps)]
        expect = torch.arange(n, dtype=torch.int64).to(torch.uint8)
        ok = bool(torch.equal(buf, expect))
        best = min(times)
        return {"role": "reader", "ok": ok, "bytes": n, "seconds": times, "mbit_s": n * 8 / best / 1e6,
                "ucx_tls": os.environ.get("UCX_TLS"), "ucx_net_devices": os.environ.get("UCX_NET_DEVICES")}
    finally:
        (workdir / "reader.done").touch()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.netlab.nixl_probe")
    ap.add_argument("role", choices=["hold", "read"])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--bytes", type=int, default=16 << 20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    res = hold(a.dir, a.bytes, a.timeout) if a.role == "hold" else read(a.dir, a.reps, a.timeout)
    print(json.dumps(res), flush=True)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
