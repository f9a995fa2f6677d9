"""``tensorhub bench vllm``: vLLM engines updated through ROS, measured side by side in one run.

For each model (the tiny one, and a larger random one that fits a small CPU host):
  A: a fresh engine (dummy weights) attaches and fetches v1 from the publisher ('hf' layout, load_weights);
  B: a fresh engine attaches and fetches v1 from A (raw reads of A's live parameters, same layout);
  then for ``--updates`` new versions: A applies each from the publisher, B applies it from A with staging
  ``cpu`` (pull while generating; stall = the copy-in), then again with staging ``none`` (pull straight
  into the parameters; stall = the whole pull).
Reports per model and TP size (``--tp 1,2`` runs both, side by side in one run): attach seconds from peer vs
publisher (fetch+apply, engine start excluded), the bytes each rank read on attach (at TP>1 a rank reads only
its slices from the publisher's 'hf' tensors, and its own shard raw from the same rank of its peer), B's
median stall per update with staging on vs off, and their ratios. At TP>1 each rank runs on its own core
(``VLLM_CPU_OMP_THREADS_BIND``). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tensorhub_verl.bench import positive_ints

logger = logging.getLogger("tensorhub_verl.bench.vllm")

MODELS = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2),
    "larger": dict(hidden_size=768, intermediate_size=2048, num_layers=4, num_heads=12, num_kv_heads=4,
                   vocab_size=8192),
}
PROMPT = [84, 259, 221, 81, 85, 73, 17, 40]


def _perturbed(weights: dict, step: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    return {n: (t + 0.01 * torch.randn(t.shape, generator=g)).contiguous() for n, t in weights.items()}


def _cpu_binding(tp: int) -> dict[str, str]:
    """vLLM's CPU build pins each rank's threads: one core per rank (wrapping when there are fewer cores)."""
    import os

    cores = max(1, os.cpu_count() or 1)
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(r % cores) for r in range(tp))} if tp > 1 else {}


def bench_model(name: str, model_dir: str, updates: int, arch: str, tp: int = 1) -> dict:
    import tensorhub_verl as th
    from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec
    from tensorhub_verl.bench.tiny_model import hf_state_dict, load_hf_model

    hub = th.start_hub(host="127.0.0.1", port=0)
    trainer = th.connect(hub.url, worker="trainer", location={"dc": "dc0", "rack": "r0", "node": "trainer"})
    base = hf_state_dict(load_hf_model(model_dir))
    versions: dict[int, dict] = {1: copy.copy(base)}
    trainer.publish("policy", 1, versions[1])
    out: dict = {"model": name, "arch": arch, "tp": tp,
                 "bytes": sum(t.numel() * t.element_size() for t in base.values())}
    spec = dict(model_dir=model_dir, hub_url=hub.url, model="policy", tp_size=tp, env=_cpu_binding(tp))
    try:
        with EngineProcess(EngineSpec(worker="A", location={"dc": "dc0", "rack": "r0", "node": "a"}, **spec)) as a, \
                EngineProcess(EngineSpec(worker="B", location={"dc": "dc0", "rack": "r0", "node": "b"},
                                         **spec)) as b:
            out["engine_start_s"] = max(a.startup["startup_s"], b.startup["startup_s"])
            ra = a.update(1)
            rb = b.update(1)
            out["attach_from_publisher_s"] = ra["seconds"]
            out["attach_from_peer_s"] = rb["seconds"]
            out["attach_sources"] = {"publisher_path": sorted(ra["sources"]), "peer_path": sorted(rb["sources"])}
            out["attach_rank_bytes"] = {"from_publisher": ra["rank_bytes"], "from_peer": rb["rank_bytes"]}
            out["attach_rank_over_model"] = max(ra["rank_bytes"]) / out["bytes"]
            stalls: dict[str, list[float]] = {"cpu": [], "none": []}
            pulls: dict[str, list[float]] = {"cpu": [], "none": []}
            v = 1
            for staging in ("cpu", "none"):
                if staging == "none":
                    b.rpc("th_setup", hub_url=hub.url, model="policy", worker="B",
                          location={"dc": "dc0", "rack": "r0", "node": "b"}, staging="none")
                for _ in range(updates):
                    v += 1
                    trainer.unpublish("policy", v - 1)
                    # keep the old tensors alive: a freed-then-reused address tripped the core's NIXL
                    # registration cache here (reads failed with NIXL_ERR_NOT_FOUND; reported to the core)
                    versions[v] = _perturbed(base, v)
                    trainer.publish("policy", v, versions[v])
                    a.update(v)
                    if staging == "cpu":
                        r = b.request("update_while_generating", 600, version=v, prompt_ids=PROMPT, max_tokens=4)
                    else:
                        r = b.update(v)
                    if not set(r["sources"]) <= {"A", *(f"A/rank{i}" for i in range(tp))}:
                        logger.warning("update v%d of B read from %s (expected A)", v, sorted(r["sources"]))
                    stalls[staging].append(r["stall_s"])
                    pulls[staging].append(r["pull_s"])
            for staging in ("cpu", "none"):
                out[f"stall_staging_{staging}_s"] = statistics.median(stalls[staging])
                out[f"pull_staging_{staging}_s"] = statistics.median(pulls[staging])
            out["stall_ratio_off_over_on"] = out["stall_staging_none_s"] / max(out["stall_staging_cpu_s"], 1e-9)
            out["attach_ratio_publisher_over_peer"] = (out["attach_from_publisher_s"]
                                                       / max(out["attach_from_peer_s"], 1e-9))
    finally:
        trainer.close()
        hub.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tensorhub bench vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result line")
    p.add_argument("--models", default="tiny,larger", help=f"comma list of {sorted(MODELS)}")
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--arch", default="qwen2", choices=("llama", "qwen2"))
    p.add_argument("--tp", default=(1,), type=positive_ints,
                   help="comma list of tensor-parallel sizes, e.g. 1,2 (each its own engines)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    ns = p.parse_args(argv)
    if not ns.json:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from tensorhub_verl.bench.tiny_model import TinyModelSpec, build_tiny_model

    names = [m for m in ns.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; choose from {sorted(MODELS)}")
    results = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tensorhub-bench-vllm-") as tmp:
        for name in names:
            d = build_tiny_model(Path(tmp) / name, TinyModelSpec(arch=ns.arch, **MODELS[name]))
            for tp in ns.tp:
                results.append(bench_model(name, str(d), ns.updates, ns.arch, tp))
    result = {"bench": "vllm", "updates_per_mode": ns.updates, "seconds": time.monotonic() - t0,
              "models": results}
    if not ns.json:
        print(f"{'model':7} {'TP':>3} {'attach pub s':>12} {'attach peer s':>13} {'rank/model':>10} "
              f"{'stall cpu s':>11} {'stall none s':>12}")
        for r in results:
            print(f"{r['model']:7} {r['tp']:>3} {r['attach_from_publisher_s']:>12.2f} {r['attach_from_peer_s']:>13.2f} "
                  f"{r['attach_rank_over_model']:>10.2f} {r['stall_staging_cpu_s']:>11.3f} "
                  f"{r['stall_staging_none_s']:>12.3f}")
    line = json.dumps(result)
    if ns.out:
        Path(ns.out).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
