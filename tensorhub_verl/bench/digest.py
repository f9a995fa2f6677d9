"""Throughput of the chunk digest (``lindigest.py``) against xxh3-64 (what chunk digests used before), on the CPU
and, where there is one, on the GPU: what a publisher pays per GB at publish and a reader as chunks land; and
what a row-shard rank pays for its cells of the block digests (``shard_blocks``: rank 0 of ``--row-shards``,
per GB of its own rows).

    python -m tensorhub_verl.bench.digest [--size-mb 256] [--threads 1] [--row-shards 2] [--devices cpu,cuda]
                                          [--device-path] [--device-batch-words N]

``--device-path`` sends CPU tensors down the torch ops a GPU runs (``lindigest.HOST_NUMPY = False``) instead of
the host's numpy path, so a machine without a GPU measures that path too; ``--device-batch-words`` sets how many
words the device path converts at once (``lindigest.DEVICE_BATCH_WORDS``) for this run. For every device it also counts the
torch ops one pass dispatches (``ops_per_gib_*``; views included): on a GPU each is a launch, so this is what
bounds a digest there once the bytes move at tens of GB/s.

Prints one line per measurement, then a JSON line with all of them.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.integrity import block_digests, chunk_digests
from tensorhub_verl.ros.wire.manifest import DEFAULT_CHUNK_BYTES, Manifest, build_manifest, row_range, shard_chunks


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


class _OpCount(TorchDispatchMode):
    """Counts the torch ops dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops_per_gib(fn, nbytes: int) -> int:
    with _OpCount() as count:
        fn()
    return round(count.ops * (1 << 30) / nbytes)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(size_mb: int, repeats: int, threads: int, row_shards: int = 2, devices: list[str] | None = None,
        device_path: bool = False, device_batch_words: int | None = None) -> dict:
    """``devices``: where the digests run (None: the CPU, and CUDA where there is one); ``device_path``: CPU
    tensors through the torch ops of the device path instead of numpy; ``device_batch_words``: that path's
    batch for this run (None: ``lindigest.DEVICE_BATCH_WORDS``)."""
    saved = lindigest.HOST_NUMPY, lindigest.DEVICE_BATCH_WORDS
    lindigest.HOST_NUMPY = not device_path
    lindigest.DEVICE_BATCH_WORDS = device_batch_words or lindigest.DEVICE_BATCH_WORDS
    try:
        return _run(size_mb, repeats, threads, row_shards, devices, device_path)
    finally:
        lindigest.HOST_NUMPY, lindigest.DEVICE_BATCH_WORDS = saved


def _run(size_mb: int, repeats: int, threads: int, row_shards: int, devices: list[str] | None,
         device_path: bool) -> dict:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    rows = max(1, size_mb * (1 << 20) // (4096 * 2))
    weights = {"w": torch.randn(rows, 4096, generator=g).to(torch.bfloat16)}
    m = build_manifest("bench", 1, "hf", weights, DEFAULT_CHUNK_BYTES, "none")
    chunks, gb = m.chunks(), m.nbytes / 1e9
    flat = weights["w"].reshape(-1).view(torch.uint8).numpy()
    out = {"size_mb": size_mb, "threads": threads, "row_shards": row_shards, "cpu_path": "torch" if device_path
           else "numpy", "device_batch_words": lindigest.DEVICE_BATCH_WORDS,
           "xxh3_cpu_gbps": gb / _best(lambda: [xxhash.xxh3_64(flat[s.offset:s.offset + s.length]).hexdigest()
                                                 for c in chunks for s in c.segments], repeats)}
    if devices is None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out["devices"] = devices
    for device in devices:
        tensors = [weights["w"].to(device)]
        chunk_digests(chunks, tensors)  # tables made and copied once

        def chunk_pass():
            chunk_digests(chunks, tensors)
            _sync(device)

        def block_pass():
            block_digests(chunks, m.tensors, tensors)
            _sync(device)

        out[f"linear_{device}_gbps"] = gb / _best(chunk_pass, repeats)
        out[f"blocks_{device}_gbps"] = gb / _best(block_pass, repeats)
        shard = Manifest("bench", 1, "hf", m.tensors, DEFAULT_CHUNK_BYTES, row_shards=row_shards)
        lo, hi = row_range(rows, 0, row_shards)
        piece = [tensors[0][lo:hi]]

        def shard_block_pass():
            block_digests(shard.chunks(), shard.tensors, piece, [0], shard_chunks(shard, 0))
            _sync(device)

        out[f"shard_blocks_{device}_gbps"] = piece[0].numel() * 2 / 1e9 / _best(shard_block_pass, repeats)
        out[f"ops_per_gib_linear_{device}"] = _ops_per_gib(chunk_pass, m.nbytes)
        out[f"ops_per_gib_blocks_{device}"] = _ops_per_gib(block_pass, m.nbytes)
    if "cpu" in devices:
        out["linear_cpu_s_per_gb"] = 1 / out["linear_cpu_gbps"]
        out["shard_blocks_cpu_s_per_gb"] = 1 / out["shard_blocks_cpu_gbps"]
    if "cuda" in devices:
        out["cuda_float64_matmul_exact"] = lindigest._TABLES.exact_matmul.get(torch.device("cuda", 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (xxh3 runs on one)")
    parser.add_argument("--row-shards", type=int, default=2, help="ranks of the row-shard block digest pass")
    parser.add_argument("--devices", default=None,
                        help="comma-separated, of cpu and cuda (default: cpu, and cuda where there is one)")
    parser.add_argument("--device-path", action="store_true",
                        help="CPU tensors through the torch ops a GPU runs, not numpy (to measure that path here)")
    parser.add_argument("--device-batch-words", type=int, default=None,
                        help="words the device path converts at once (default: lindigest.DEVICE_BATCH_WORDS)")
    args = parser.parse_args()
    devices = args.devices.split(",") if args.devices else None
    if devices and (bad := [d for d in devices if d not in ("cpu", "cuda")]):
        parser.error(f"unknown device {bad[0]!r}; choose from cpu, cuda")
    if args.device_batch_words is not None and args.device_batch_words < 1024:
        parser.error("--device-batch-words must be at least 1024 (one weight group)")
    if devices and "cuda" in devices and not torch.cuda.is_available():
        parser.error("--devices cuda needs a CUDA GPU, and torch sees none here")
    result = run(args.size_mb, args.repeats, args.threads, args.row_shards, devices, args.device_path,
                 args.device_batch_words)
    for key, value in result.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
