"""Memory of verl's rollout-side processes during a real TensorHub GRPO run (CPU), by process role.

Runs the demo's job (verl's trainer, vLLM CPU replicas) on a tiny Qwen2 widened to ``--hidden`` so that a
copy of the model is visible next to the processes' own footprint, samples the unique memory (USS) of every
Ray actor and vLLM process each second, and prints a table and one JSON object last: per role, the peak USS
and the model's bytes. Same arguments on two commits give the before/after of a change.

    .venv/bin/python scripts/rollout_memory.py --out /tmp/mem --hidden 1024 --steps 3
"""

from __future__ import annotations

import argparse
import json
import threading
from collections import defaultdict
from pathlib import Path

import psutil

ROLES = {"CheckpointEngineWorker": "checkpoint-engine worker", "vLLMHttpServer": "vLLM server actor",
         "VLLM::EngineCore": "vLLM engine", "VLLM::Worker": "vLLM engine", "WorkerDict": "trainer",
         "TaskRunner": "driver"}


def _role(cmdline: list[str]) -> str | None:
    line = " ".join(cmdline[:2])
    return next((role for marker, role in ROLES.items() if marker in line), None)


def sample_forever(peaks: dict, stop: threading.Event, period_s: float = 1.0) -> None:
    while not stop.is_set():
        totals: dict[str, int] = defaultdict(int)
        # Only this job's processes (Ray's cluster is started by the job, so all of them descend from us).
        for proc in psutil.Process().children(recursive=True):
            try:
                role = _role(proc.cmdline())
                if role is not None:
                    totals[role] += proc.memory_full_info().uss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        for role, total in totals.items():
            peaks[role] = max(peaks.get(role, 0), total)
        stop.wait(period_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    args = parser.parse_args()

    from tensorhub_dev.demo import grpo
    from tensorhub_dev.demo.job import TinyJob
    from transformers import AutoTokenizer

    from tensorhub_dev.demo.task import CHAT_TEMPLATE, build_task
    from tensorhub_verl.bench.tiny_model import TinyModelSpec, build_tiny_model

    out = Path(args.out)
    model_dir = out / "task" / "model"
    if not (model_dir / "config.json").exists():  # build_task keeps a model that is already there
        spec = TinyModelSpec(arch="qwen2", hidden_size=args.hidden, intermediate_size=args.hidden * 2,
                             num_layers=args.layers, num_heads=8, num_kv_heads=2, seed=0, init_std=0.02)
        build_tiny_model(model_dir, spec)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(str(model_dir))
    task = build_task(out / "task")
    model_bytes = sum(f.stat().st_size for f in Path(task.model_dir).glob("*.safetensors"))

    peaks: dict[str, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_forever, args=(peaks, stop), daemon=True)
    sampler.start()
    try:
        job = TinyJob(task=task, out_dir=out / "job", steps=args.steps, replicas=args.replicas,
                      extra=tuple(args.extra))
        result = grpo.run(job, quiet=True)
    finally:
        stop.set()
        sampler.join(5)
    print(f"model: {model_bytes / 2**20:.1f} MiB (float32), {args.replicas} replicas, {args.steps} steps")
    for role in sorted(peaks):
        print(f"  {role:28s} peak USS {peaks[role] / 2**20:9.1f} MiB  ({peaks[role] / model_bytes:5.2f} models)")
    print(json.dumps({"model_bytes": model_bytes, "replicas": args.replicas, "peak_uss": peaks,
                      "steps": len(result.get("steps", []))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
