"""Faults injected into verl's job across lab hosts while it runs (``run_on_lab``'s ``during``).

Both wait for a pull into a rollout host: that host's link is first slowed to ``slow_mbit`` so that a version
takes seconds to arrive; once the job has trained ``after_step`` steps, the host's incoming bytes are sampled every
``sample_s``, and the first sample above ``pull_bytes_per_s`` (a version arriving, far above Ray's own chatter)
is mid-pull (``wait_for_pull``).

``LinkCut``: the rollout host's link is cut (its cable pulled at the rack's end, ``Lab.set_link``) and restored
``cut_s`` later.

``HubRestart``: the job's hub actor (``verl/hub_actor.py``: a Ray actor on the head host) is killed outright
(SIGKILL, as a crash or an OOM kill would) and Ray restarts it on its host, on its URL and token
(``tensorhub.hub_max_restarts``); the job's workers re-register with the new instance.

``RAY_TOLERATES_CUT``: Ray's settings for a cluster that should outlive such a cut (its control store otherwise
declares a node dead after 5 failed health checks), given to every node (``run_on_lab(cluster_env=...)``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_steps
from tensorhub_dev.netlab import iproute
from tensorhub_dev.netlab.lab import Lab

log = logging.getLogger("tensorhub_dev.netlab.verl_faults")

RAY_TOLERATES_CUT = {"RAY_health_check_failure_threshold": "60"}
HUB_PROCESS_TITLE = "ray::TensorHubHubActor"
"""How Ray titles the hub actor's worker process (its command line, as ``ps`` shows it)."""


@dataclass(frozen=True, slots=True)
class MidPull:
    """Where and when a fault strikes: a pull into ``host`` after ``after_step`` steps (module docstring)."""

    host: str
    slow_mbit: float = 4.0
    after_step: int = 2
    pull_bytes_per_s: float = 100_000.0
    sample_s: float = 0.2

    def wait(self, lab: Lab, job: TinyJob, proc: subprocess.Popen, deadline: float) -> tuple[int, float] | None:
        """Slows ``host``'s link and waits for a pull into it; returns (steps logged, bytes/s seen), or None if
        the job ended (or ``deadline`` passed) first."""
        lab.shape(self.host, self.slow_mbit)
        while proc.poll() is None and time.monotonic() < deadline:
            if len(read_steps(job.metrics_file, final=False)) >= self.after_step:
                break
            time.sleep(1.0)
        last, at = lab.nic_rx_bytes(self.host), time.monotonic()
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(self.sample_s)
            now, t = lab.nic_rx_bytes(self.host), time.monotonic()
            rate, last, at = (now - last) / (t - at), now, t
            if rate >= self.pull_bytes_per_s:
                return len(read_steps(job.metrics_file, final=True)), rate
        return None


@dataclass(frozen=True, slots=True)
class LinkCut:
    host: str
    cut_s: float = 20.0
    after_step: int = 2

    def during(self, lab: Lab, job: TinyJob, proc: subprocess.Popen, deadline: float) -> dict:
        """Waits for a pull into ``host`` after ``after_step`` steps, cuts the link for ``cut_s``, restores it.
        Returns when it cut (the steps logged by then, the bytes/s that showed the pull) or that it never did."""
        seen = MidPull(self.host, after_step=self.after_step).wait(lab, job, proc, deadline)
        if seen is None:
            return {"host": self.host, "cut": False}
        steps, rate = seen
        log.warning("cutting %s's link for %.0f s (receiving %.0f B/s after %d steps)", self.host, self.cut_s,
                    rate, steps)
        lab.set_link(self.host, False)
        try:
            time.sleep(self.cut_s)
        finally:
            lab.set_link(self.host, True)
        return {"host": self.host, "cut": True, "steps_before": steps, "bytes_per_s": round(rate),
                "cut_s": self.cut_s}


@dataclass(frozen=True, slots=True)
class HubRestart:
    """Kills the hub actor's process on ``hub_host`` while a version is arriving at ``pull_host``; waits up to
    ``back_within_s`` for Ray to start it again."""

    hub_host: str
    pull_host: str
    after_step: int = 2
    back_within_s: float = 120.0

    def during(self, lab: Lab, job: TinyJob, proc: subprocess.Popen, deadline: float) -> dict:
        """Returns whether it killed the hub (its pid, the steps logged by then) and whether a new hub process
        was up on ``hub_host`` within ``back_within_s`` (its pid, seconds after the kill)."""
        out: dict = {"host": self.hub_host, "killed": False}
        seen = MidPull(self.pull_host, after_step=self.after_step).wait(lab, job, proc, deadline)
        old = hub_pids(lab, self.hub_host)
        if seen is None or len(old) != 1:
            out["hub_pids"] = old
            return out
        log.warning("killing the hub actor (pid %d on %s) while %s receives %.0f B/s after %d steps", old[0],
                    self.hub_host, self.pull_host, seen[1], seen[0])
        os.kill(old[0], signal.SIGKILL)
        killed_at = time.monotonic()
        out.update(killed=True, pid=old[0], steps_before=seen[0], restarted=False)
        while proc.poll() is None and time.monotonic() < min(deadline, killed_at + self.back_within_s):
            new = [p for p in hub_pids(lab, self.hub_host) if p != old[0]]
            if new:
                out.update(restarted=True, new_pid=new[0], back_after_s=round(time.monotonic() - killed_at, 1))
                break
            time.sleep(0.5)
        return out


def hub_pids(lab: Lab, host: str) -> list[int]:
    """The hub actor processes running on lab host ``host`` (by Ray's process title)."""
    return [pid for pid in iproute.netns_pids(lab.host(host).netns) if process_title(pid).startswith(HUB_PROCESS_TITLE)]


def process_title(pid: int) -> str:
    """``pid``'s command line as ``ps`` shows it (Ray's title for its workers), "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


__all__ = ["HUB_PROCESS_TITLE", "HubRestart", "LinkCut", "MidPull", "RAY_TOLERATES_CUT", "hub_pids", "process_title"]
