"""verl's tiny job on a Ray cluster that spans lab hosts: the head host runs the driver (and, by Ray's choice,
whatever verl puts there), the other hosts join with their own location labels.

Two datacenters of one host each, joined by a shaped WAN link; ``ray start`` on each host with its logical GPU
slots (the CPU presets schedule trainer ranks and replicas on them). The job connects to the existing cluster,
so the preset's ``ray_kwargs.ray_init.num_gpus/num_cpus`` are set to null (Ray refuses them when connecting).
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_steps
from tensorhub_dev.netlab.lab import Lab
from tensorhub_dev.netlab.ray_cluster import LabRayCluster
from tensorhub_dev.netlab.spec import DatacenterSpec, LabSpec, RackSpec
from tensorhub_verl.verl.runtime_env import job_settings

log = logging.getLogger("tensorhub_dev.netlab.verl_job")

TRAINER_HOST = "d0r0h0"
ROLLOUT_HOST = "d1r0h0"


def two_dc_spec(*, nic_mbit: float | None = 1000.0, wan_mbit: float | None = 200.0) -> LabSpec:
    return LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=(TRAINER_HOST,)),)),
                                DatacenterSpec(name="dc1", racks=(RackSpec(name="r0", hosts=(ROLLOUT_HOST,)),))),
                   nic_mbit=nic_mbit, wan_mbit=wan_mbit)


def cluster_job(job: TinyJob) -> TinyJob:
    """``job`` as it runs against an existing cluster: no resources in ``ray.init``, the driver's RAY_ADDRESS."""
    return replace(job, extra=(*job.extra, "ray_kwargs.ray_init.num_gpus=null", "ray_kwargs.ray_init.num_cpus=null"))


def run_across_two_dcs(job: TinyJob, *, timeout_s: float = 1500.0, trainer_gpus: int | None = None,
                       rollout_gpus: int | None = None,
                       resources: Mapping[str, Mapping[str, float]] | None = None) -> dict:
    """Runs ``job`` with the driver on the dc0 host and the dc1 host in the cluster (``resources``: custom Ray
    resources per host); see ``run_on_lab``."""
    gpus = {TRAINER_HOST: trainer_gpus if trainer_gpus is not None else job.trainer_ranks,
            ROLLOUT_HOST: rollout_gpus if rollout_gpus is not None else job.replicas}
    return run_on_lab(job, two_dc_spec(), head=TRAINER_HOST, gpus=gpus, resources=resources, timeout_s=timeout_s)


During = Callable[[Lab, TinyJob, subprocess.Popen, float], dict]
"""Runs beside the job (``lab, job, the driver's process, deadline`` on the monotonic clock) until the job ends;
what it returns is the result's ``during``."""


def run_on_lab(job: TinyJob, spec: LabSpec, *, head: str, gpus: Mapping[str, int],
               resources: Mapping[str, Mapping[str, float]] | None = None, timeout_s: float = 1500.0,
               outside: Sequence[str] = (), during: During | None = None,
               job_env: Mapping[str, str] | None = None, cluster_env: Mapping[str, str] | None = None) -> dict:
    """Runs ``job`` from ``head`` on a Ray cluster of every host of ``spec`` but ``outside`` (``gpus``: each
    host's logical GPU slots, ``resources``: its custom Ray resources; ``job_env``: more of the driver's
    environment, which reaches the job's workers through its runtime environment; ``cluster_env``: more of every
    Ray node's own environment, e.g. Ray's system settings); ``during`` runs beside it
    (e.g. a node that joins from an ``outside`` host). Returns the steps, the cluster's nodes as Ray lists them
    (labels included), every actor the job ran with its host, the bytes that crossed the WAN into each dc (Ray's
    own traffic to the head included) and what ``during`` returned."""
    job = cluster_job(job)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (job.metrics_file, job.hub_url_file):
        stale.unlink(missing_ok=True)
    env = {**job.environment(), **(job_env or {})}
    env.pop("RAY_ADDRESS", None)
    # The nodes get what a host's own setup gives them; the job's settings (TENSORHUB_*, the metrics file, verl's
    # platform) reach their workers only through the job's runtime environment, as on separate machines.
    node_env = {**{k: v for k, v in env.items() if k not in job_settings(env)}, **(cluster_env or {})}
    with Lab(spec) as lab:
        workers = [h.name for h in lab.hosts if h.name != head and h.name not in outside]
        with LabRayCluster(lab, head=head, workers=workers, num_gpus=gpus, resources=resources,
                           log_dir=job.out_dir / "ray", env=node_env) as cluster:
            nodes = cluster.nodes()
            wan_before = lab.wan_tx_bytes_by_dc()
            started = time.monotonic()
            with open(job.log_file, "w") as out:
                proc = lab.host(head).popen(job.command(), env={**env, "RAY_ADDRESS": cluster.address},
                                            stdout=out, stderr=subprocess.STDOUT)
            beside = during(lab, job, proc, started + timeout_s) if during is not None else None
            try:
                code = proc.wait(max(1.0, started + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            wan_after = lab.wan_tx_bytes_by_dc()
            seconds = time.monotonic() - started
            actors = cluster.actors() if code == 0 else []
    rows = read_steps(job.metrics_file, final=True)
    if code != 0 or not rows:
        tail = job.log_file.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"verl's job across hosts ended with {code} after {len(rows)} steps; "
                           f"last lines of {job.log_file}:\n{tail}")
    return {"steps": [r.as_json() for r in rows], "nodes": nodes, "actors": actors, "seconds": round(seconds, 1),
            "wan_rx_bytes_by_dc": {dc: wan_after[dc] - wan_before.get(dc, 0) for dc in wan_after},
            "during": beside}


__all__ = ["ROLLOUT_HOST", "TRAINER_HOST", "cluster_job", "run_across_two_dcs", "run_on_lab", "two_dc_spec"]
