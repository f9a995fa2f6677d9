"""``tensorhub demo``: the main job, a live GRPO run of verl's own trainer with TensorHub weight transfer.

verl's ``main_ppo`` (v1 separate_async, ``+tensorhub=standalone``) trains a tiny locally built model on a
toy task with a verifiable reward (``task.py``) on this machine's CPU. Two rollout replicas pull every
version while they keep generating, the second mostly from the first; midway an elastic vLLM node
(``tensorhub attach-vllm``) joins from outside the job and pulls from its peers. Per step it prints a table
row; at the end a summary, a PNG of reward and stall per step, and one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import StepRow, read_steps
from tensorhub_dev.demo.startup import LogTail, StartupWatch
from tensorhub_verl.process_group import start_group, stop_group

logger = logging.getLogger("tensorhub_dev.demo")

_COLUMNS = ("step", "version", "reward", "stall s", "pull s", "MB", "peer %", "sources")


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, flush=True)


def _progress(started: float, text: str) -> None:
    """One start-up line on stderr, with the seconds since the job started (stdout keeps the table and JSON)."""
    print(f"  [{time.monotonic() - started:5.0f} s] {text}", file=sys.stderr, flush=True)


def _print_row(row: StepRow) -> None:
    print(f"{row.step:>4} {row.version:>7} {row.reward_mean:>7.3f} {row.stall_s:>8.3f} {row.pull_s:>7.3f} "
          f"{row.bytes / 1e6:>6.2f} {100 * row.peer_fraction:>6.0f}  {row.sources}", flush=True)


def _start_elastic_node(job: TinyJob, port: int) -> subprocess.Popen | None:
    """An elastic vLLM rollout node from outside the job: it reads the latest version from its peers."""
    hub = job.hub_url_file.read_text().strip() if job.hub_url_file.exists() else ""
    if not hub:
        return None
    command = [sys.executable, "-m", "tensorhub_verl.cli", "attach-vllm", "--hub", hub,
               "--model-dir", str(job.task.model_dir), "--port", str(port),
               "--location", "dc=dc0,rack=elastic,node=elastic-0"]
    with open(job.out_dir / "elastic_node.log", "w") as log:  # the child keeps its own descriptor
        return start_group(command, env=job.environment(), log=log, term_with_parent=True)


def _elastic_status(port: int) -> dict | None:
    """The elastic node's ``/tensorhub/status``: the version it serves and where its first fetch read from."""
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/tensorhub/status", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


def run(job: TinyJob, *, quiet: bool = False, elastic_at: int | None = None, timeout_s: float = 3600,
        progress: bool = True) -> dict:
    """Runs the job to completion; returns the demo's JSON object.

    With ``progress``, stderr gets a line as each part starts or becomes ready (Ray, verl's task runner, the hub,
    the trainer's workers, each rollout replica, the first step, the elastic node), the seconds since the start
    first; ``quiet`` only silences stdout's table.
    """
    job.out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (job.metrics_file, job.hub_url_file):
        stale.unlink(missing_ok=True)
    _say(quiet, f"verl {job.algorithm.upper()} ({job.trainer_mode}) on CPU: {job.steps} steps, "
                f"{job.replicas} rollout replicas, +tensorhub={job.mode}")
    _say(quiet, f"  log: {job.log_file}   (Ray and vLLM start-up takes 1-3 minutes on 2 cores)")
    started = time.monotonic()
    watch, tail = StartupWatch(), LogTail(job.log_file)
    if progress:
        _progress(started, "starting verl's trainer (Ray, the hub, the trainer, the rollout replicas)")
    with open(job.log_file, "w") as log:
        # Killed outright, the demo still takes the job with it: the driver gets SIGTERM, and Ray's cluster
        # shares the driver's fate.
        trainer = start_group(job.command(), env=job.environment(), log=log, term_with_parent=True)
    rows: list[StepRow] = []
    elastic: subprocess.Popen | None = None
    elastic_port = 18_000 + (job.steps % 1000)
    elastic_report = None
    elastic_ready = False
    try:
        while True:
            done = trainer.poll() is not None
            if progress and not watch.training:
                events = [e for line in tail.new_lines() for e in watch.feed(line)]
                if job.hub_url_file.exists() and job.hub_url_file.read_text().strip():
                    events += watch.hub_ready(job.hub_url_file.read_text().strip())
                for event in events:
                    _progress(started, event)
            for row in read_steps(job.metrics_file, final=done)[len(rows):]:
                if not rows and not quiet:
                    print(f"  first step after {time.monotonic() - started:.0f} s\n"
                          + " ".join(f"{c:>{w}}" for c, w in zip(_COLUMNS, (4, 7, 7, 8, 7, 6, 6, 0))), flush=True)
                rows.append(row)
                if not quiet:
                    _print_row(row)
                if elastic is not None:  # once per step: what the node serves and where it read from
                    report = _elastic_status(elastic_port)
                    if progress and report and report.get("served") is not None and not elastic_ready:
                        elastic_ready = True
                        _progress(started, f"elastic node ready: serves version {report['served']}")
                    elastic_report = report or elastic_report
                if elastic_at is not None and elastic is None and row.step >= elastic_at:
                    elastic = _start_elastic_node(job, port=elastic_port)
                    _say(quiet, "  -- an elastic vLLM node joins (tensorhub attach-vllm) and pulls from its peers --")
                    if progress and elastic is not None:
                        _progress(started, f"elastic node starting (log: {job.out_dir / 'elastic_node.log'})")
            if done:
                break
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"the verl job did not finish within {timeout_s:.0f} s; see {job.log_file}")
            time.sleep(1.0)
    finally:
        # The node first (its hub lives in the job), then the job; each with everything it started.
        if elastic is not None:
            stop_group(elastic, timeout=90)
        if trainer.poll() is None:
            stop_group(trainer, timeout=60)
        else:
            stop_group(trainer, timeout=5)  # what the finished job left in its group
    if trainer.returncode != 0 or not rows:
        tail = job.log_file.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"verl's trainer exited with {trainer.returncode} after {len(rows)} steps; "
                           f"last lines of {job.log_file}:\n{tail}")
    from tensorhub_dev.demo.plot import plot_steps

    plot = plot_steps(rows, job.out_dir / "reward_and_stall.png")
    result = {
        "demo": "ok",
        "steps": [r.as_json() for r in rows],
        "reward_first": rows[0].reward_mean,
        "reward_last": rows[-1].reward_mean,
        "plot": str(plot),
        "seconds": round(time.monotonic() - started, 1),
        "elastic_node": _elastic_summary(elastic_report),
    }
    if not quiet:
        first, last = _window_mean(rows[:3]), _window_mean(rows[-3:])
        print(f"\nreward (mean of 3 steps) {first:.3f} -> {last:.3f}; max stall {max(r.stall_s for r in rows):.3f} s; "
              f"{sum(r.bytes for r in rows) / 1e6:.1f} MB moved, "
              f"{_peer_share(rows):.0%} of it from peer rollouts; plot: {plot}")
        node = result["elastic_node"]
        if node:
            print(f"elastic node: first pulled v{node['first_version']} ({node['first_bytes'] / 1e6:.2f} MB, "
                  f"{node['first_peer_fraction']:.0%} from peers), then followed to v{node['served']}")
    return result


