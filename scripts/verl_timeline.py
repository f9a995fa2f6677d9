"""Runs the 3-step separate_async job of tests/verl/test_verl_trainer_on_cpu.py and timestamps every log line.

    PYTHONPATH=$PWD python scripts/verl_timeline.py OUT_DIR [STEPS] [HYDRA_OVERRIDE ...]   # OUT_DIR/ts.log
"""
import subprocess, sys, time
from pathlib import Path
from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.task import build_task
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
extra = tuple(sys.argv[3:])
t0 = time.monotonic()
task = build_task(out / "task")
job = TinyJob(task=task, out_dir=out, steps=steps, replicas=2, trainer_ranks=2,
              extra=("tensorhub.verify_digests=true", "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16", *extra))
print(f"{time.monotonic()-t0:7.1f} task built", flush=True)
p = subprocess.Popen(job.command(), env=job.environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     errors="replace", start_new_session=True)
with open(out / "ts.log", "w") as f:
    for line in p.stdout:
        f.write(f"{time.monotonic()-t0:7.1f} {line}")
        f.flush()
p.wait()
print(f"{time.monotonic()-t0:7.1f} exit {p.returncode}", flush=True)
