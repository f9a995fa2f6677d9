"""`tensorhub bench transport`: one holder, 1 and N readers, separate processes, against raw sockets in the same run.

For each wire (``--wire tcp,ucx-tcp,...``) and reader count (``--readers 1,4``): a ROS fetch of the same version by
every reader at once, then a plain TCP socket copy of the same bytes from one server process to as many client
processes. Rounds alternate (TensorHub, raw, TensorHub, ...), so that both sides see the same load on a shared machine.
Aggregate GB/s = bytes delivered to all readers / (last end - first start), median over rounds; CPU
seconds per GB = user+system time of the holder, readers and hub (server and clients) in the rounds / GB moved.
First read: a fresh reader process's first fetch of a ``--first-mb`` version vs its later fetches of it, for
``--first-readers`` joiners one after another (median and range: one fetch of 64 MB varies by 30% here).

``--device cuda``: the holder publishes CUDA tensors and every reader fetches into CUDA buffers (all on GPU 0 of
this host: NIXL moves them with CUDA IPC, the TCP plane through pinned bounce buffers). Each row also gives the
physical reference on that device, measured in this process in the same rounds: torch's own copy of the same
bytes between two tensors on it (``device_copy_gbps``, a device-to-device copy on a GPU, a memory copy on the
CPU), and TensorHub's rate as a fraction of it. The raw-socket side stays in host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import psutil
import torch

from tensorhub_verl.bench import positive_ints, raw_socket
from tensorhub_verl.bench.procs import Role, random_weights
from tensorhub_verl.ros.planes.config import PROGRESS_MODES

WIRES = {
    "auto": ("auto", {}),
    "tcp": ("tcp", {}),
    "ucx-tcp": ("nixl", {"UCX_TLS": "tcp"}),
    "ucx": ("nixl", {}),
}
"""--wire name -> (PlaneConfig.kind, environment of the holder and readers)."""
CUDA_UCX_TCP = {"UCX_TLS": "cuda_copy,tcp,self"}
"""``ucx-tcp`` with CUDA tensors: UCX's TCP transport plus ``cuda_copy`` to stage device memory through the host
(UCX cannot touch CUDA memory without a CUDA transport: ``ros/planes/ucx_cuda.py``)."""
DEVICES = ("cpu", "cuda")
_TIMEOUT_S = 600.0


def wire_environment(wire: str, device: str) -> tuple[str, dict]:
    """(PlaneConfig.kind, environment) of ``wire`` for tensors on ``device``."""
    transport, env = WIRES[wire]
    if device == "cuda" and wire == "ucx-tcp":
        env = CUDA_UCX_TCP
    return transport, env


def _on(tensors: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {name: t.to(device) for name, t in tensors.items()}


def _holder(results, control, hub_url: str, size_mb: float, first_mb: float, chunk_mb: float, transport: str,
            env: dict, progress: str, digests: bool, device: str = "cpu") -> None:
    os.environ.update(env)
    import tensorhub_verl as th

    client = th.connect(hub_url, "bench-holder", chunk_bytes=int(chunk_mb * (1 << 20)), progress=progress,
                        transport=transport, chunk_digests=digests)
    client.publish("bench", 1, _on(random_weights(size_mb), device))
    if first_mb:
        client.publish("first", 1, _on(random_weights(first_mb, seed=1), device))
    results.put(("ok", "ready"))
    control.get(timeout=_TIMEOUT_S)
    client.close()


def _reader(results, control, hub_url: str, index: int, window: int, transport: str, env: dict,
            progress: str, device: str = "cpu") -> None:
    os.environ.update(env)
    import tensorhub_verl as th

    # require_digests=False: --chunk-digests off measures reads with nothing to check (those present are checked).
    client = th.connect(hub_url, f"bench-reader-{index}", window=window, progress=progress, transport=transport,
                        require_digests=False)
    buffers = _touched(client.manifest("bench", 1).allocate(device))
    client.fetch("bench", 1, into=buffers, hold=False)  # warm-up: connections, registration
    results.put(("ok", "ready"))
    while control.get(timeout=_TIMEOUT_S) == "go":
        start = time.time()
        stats = client.fetch("bench", 1, into=buffers, hold=False)
        results.put(("ok", {"start": start, "end": time.time(), "bytes": stats.bytes, "sources": stats.sources}))
    client.close()


def _joiner(results, control, hub_url: str, index: int, window: int, transport: str, env: dict, progress: str,
            repeats: int, preconnect: int, device: str = "cpu") -> None:
    """A joiner's first fetch (a fresh process: only what registration set up) vs its later ones, same buffers."""
    os.environ.update(env)
    import tensorhub_verl as th

    with th.connect(hub_url, f"bench-joiner-{index}", window=window, progress=progress, transport=transport,
                    preconnect_peers=preconnect, require_digests=False) as client:
        buffers = _touched(client.manifest("first", 1).allocate(device))
        seconds = [client.fetch("first", 1, into=buffers, hold=False).seconds for _ in range(repeats + 1)]
    results.put(("ok", (seconds[0], statistics.median(seconds[1:]))))


