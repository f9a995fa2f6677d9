"""An elastic vLLM node that joins verl's running job from another lab host: ``tensorhub attach-vllm`` started in
that host's namespace once the job's hub is up and the job has trained ``join_after`` steps, outside the job's Ray
cluster (as a node a user adds by hand), reading the hub URL from the job's ``hub_url_file`` and the job's token
from its own environment (``TENSORHUB_TOKEN``, never a command line). The node takes the newest version once its
engine is up (minutes on a loaded CPU, against seconds per training step: ``join_after=0`` starts it while the job
starts, and it joins mid-run).

While the job runs, ``ElasticJoiner.during`` polls the node's ``GET /tensorhub/status`` from inside its host once
per training step; when the job reaches its last step (or ends) it stops the node's whole process group, so nothing
it started outlives the run (vLLM's engine processes go with ``attach-vllm``: ``PR_SET_PDEATHSIG``).

``reboot=True``: the node's host reboots once the node has applied its first version: every process in the host's
namespace is SIGKILLed at once (the node, its engine core and workers; no goodbye to the hub, whose heartbeat
timeout drops the node's holdings), then the node is started again, as the host's startup would, and rejoins with
whatever version is newest. The summary's ``first`` is then the rejoined node's first pull, and ``reboot`` says
what the node applied before it (``before``), after how many steps the host rebooted, and how many processes died.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_steps
from tensorhub_dev.netlab import iproute
from tensorhub_dev.netlab.lab import Lab, kill_netns_pids
from tensorhub_verl.process_group import stop_group
from tensorhub_verl.verl.identity import peer_bytes

log = logging.getLogger("tensorhub_dev.netlab.verl_elastic")

PORT = 18_500
STOP_TIMEOUT_S = 90.0
"""How long the node may take to leave the hub and stop its engine before its group is killed."""
REBOOT_TIMEOUT_S = 30.0
"""How long a rebooting host's killed processes may take to be gone."""
_JOB_ONLY = {"RAY_ADDRESS", "VERL_FILE_LOGGER_PATH"}
_STATUS_CODE = ("import sys, urllib.request; "
                "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")


@dataclass(frozen=True, slots=True)
class ElasticJoiner:
    """``attach-vllm`` on ``host`` with the labels ``location`` (dc/rack/node), started once the hub's URL is
    written and ``join_after`` training steps are done; ``env``: what the node gets besides the job's environment
    (the job's token); ``args``: more ``attach-vllm`` options."""

    host: str
    location: Mapping[str, str]
    join_after: int = 0
    env: Mapping[str, str] | None = None
    args: tuple[str, ...] = ()
    port: int = PORT
    reboot: bool = False

    def command(self, job: TinyJob, hub: str) -> list[str]:
        where = ",".join(f"{k}={v}" for k, v in self.location.items())
        return [sys.executable, "-m", "tensorhub_verl.cli", "attach-vllm", "--hub", hub,
                "--model-dir", str(job.task.model_dir), "--host", "0.0.0.0", "--port", str(self.port),
                "--location", where, "--worker", f"elastic-{self.host}", "--allow-plain-http", *self.args]

    def during(self, lab: Lab, job: TinyJob, proc: subprocess.Popen, deadline: float) -> dict:
        """Runs alongside the job until it ends (or ``deadline``, monotonic): starts the node, follows its status,
        stops it at the job's last step. Returns what the node reported (``summary``)."""
        node: subprocess.Popen | None = None
        status: dict | None = None
        started_at = None
        rebooted: dict | None = None
        seen = 0
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                rows = read_steps(job.metrics_file, final=False)
                if node is None and len(rows) >= self.join_after and job.hub_url_file.exists():
                    node, started_at = self._start(lab, job), len(rows)
                if len(rows) > seen:
                    seen = len(rows)
                    if node is not None:
                        status = self._status(lab) or status
                    if self.reboot and rebooted is None and status and status.get("first"):
                        rebooted = {"after_step": seen, "killed": self._reboot(lab, node),
                                    "before": summary(status, host=self.host, started_after_step=started_at)}
                        node, started_at, status = self._start(lab, job, "elastic_node.rejoined.log"), seen, None
                    if seen >= job.steps - 1 and node is not None:
                        break  # the job's last step is under way: the node leaves while its hub is still up
                time.sleep(1.0)
            if node is not None and node.poll() is None:
                status = self._status(lab) or status
        finally:
            if node is not None:
                code = stop_group(node, timeout=STOP_TIMEOUT_S)
                log.info("elastic node on %s stopped (exit %s)", self.host, code)
        out = summary(status, host=self.host, started_after_step=started_at)
        return {**out, "reboot": rebooted} if self.reboot else out

    def _reboot(self, lab: Lab, node: subprocess.Popen) -> int:
        """Kills every process of the node's host at once and waits for them to be gone; returns how many."""
        netns = lab.host(self.host).netns
        pids = iproute.netns_pids(netns)
        log.warning("rebooting %s: killing its %d processes at once", self.host, len(pids))
        kill_netns_pids(netns)
        node.wait(REBOOT_TIMEOUT_S)  # reaped: the host's processes are gone, not zombies of this one
        end = time.monotonic() + REBOOT_TIMEOUT_S
        while iproute.netns_pids(netns) and time.monotonic() < end:
            time.sleep(0.2)
        return len(pids)

    def _start(self, lab: Lab, job: TinyJob, log_name: str = "elastic_node.log") -> subprocess.Popen:
        hub = job.hub_url_file.read_text().strip()
        log.info("elastic node joins on %s (%s), hub %s", self.host, dict(self.location), hub)
        # The job's environment (vLLM's CPU settings), less what names the job's own cluster and metrics file.
        env = {k: v for k, v in job.environment().items() if k not in _JOB_ONLY}
        with open(job.out_dir / log_name, "w") as out:  # the child keeps its own descriptor
            return lab.host(self.host).popen(self.command(job, hub), env={**env, **(self.env or {})}, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)

    def _status(self, lab: Lab) -> dict | None:
        host = lab.host(self.host)
        url = f"http://{host.ip}:{self.port}/tensorhub/status"
        try:
            proc = host.run([sys.executable, "-c", _STATUS_CODE, url], timeout=20, check=False)
        except Exception as e:  # noqa: BLE001 - a status poll that fails is retried at the next step
            log.debug("status of the elastic node on %s: %s", self.host, e)
            return None
        try:
            return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
        except (ValueError, IndexError):
            return None


def summary(status: dict | None, *, host: str, started_after_step: int | None) -> dict:
    """The node's first pull (version, seconds, bytes and their share from peers) and the pulls that followed."""
    out = {"host": host, "started_after_step": started_after_step, "first": None, "followed": [], "served": None}
    if not status or not status.get("first"):
        return out
    out["served"] = status.get("served")
    out["first"] = _pull(status["first"])
    out["followed"] = [_pull(h) for h in status.get("history", [])[1:]]
    return out


def _pull(result: Mapping) -> dict:
    sources = {str(k): int(v) for k, v in (result.get("sources") or {}).items()}
    total = sum(sources.values())
    return {"version": result.get("version"), "pull_s": result.get("pull_s"), "stall_s": result.get("stall_s"),
            "bytes": total, "peer_fraction": peer_bytes(sources) / total if total else 0.0,
            "sources": sources}


def node_log_tail(out_dir: Path, chars: int = 2000) -> str:
    try:
        return (out_dir / "elastic_node.log").read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no elastic_node.log: the node never started)"


__all__ = ["ElasticJoiner", "node_log_tail", "summary"]
