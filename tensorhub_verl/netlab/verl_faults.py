"""Faults injected into verl's job across lab hosts while it runs (``run_on_lab``'s ``during``).

``LinkCut``: a rollout host's link is cut mid-pull (its cable pulled at the rack's end, ``Lab.set_link``) and
restored ``cut_s`` later. The host's link is first slowed to ``slow_mbit`` so that a version takes seconds to
arrive; mid-pull is found from the link itself: once the job has trained ``after_step`` steps, the host's incoming
bytes are sampled every ``sample_s``, and the first sample above ``pull_bytes_per_s`` (a version arriving, far
above Ray's own chatter) cuts it.

``RAY_TOLERATES_CUT``: Ray's settings for a cluster that should outlive such a cut (its control store otherwise
declares a node dead after 5 failed health checks), given to every node (``run_on_lab(cluster_env=...)``).
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass

from tensorhub_verl.demo.job import TinyJob
from tensorhub_verl.demo.progress import read_steps
from tensorhub_verl.netlab.lab import Lab

log = logging.getLogger("tensorhub_verl.netlab.verl_faults")

RAY_TOLERATES_CUT = {"RAY_health_check_failure_threshold": "60"}


@dataclass(frozen=True, slots=True)
class LinkCut:
    host: str
    slow_mbit: float = 4.0
    cut_s: float = 20.0
    after_step: int = 2
    pull_bytes_per_s: float = 100_000.0
    sample_s: float = 0.2

    def during(self, lab: Lab, job: TinyJob, proc: subprocess.Popen, deadline: float) -> dict:
        """Waits for a pull into ``host`` after ``after_step`` steps, cuts the link for ``cut_s``, restores it.
        Returns when it cut (the steps logged by then, the bytes/s that showed the pull) or that it never did."""
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
            if rate < self.pull_bytes_per_s:
                continue
            steps = len(read_steps(job.metrics_file, final=True))
            log.warning("cutting %s's link for %.0f s (receiving %.0f B/s after %d steps)", self.host,
                        self.cut_s, rate, steps)
            lab.set_link(self.host, False)
            try:
                time.sleep(self.cut_s)
            finally:
                lab.set_link(self.host, True)
            return {"host": self.host, "cut": True, "steps_before": steps, "bytes_per_s": round(rate),
                    "cut_s": self.cut_s}
        return {"host": self.host, "cut": False}


__all__ = ["LinkCut", "RAY_TOLERATES_CUT"]
