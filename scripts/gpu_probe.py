"""NIXL alone (no hub, no TensorHub client) moving device memory: what UCX does with it before anything else runs.

    python scripts/gpu_probe.py [--device cuda] [--size-mb 1024] [--repeats 3] [--timeout 60]

- between two processes: one holds ``--size-mb`` of seeded random bytes registered on the device, the other
  READs them into its own registered buffer (on one GPU UCX should pick ``cuda_ipc``);
- within one process: two agents, one READs the other's buffer (UCX should pick ``cuda_copy``);
- between two processes again with UCX's own defaults: TensorHub's agents get ``planes/nixl.UCX_DEFAULTS`` (CUDA
  IPC reads turned on), UCX alone turns cuda_ipc's GET off on GPUs without NVLink and reads through TCP.

Each: the first READ (it pays for the connection), then ``--repeats`` timed READs of the whole buffer, the bytes
compared on the device, GB/s of the best. Run with ``UCX_PROTO_INFO=y`` to have UCX print the protocol and transport
it chose for each (``scripts/gpu_check.py`` does). ``--device cpu`` does the same in host memory. Prints one line
per case, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tensorhub_verl.ros.planes.nixl import ucx_env, ucx_environment  # noqa: E402
from tensorhub_verl.ros.planes.nixl_build import nixl_api  # noqa: E402

_POLL_S = 0.0005


def _agent(name: str):
    api = nixl_api()
    return api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))


def _pattern(nbytes: int, device: str) -> torch.Tensor:
    """Seeded random bytes, the same in every process for the same device and size."""
    g = torch.Generator(device=device).manual_seed(20261128)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=g)


def _mem(device: str) -> str:
    return "VRAM" if device == "cuda" else "DRAM"


def _read(agent, local: torch.Tensor, remote: tuple[int, int, int], mem: str, peer: str, timeout: float) -> float:
    """One READ of ``remote`` (addr, nbytes, device id) into ``local``; seconds, or raises naming the state."""
    if local.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs(local),
                                   agent.get_xfer_descs([remote], mem), peer)
    try:
        state = agent.transfer(handle)
        deadline = time.monotonic() + timeout
        while state == "PROC":
            if time.monotonic() > deadline:
                raise TimeoutError(f"NIXL READ of {remote[1]} bytes from {peer} not done within {timeout:.0f} s")
            time.sleep(_POLL_S)
            state = agent.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL READ from {peer} ended in state {state}")
        return time.perf_counter() - start
    finally:
        agent.release_xfer_handle(handle)


def _measure(agent, dst: torch.Tensor, remote: tuple[int, int, int], mem: str, peer: str, repeats: int,
             timeout: float) -> dict:
    warm = min(dst.numel(), 1 << 20)
    first = _read(agent, dst[:warm], (remote[0], warm, remote[2]), mem, peer, timeout)
    times = [_read(agent, dst, remote, mem, peer, timeout) for _ in range(repeats)]
    equal = bool(torch.equal(dst, _pattern(dst.numel(), dst.device.type)))
    return {"bytes": dst.numel(), "first_read_s": round(first, 4), "seconds": [round(t, 4) for t in times],
            "gbps": round(dst.numel() / min(times) / 1e9, 3), "bytes_equal": equal}


def _hold(conn, nbytes: int, device: str, timeout: float) -> None:
    """The other process: holds the pattern registered until the reader says done."""
    try:
        agent = _agent("probe-holder")
        src = _pattern(nbytes, device)
        agent.register_memory(src)
        conn.send(("ready", agent.get_agent_metadata(), src.data_ptr(), nbytes, src.device.index or 0))
        if conn.poll(timeout):
            conn.recv()
    except BaseException as e:  # report, don't leave the reader waiting
        conn.send(("error", f"{type(e).__name__}: {e}"))


def two_processes(nbytes: int, device: str, repeats: int, timeout: float) -> dict:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    holder = ctx.Process(target=_hold, args=(there, nbytes, device, timeout), daemon=True)
    holder.start()
    try:
        if not here.poll(timeout):
            raise TimeoutError(f"the holder process did not register {nbytes} bytes within {timeout:.0f} s")
        message = here.recv()
        if message[0] == "error":
            raise RuntimeError(f"holder: {message[1]}")
        _, metadata, addr, size, dev = message
        agent = _agent("probe-reader")
        dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        agent.register_memory(dst)
        peer = agent.add_remote_agent(metadata)
        peer = peer.decode() if isinstance(peer, bytes) else peer
        return {"case": "two processes", **_measure(agent, dst, (addr, size, dev), _mem(device), peer, repeats,
                                                    timeout)}
    finally:
        here.send("done")
        holder.join(30)
        if holder.is_alive():
            holder.kill()
            holder.join(10)


def one_process(nbytes: int, device: str, repeats: int, timeout: float) -> dict:
    holder, reader = _agent("probe-local-holder"), _agent("probe-local-reader")
    src = _pattern(nbytes, device)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    holder.register_memory(src)
    reader.register_memory(dst)
    peer = reader.add_remote_agent(holder.get_agent_metadata())
    peer = peer.decode() if isinstance(peer, bytes) else peer
    return {"case": "one process", **_measure(reader, dst, (src.data_ptr(), nbytes, src.device.index or 0),
                                              _mem(device), peer, repeats, timeout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each wait may take")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU, and torch sees none here")
    nbytes = args.size_mb << 20
    tensorhub = ucx_environment(None)
    out = {"probe": "nixl", "device": args.device, "size_mb": args.size_mb, "ucx_tls": os.environ.get("UCX_TLS"),
           "tensorhub_ucx_settings": tensorhub, "nixl": nixl_api().__name__.split(".")[0], "cases": []}
    # TensorHub's agents get ``tensorhub`` (planes/nixl.UCX_DEFAULTS the environment leaves unset); the last case
    # shows what UCX's own defaults pick for the same read.
    cases = [(two_processes, tensorhub, "two processes"), (one_process, tensorhub, "one process"),
             (two_processes, {}, "two processes, UCX's own defaults")]
    for case, settings, label in cases:
        try:
            with ucx_env(settings):  # UCX reads it when an agent is built; the spawned holder inherits it
                row = {**case(nbytes, args.device, args.repeats, args.timeout), "case": label}
        except Exception as e:  # the other cases still run; the JSON says what failed
            row = {"case": label, "error": f"{type(e).__name__}: {e}"}
        out["cases"].append(row)
        print(json.dumps(row), flush=True)
    out["ok"] = all(row.get("bytes_equal") for row in out["cases"])
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
