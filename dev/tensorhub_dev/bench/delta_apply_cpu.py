"""`python -m tensorhub_dev.bench.delta_apply_cpu`: the CPU one reader spends applying a delta, in one process.

The lab's delta (``bench modes --delta``: a bf16 version of ``--size-mb`` MiB in 8 tensors, chunks of
``--chunk-mb``, v2 drawn from v1 by the delta profile measured at ``--delta-lr``), encoded as a publisher
encodes it, then applied the way a reader applies it (``ChunkApply``), three ways per round:

- ``base_pass``: the base chunks digested by the worker (``BaseDigests``), as a reader does while the delta is
  on the wire;
- ``on_landing``: applying every chunk once its base was digested ahead (decode, write, read back, incremental
  target check): what is left for a reader to do after the delta's bytes land;
- ``without_ahead``: applying every chunk with its base digested on landing (what a reader does when the
  worker has not reached a chunk: the whole apply on the critical path).

Process CPU seconds (user + system, every thread) per phase, median over ``--rounds``; the phases run one after
the other, so each one's CPU is its own. Prints a line per round, then one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from tensorhub_dev.bench.modes_roles import delta_versions
from tensorhub_verl.ros.client.delta_base import BaseDigests
from tensorhub_verl.ros.client.delta_chunks import ChunkApply, encode_delta
from tensorhub_verl.ros.wire.integrity import ALGORITHM, chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest

_TIMEOUT_S = 120.0


def _manifest(version: int, weights: dict[str, torch.Tensor], chunk_bytes: int):
    m = build_manifest("policy", version, "hf", weights, chunk_bytes)
    return dataclasses.replace(m, chunk_digests=chunk_digests(m.chunks(), list(weights.values())),
                               digest_algorithm=ALGORITHM)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bit for bit (a drawn bf16 version may hold NaNs, which ``torch.equal`` calls unequal)."""
    return all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b))


def _cpu() -> float:
    return time.process_time()


def run(size_mb: float, chunk_mb: float, lr: float, rounds: int) -> dict:
    v1, v2 = delta_versions(size_mb, lr)
    chunk_bytes = int(chunk_mb * (1 << 20))
    m1, m2 = _manifest(1, v1, chunk_bytes), _manifest(2, v2, chunk_bytes)
    header, blob, enc = encode_delta(m1, list(v1.values()), m2, list(v2.values()))
    chunks = len(m2.chunks())
    want = list(v2.values())
    phases: dict[str, list[float]] = {"base_pass": [], "on_landing": [], "without_ahead": []}
    for r in range(rounds):
        into = [t.clone() for t in v1.values()]
        c0 = _cpu()
        base = BaseDigests(m2, into, range(chunks), _TIMEOUT_S).start()
        deadline = time.monotonic() + _TIMEOUT_S
        while base.ahead < chunks and time.monotonic() < deadline:
            time.sleep(0.002)
        base.stop()
        c1 = _cpu()
        applier = ChunkApply(m2, header, into, base)
        applier.apply(blob, range(chunks))
        ahead = applier.finish()
        c2 = _cpu()
        if ahead.failed or ahead.landed_digests or not _same(into, want):
            raise RuntimeError(f"the apply with its base digested ahead went wrong: {ahead}")
        into = [t.clone() for t in v1.values()]
        c3 = _cpu()
        applier = ChunkApply(m2, header, into)
        applier.apply(blob, range(chunks))
        landed = applier.finish()
        c4 = _cpu()
        if landed.failed or landed.landed_digests != chunks or not _same(into, want):
            raise RuntimeError(f"the apply without a base digested ahead went wrong: {landed}")
        for name, value in zip(phases, (c1 - c0, c2 - c1, c4 - c3)):
            phases[name].append(value)
        print(f"round {r}: base pass {c1 - c0:.3f} CPU-s, on landing {c2 - c1:.3f}, without ahead {c4 - c3:.3f}",
              flush=True)
    return {"bench": "delta_apply_cpu", "version_bytes": m2.nbytes, "chunks": chunks, "delta_bytes": blob.numel(),
            "changed_fraction": round(enc.changed_elements / enc.elements, 4), "lr": lr, "rounds": rounds,
            "cpu_s": {name: round(statistics.median(values), 4) for name, values in phases.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.delta_apply_cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=256.0)
    ap.add_argument("--chunk-mb", type=float, default=2.0)
    ap.add_argument("--delta-lr", type=float, default=1e-6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry; the JSON line is always printed")
    a = ap.parse_args(argv)
    out = run(a.size_mb, a.chunk_mb, a.delta_lr, a.rounds)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
