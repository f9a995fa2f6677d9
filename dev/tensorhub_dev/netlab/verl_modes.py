"""The rollout modes inside verl's real job across lab hosts, each against pulling from the trainer in the same lab.

- ``standalone``: one datacenter; the trainer on host d0r0h0 (rack r0), the N-1 rollout replicas spread over
  racks r1 and r0 (one host each);
- ``cross_dc``: the trainer alone in dc0, the N-1 replicas in dc1 behind the shaped WAN link;
- ``elastic``: one datacenter; the trainer on d0r0h0 (rack r0), N-2 replicas on rack r1, and an elastic vLLM node
  (``tensorhub attach-vllm``, outside the job's Ray cluster) that joins from one more rack-r1 host after the first
  training step (``verl_elastic``).

Each mode runs twice, on a fresh lab and Ray cluster each: TensorHub (the job's cooperative hub) and the
pull-from-trainer baseline (``tensorhub.cooperative=false``: only complete copies serve, no WAN seeding). The
trainer and verl's helper actors (task runner, agent and reward loops) are placed on the trainer's host by Ray
node label (``tensorhub.trainer_placement``, ``helper_placement``), the replicas on the rollout hosts by a custom
resource each offers (``tensorhub.rollout_placement``). The hub listens on the head host's lab
address over plain HTTP with the job's token (``allow_plain_http``: the lab's network is this machine's
namespaces, nobody else's).

In ``elastic`` the baseline's joining node reads the trainer's layout (``attach-vllm --source-layout hf``; the
replicas' engine layout is not the trainer's) and gives the trainer's rack as its location: the hub's planner,
nearest first, then sends it to the trainer (not to a replica of its own rack, which holds that layout too after
an in-place pull), and its bytes cross the lab's links from the trainer's host. The TensorHub run's node gives its
own rack and reads the engine's layout from its peers.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import StepRow
from tensorhub_dev.demo.task import TaskFiles
from tensorhub_verl.errors import ConfigError
from tensorhub_dev.netlab.spec import DatacenterSpec, LabSpec, RackSpec
from tensorhub_dev.netlab.verl_elastic import ElasticJoiner, node_log_tail
from tensorhub_dev.netlab.verl_job import TRAINER_HOST, run_on_lab

log = logging.getLogger("tensorhub_dev.netlab.verl_modes")

MODES = ("standalone", "elastic", "cross_dc")
VARIANTS = ("tensorhub", "pull_from_trainer")
ROLLOUT_RESOURCE = "th_rollout_host"
"""The custom Ray resource each rollout host offers; the replicas' placement asks for it."""
NIC_MBIT, RACK_UPLINK_MBIT, WAN_MBIT = 1000.0, 1000.0, 200.0


@dataclass(frozen=True, slots=True)
class ModeLab:
    spec: LabSpec
    rollout_hosts: tuple[str, ...]
    """The hosts of the job's replicas (one each)."""
    rollout_dc: str
    elastic_host: str | None = None
    """The host an elastic node joins from (``elastic``), outside the job's Ray cluster."""