def _first_reads(hub_url: str, joiners: int, window: int, transport: str, env: dict, progress: str, repeats: int,
                 preconnect: int, device: str = "cpu") -> dict:
    """``joiners`` fresh readers, one after another: the median of their first fetches, later ones, and ratios."""
    rows = []
    for index in range(joiners):
        joiner = Role(_joiner, hub_url, index, window, transport, env, progress, repeats, preconnect, device)
        rows.append(joiner.result(_TIMEOUT_S))
        joiner.stop()
    ratios = [first / later for first, later in rows]
    return {"first_s": round(statistics.median(f for f, _ in rows), 4),
            "later_s": round(statistics.median(later for _, later in rows), 4),
            "ratio": round(statistics.median(ratios), 3), "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "joiners": joiners}


def _touched(buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Buffers whose pages exist, as an engine's live weights do: a fresh allocation would add its page faults
    to whichever fetch writes it first."""
    for t in buffers.values():
        t.zero_()
    return buffers


class _Side:
    """One side of the comparison (TensorHub or raw sockets): its reader processes, all its processes, totals."""

    def __init__(self, readers: list[Role], others: list[Role], with_this_process: bool = False):
        """``with_this_process``: count this process's CPU too (the hub runs here)."""
        self.readers = readers
        self._procs = [psutil.Process(r.process.pid) for r in readers + others] + \
            ([psutil.Process()] if with_this_process else [])
        self.gbps: list[float] = []
        self.cpu_s = self.moved = self.peer_bytes = self.each = 0

    def round(self) -> float:
        """Every reader at once; returns the aggregate GB/s of this round."""
        cpu_before = self._cpu()
        for r in self.readers:
            r.send("go")
        rows = [r.result(_TIMEOUT_S) for r in self.readers]
        self.cpu_s += self._cpu() - cpu_before
        total, self.each = sum(row["bytes"] for row in rows), rows[0]["bytes"]
        self.gbps.append(total / (max(row["end"] for row in rows) - min(row["start"] for row in rows)) / 1e9)
        self.moved += total
        self.peer_bytes += sum(n for row in rows for src, n in row.get("sources", {}).items() if src != "bench-holder")
        return self.gbps[-1]

    def _cpu(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self._procs)

    def cpu_s_per_gb(self) -> float:
        return self.cpu_s / (self.moved / 1e9)


class _DeviceCopy:
    """The physical reference: torch's copy of ``nbytes`` between two tensors on ``device``, in this process."""

    def __init__(self, device: str, nbytes: int):
        self.device = device
        self.src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.gbps: list[float] = []
        self.round()  # warm-up: allocation, first touch, kernel load

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def round(self) -> float:
        self._sync()
        start = time.perf_counter()
        self.dst.copy_(self.src)
        self._sync()
        self.gbps.append(self.src.numel() / (time.perf_counter() - start) / 1e9)
        return self.gbps[-1]


def _stop(roles: list[Role]) -> None:
    for role in roles:
        role.send("stop")
    for role in roles:
        role.stop()


def run_one(wire: str, readers: int, size_mb: float, first_mb: float, repeats: int, chunk_mb: float, window: int,
            progress: str, digests: bool = True, preconnect: int = 4, first_readers: int = 3,
            device: str = "cpu") -> dict:
    """Rounds alternate, TensorHub then raw sockets then torch's copy on ``device``, so all see the same load on
    a shared machine; the ratio is the median of the rounds' ratios."""
    import tensorhub_verl as th

    transport, env = wire_environment(wire, device)
    hub = th.start_hub(config=th.HubConfig(require_digests=digests, plane=transport))
    roles: list[Role] = []
    try:
        holder = Role(_holder, hub.url, size_mb, first_mb, chunk_mb, transport, env, progress, digests, device)
        holder.result(300)
        first = _first_reads(hub.url, first_readers, window, transport, env, progress, repeats, preconnect,
                             device) if first_mb and first_readers else None
        roles = [Role(_reader, hub.url, i, window, transport, env, progress, device) for i in range(readers)]
        for role in roles:
            role.result(_TIMEOUT_S)
        ours = _Side(roles, [holder], with_this_process=True)
        ours.round()  # the size of a version, for the raw side
        server, clients = raw_socket.start(ours.each, readers)
        raw = _Side(clients, [server])
        copy = _DeviceCopy(device, ours.each)
        ratios, to_copy = [], []
        for _ in range(repeats):
            ours_gbps = ours.round()
            ratios.append(ours_gbps / raw.round())
            to_copy.append(ours_gbps / copy.round())
        copy_gbps = copy.gbps[1:]
        del copy
        _stop(clients)
        server.stop()
        _stop(roles + [holder])
    finally:
        hub.stop()
    row = {"wire": wire, "readers": readers, "device": device,
           "tensorhub_gbps": round(statistics.median(ours.gbps[1:]), 3),
           "raw_socket_gbps": round(statistics.median(raw.gbps), 3), "ratio": round(statistics.median(ratios), 3),
           "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
           "cpu_s_per_gb": round(ours.cpu_s_per_gb(), 3), "raw_cpu_s_per_gb": round(raw.cpu_s_per_gb(), 3),
           "peer_fraction": round(ours.peer_bytes / ours.moved, 3),
           "device_copy_gbps": round(statistics.median(copy_gbps), 3),
           "ratio_to_device_copy": round(statistics.median(to_copy), 4)}
    if first is not None:
        row["first_read"] = first
    return row


def run(wires: list[str], readers: list[int], size_mb: float, first_mb: float, repeats: int, chunk_mb: float,
        window: int, progress: str = "events", digests: bool = True, preconnect: int = 4,
        first_readers: int = 3, device: str = "cpu", on_row=None) -> dict:
    """``on_row``: called with each row as it is measured (a run cut short still leaves its finished rows)."""
    rows = []
    for wire in wires:
        for n in readers:
            rows.append(run_one(wire, n, size_mb, first_mb if n == readers[0] else 0, repeats, chunk_mb, window,
                                progress, digests, preconnect, first_readers, device))
            if on_row is not None:
                on_row(rows[-1])
    head = rows[0]
    return {"bench": "transport", "device": device, "size_mb": size_mb, "first_mb": first_mb, "repeats": repeats,
            "chunk_mb": chunk_mb,
            "window": window, "progress": progress, "chunk_digests": digests,
            "preconnect": preconnect, "first_readers": first_readers, "tensorhub_gbps": head["tensorhub_gbps"],
            "raw_socket_gbps": head["raw_socket_gbps"], "ratio": head["ratio"], "rows": rows,
            "unit": "GB/s (1e9 bytes/s) delivered to all readers, median of rounds (rounds alternate with raw sockets); "
                    "ratio: median of the rounds' ratios; CPU s/GB: holder+readers+hub (server+clients); "
                    "device_copy_gbps: torch's copy of one version's bytes on the device, in the same rounds"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench transport", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wire", default="auto",
                        help=f"comma-separated, of {', '.join(WIRES)} (ucx-tcp: NIXL with UCX_TLS=tcp)")
    parser.add_argument("--readers", default=(1,), type=positive_ints, help="comma-separated reader counts, e.g. 1,4")
    parser.add_argument("--size-mb", type=float, default=256)
    parser.add_argument("--first-mb", type=float, default=64, help="size of the first-read version (0: skip)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mb", type=float, default=8)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="events",
                        help="who drives UCX in the holder (see NixlPlane)")
    parser.add_argument("--chunk-digests", choices=("on", "off"), default="on",
                        help="off: publish without chunk digests, so readers check nothing (shows what the check costs)")
    parser.add_argument("--first-readers", type=int, default=3,
                        help="fresh joiners whose first read is measured, one after another (0: skip)")
    parser.add_argument("--preconnect", type=int, default=4,
                        help="peers a reader connects to at registration (TcpConfig.preconnect_peers; 0: at its "
                             "first lease, which the first read then waits for)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where the holder's tensors and the readers' buffers live (cuda: GPU 0 of this host)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    wires = args.wire.split(",")
    if unknown := [w for w in wires if w not in WIRES]:
        parser.error(f"unknown wire {unknown[0]!r}; choose from {', '.join(WIRES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU, and torch sees none here")
    result = run(wires, list(args.readers), args.size_mb, args.first_mb, args.repeats,
                 args.chunk_mb, args.window, args.progress, args.chunk_digests == "on", args.preconnect,
                 args.first_readers, args.device, on_row=_print_row)
    if not args.json:
        print(f"{'wire':8} {'readers':>7} {'TensorHub GB/s':>14} {'raw GB/s':>9} {'ratio':>6} {'range':>11} {'CPU s/GB':>9} "
              f"{'raw CPU s/GB':>12} {'peer %':>6} {'copy GB/s':>9} {'of copy':>7}  first read")
        for row in result["rows"]:
            first = row.get("first_read")
            note = f"{first['first_s']:.3f} s vs later {first['later_s']:.3f} s ({first['ratio']:.2f}x, " \
                   f"{first['ratio_range'][0]:.2f}-{first['ratio_range'][1]:.2f}x over {first['joiners']})" if first else ""
            print(f"{row['wire']:8} {row['readers']:>7} {row['tensorhub_gbps']:>14.2f} {row['raw_socket_gbps']:>9.2f} "
                  f"{row['ratio']:>6.2f} {row['ratio_range'][0]:>5.2f}-{row['ratio_range'][1]:<5.2f} {row['cpu_s_per_gb']:>9.2f} {row['raw_cpu_s_per_gb']:>12.2f} "
                  f"{100 * row['peer_fraction']:>6.0f} {row['device_copy_gbps']:>9.1f} "
                  f"{row['ratio_to_device_copy']:>7.3f}  {note}")
    print(json.dumps(result))
    return 0


def _print_row(row: dict) -> None:
    """Each row on its own line as it is measured, ``row: {...}`` (the JSON object of the whole run stays last)."""
    print("row: " + json.dumps(row), flush=True)