def _elastic_summary(status: dict | None) -> dict | None:
    if not status or not status.get("first"):
        return None
    first = status["first"]
    sources = first.get("sources", {})
    total = sum(sources.values()) or 1
    from tensorhub_verl.verl.identity import peer_bytes

    peers = peer_bytes(sources)
    return {"served": status.get("served"), "updates": status.get("updates"),
            "first_version": first.get("version"), "first_bytes": sum(sources.values()),
            "first_peer_fraction": peers / total, "first_sources": sources}


def _window_mean(rows: list[StepRow]) -> float:
    return sum(r.reward_mean for r in rows) / len(rows) if rows else 0.0


def _peer_share(rows: list[StepRow]) -> float:
    total = sum(r.bytes for r in rows)
    return sum(r.bytes * r.peer_fraction for r in rows) / total if total else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub demo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default 20; 40 for --mode elastic --hosts N, whose node's vLLM engine "
                             "starts with the job and joins once up)")
    parser.add_argument("--replicas", type=int, default=2, help="rollout replicas inside the verl job")
    parser.add_argument("--no-elastic", action="store_true", help="no elastic node joining midway")
    parser.add_argument("--out", default=None, help="directory for the model, data, logs and plot")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--mode", choices=("standalone", "elastic", "cross_dc"), default="standalone",
                        help="the +tensorhub=<mode> preset")
    parser.add_argument("--hosts", type=int, default=None,
                        help="run across this many network-lab hosts (needs root), against pulling from the trainer")
    parser.add_argument("--model-size", default=None, metavar="HIDDEN,INTERMEDIATE,LAYERS",
                        help="the tiny model's sizes (default 128,256,2: ~1.5 MB a copy; 512,1536,4: ~50 MB)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 40 if args.hosts is not None and args.mode == "elastic" else 20
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the elastic node's status polls are not news
    from tensorhub_dev.demo.task import ModelSize, build_task

    size = ModelSize.parse(args.model_size) if args.model_size else ModelSize()
    out = Path(args.out or tempfile.mkdtemp(prefix="tensorhub-demo-"))
    if args.hosts is not None:
        from tensorhub_dev.demo import hosts

        reason = hosts.unavailable_reason()
        if reason is None:
            from tensorhub_dev.netlab.verl_modes import mode_lab

            mode_lab(args.mode, args.hosts)  # refuses what it cannot build before the task is built
            task = build_task(out / "task", size=size)
            print(json.dumps(hosts.run(task, out, mode=args.mode, hosts=args.hosts, steps=args.steps,
                                       quiet=args.json)))
            return 0
        print(f"tensorhub demo --hosts {args.hosts}: the network lab cannot run here ({reason}); running the "
              f"single-host demo instead", flush=True)
    job = TinyJob(task=build_task(out / "task", size=size), out_dir=out, steps=args.steps,
                  replicas=args.replicas, mode=args.mode)
    elastic_at = None if args.no_elastic or args.steps < 4 else args.steps // 2
    result = run(job, quiet=args.json, elastic_at=elastic_at)
    print(json.dumps(result))
    return 0