def mode_lab(mode: str, hosts: int) -> ModeLab:
    """The lab of ``mode`` with ``hosts`` hosts: the trainer's and hosts-1 rollout hosts."""
    if mode not in MODES:
        raise ConfigError(f"across lab hosts the modes are {', '.join(MODES)}; got {mode!r}")
    if hosts < 2:
        raise ConfigError(f"--hosts must be >= 2 (the trainer's host and at least one rollout host), got {hosts}")
    if mode == "elastic":
        if hosts < 3:
            raise ConfigError(f"--mode elastic needs --hosts >= 3 (the trainer's host, a replica's and the elastic "
                              f"node's), got {hosts}")
        replicas = tuple(f"d0r1h{i}" for i in range(hosts - 2))
        joiner = f"d0r1h{hosts - 2}"
        racks = (RackSpec(name="r0", hosts=(TRAINER_HOST,)), RackSpec(name="r1", hosts=(*replicas, joiner)))
        spec = LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=racks),), nic_mbit=NIC_MBIT,
                       rack_uplink_mbit=RACK_UPLINK_MBIT)
        return ModeLab(spec, replicas, "dc0", elastic_host=joiner)
    rollouts = hosts - 1
    if mode == "cross_dc":
        rollout = tuple(f"d1r0h{i}" for i in range(rollouts))
        dcs = (DatacenterSpec(name="dc0", racks=(RackSpec(name="r0", hosts=(TRAINER_HOST,)),)),
               DatacenterSpec(name="dc1", racks=(RackSpec(name="r0", hosts=rollout),)))
        return ModeLab(LabSpec(datacenters=dcs, nic_mbit=NIC_MBIT, wan_mbit=WAN_MBIT), rollout, "dc1")
    # standalone: replica i on rack r1 when i is even, else on the trainer's rack r0.
    other = tuple(f"d0r1h{i}" for i in range((rollouts + 1) // 2))
    same = tuple(f"d0r0h{i + 1}" for i in range(rollouts // 2))
    racks = (RackSpec(name="r0", hosts=(TRAINER_HOST, *same)), RackSpec(name="r1", hosts=other))
    spec = LabSpec(datacenters=(DatacenterSpec(name="dc0", racks=racks),), nic_mbit=NIC_MBIT,
                   rack_uplink_mbit=RACK_UPLINK_MBIT)
    return ModeLab(spec, other + same, "dc0")


def mode_job(task: TaskFiles, out_dir: Path, mode: str, hosts: int, variant: str, steps: int) -> TinyJob:
    """The tiny job of one variant: one replica per rollout host, the trainer and the replicas placed."""
    if variant not in VARIANTS:
        raise ConfigError(f"variant must be one of {VARIANTS}, got {variant!r}")
    extra = (f"tensorhub.trainer_placement='label:tensorhub/node={TRAINER_HOST}'",
             f"tensorhub.helper_placement='label:tensorhub/node={TRAINER_HOST}'",
             f"tensorhub.rollout_placement=resource:{ROLLOUT_RESOURCE}",
             "tensorhub.allow_plain_http=true",
             f"tensorhub.cooperative={'true' if variant == 'tensorhub' else 'false'}")
    replicas = len(mode_lab(mode, hosts).rollout_hosts)
    return TinyJob(task=task, out_dir=out_dir / f"{mode}-{variant}", steps=steps, replicas=replicas, mode=mode,
                   extra=extra)


def elastic_secrets() -> dict[str, str]:
    """The job's token (the hub requires one off loopback) and its key (``ClientConfig.job_key``: only the job's
    workers create versions of its model, so a node outside Ray that holds the key may publish its copies), given
    to the job's driver, whose runtime environment carries them to every worker, and to the node's environment."""
    return {"TENSORHUB_TOKEN": secrets.token_urlsafe(32), "TENSORHUB_JOB_KEY": secrets.token_urlsafe(32)}


def elastic_joiner(lab: ModeLab, variant: str, job_secrets: dict[str, str], *,
                   reboot: bool = False) -> ElasticJoiner:
    """The elastic node of ``lab``: with TensorHub its own rack as its location; in the baseline the trainer's
    rack and the trainer's layout (see the module's doc). ``reboot``: its host reboots once it has applied a
    version, and it rejoins (``ElasticJoiner``)."""
    th = variant == "tensorhub"
    return ElasticJoiner(host=lab.elastic_host, location={"dc": "dc0", "rack": "r1" if th else "r0",
                                                          "node": lab.elastic_host},
                         env=dict(job_secrets), args=() if th else ("--source-layout", "hf"), reboot=reboot)


def run_variant(task: TaskFiles, out_dir: Path, mode: str, hosts: int, variant: str, steps: int,
                timeout_s: float = 1500.0, *, reboot: bool = False) -> dict:
    """One run of one variant; its steps, where its actors ran and its summary (``summarize``). ``reboot``
    (elastic): the elastic node's host reboots mid-run and the node rejoins."""
    lab = mode_lab(mode, hosts)
    job = mode_job(task, out_dir, mode, hosts, variant, steps)
    gpus = {TRAINER_HOST: job.trainer_ranks, **{h: 1 for h in lab.rollout_hosts}}
    resources = {h: {ROLLOUT_RESOURCE: 1} for h in lab.rollout_hosts}
    log.info("verl %s (%s) across %d lab hosts", mode, variant, hosts)
    if lab.elastic_host is None:
        result = run_on_lab(job, lab.spec, head=TRAINER_HOST, gpus=gpus, resources=resources, timeout_s=timeout_s)
        return {**result, "summary": summarize(result, replicas=job.replicas, rollout_dc=lab.rollout_dc)}
    job_secrets = elastic_secrets()
    joiner = elastic_joiner(lab, variant, job_secrets, reboot=reboot)
    result = run_on_lab(job, lab.spec, head=TRAINER_HOST, gpus=gpus, resources=resources, timeout_s=timeout_s,
                        outside=(lab.elastic_host,), during=joiner.during, job_env=job_secrets)
    node = result.pop("during")
    if node["first"] is None:
        raise RuntimeError(f"the elastic node on {lab.elastic_host} applied no version before the job's last step "
                           f"(give the job more --steps); last lines of its log:\n{node_log_tail(job.out_dir)}")
    return {**result, "elastic_node": node,
            "summary": summarize(result, replicas=job.replicas, rollout_dc=lab.rollout_dc)}


def step_rows(result: dict) -> list[StepRow]:
    return [StepRow(**step, sources=f"peers {100 * step['peer_fraction']:.0f} %") for step in result["steps"]]


def summarize(result: dict, *, replicas: int, rollout_dc: str) -> dict:
    """Per step means of bytes pulled, their share from peers, stall and pull; the copies of each version that
    came from the trainer (across the WAN in cross_dc, where the trainer is the only holder outside the rollout
    datacenter); the lab router's bytes into the rollout datacenter per step (Ray's own traffic included)."""
    rows = step_rows(result)
    n = len(rows)
    total = sum(r.bytes for r in rows)
    from_trainer = sum(r.bytes * (1.0 - r.peer_fraction) for r in rows)
    model_bytes = total / (n * replicas) if n else 0.0
    return {"steps": n, "replicas": replicas,
            "bytes_per_step": total / n if n else 0.0,
            "peer_fraction": (total - from_trainer) / total if total else 0.0,
            "trainer_copies_per_version": from_trainer / (n * model_bytes) if model_bytes else 0.0,
            "stall_s_mean": sum(r.stall_s for r in rows) / n if n else 0.0,
            "stall_s_max": max((r.stall_s for r in rows), default=0.0),
            "pull_s_mean": sum(r.pull_s for r in rows) / n if n else 0.0,
            "router_bytes_into_rollout_dc_per_step":
                result["wan_rx_bytes_by_dc"].get(rollout_dc, 0) / n if n and result["wan_rx_bytes_by_dc"] else None,
            "seconds": result["seconds"]}


def compare(runs: dict[str, dict]) -> dict:
    """TensorHub against pull-from-trainer: the trainer's copies per version and the mean stall, as ratios."""
    th, base = runs["tensorhub"]["summary"], runs["pull_from_trainer"]["summary"]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    out = {"trainer_copies_ratio": ratio(base["trainer_copies_per_version"], th["trainer_copies_per_version"]),
           "stall_ratio": ratio(base["stall_s_mean"], th["stall_s_mean"]),
           "pull_ratio": ratio(base["pull_s_mean"], th["pull_s_mean"])}
    joined = {v: (runs[v].get("elastic_node") or {}).get("first") for v in VARIANTS}
    if all(joined.values()):  # elastic: the joining node's first pull
        out["joiner_pull_ratio"] = ratio(joined["pull_from_trainer"]["pull_s"], joined["tensorhub"]["pull_s"])
        out["joiner_peer_fraction"] = {v: round(joined[v]["peer_fraction"], 3) for v in VARIANTS}
    return out


__all__ = ["MODES", "VARIANTS", "compare", "elastic_joiner", "mode_job", "mode_lab", "run_variant", "step_rows",
           "summarize"]
