"""verl's real tiny job (``+tensorhub=cross_dc``, 2 steps) on a Ray cluster that spans two lab hosts in two
datacenters: ``ray start --head`` in one namespace, ``ray start --address`` in the other, each node labelled
with its host's location. The nodes get no job settings in their environment: those reach the workers through
the job's runtime environment. ``tensorhub.trainer_placement`` / ``rollout_placement`` put the trainer on the dc0
host and the replica on the dc1 host (each host has room for both); the replica pulls every version over the WAN."""

from __future__ import annotations

import json

import pytest
import trustme

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.task import build_task
from tensorhub_verl.bench.tiny_model import float32_bytes
from tensorhub_dev.netlab.spec import plan_lab
from tensorhub_dev.netlab.verl_job import ROLLOUT_HOST, TRAINER_HOST, run_across_two_dcs, two_dc_spec
from tests.requires import require

require("vllm", reason="the rollout replica is a vLLM engine (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

ROLLOUT_CLASSES = {"CheckpointEngineWorker", "vLLMHttpServer"}
"""The actors of a standalone replica: its pool's worker and the vLLM server verl pins to that worker's node."""
TRAINER_CLASSES = {"WorkerDict", "ActorRolloutRefWorker"}
"""The actor of a trainer rank (colocated roles in one ``WorkerDict``, or the actor worker alone)."""


def _hub_tls(tmp_path) -> tuple[str, ...]:
    """A hub actor off loopback serves HTTPS (or needs allow_plain_http): a throwaway CA and a certificate for
    the head host's lab address, where the hub actor runs."""
    head_ip = next(h.ip for h in plan_lab(two_dc_spec(), "tls").hosts if h.name == TRAINER_HOST)
    ca = trustme.CA()
    cert = ca.issue_cert(head_ip)
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "hub.pem", "key": tmp_path / "hub.key"}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    return (f"tensorhub.hub_tls_cert={paths['cert']}", f"tensorhub.hub_tls_key={paths['key']}",
            f"tensorhub.tls_ca_file={paths['ca']}")


def test_cross_dc_job_on_a_two_host_ray_cluster(no_leftovers, tmp_path):
    task = build_task(tmp_path / "task")
    placement = (f"tensorhub.trainer_placement='label:tensorhub/node={TRAINER_HOST}'",
                 "tensorhub.rollout_placement='label:tensorhub/dc=dc1'")
    job = TinyJob(task=task, out_dir=tmp_path / "out", steps=2, replicas=1, mode="cross_dc",
                  extra=(*_hub_tls(tmp_path), *placement))
    # Two GPU slots per host: either host could take both the trainer rank and the replica; the placement
    # settings, not a lack of room, decide where each goes.
    result = run_across_two_dcs(job, trainer_gpus=2, rollout_gpus=2)
    print(json.dumps(result))
    labels = sorted((n["labels"].get("tensorhub/dc"), n["labels"].get("tensorhub/node")) for n in result["nodes"])
    assert labels == [("dc0", "d0r0h0"), ("dc1", "d1r0h0")]
    assert [n["resources"].get("GPU") for n in result["nodes"]] == [2.0, 2.0]
    hosts = {}
    for actor in result["actors"]:
        # verl's colocated workers are a local class: create_colocated_worker_cls.<locals>.WorkerDict
        hosts.setdefault(actor["class"].rsplit(".", 1)[-1], set()).add(actor["host"])
    assert {c: hosts.get(c) for c in ROLLOUT_CLASSES} == {c: {ROLLOUT_HOST} for c in ROLLOUT_CLASSES}, hosts
    trainer = {c: hosts[c] for c in TRAINER_CLASSES if c in hosts}
    assert trainer and all(h == {TRAINER_HOST} for h in trainer.values()), hosts
    assert hosts.get("TensorHubHubActor") == {TRAINER_HOST}, hosts  # hub_placement: head (the driver's host)
    assert [s["step"] for s in result["steps"]] == [1, 2]
    assert [s["version"] for s in result["steps"]] == [1, 2]
    assert all(s["bytes"] > 0 for s in result["steps"])
    # Each version crossed the WAN (besides Ray's own traffic to the head: logs, heartbeats).
    assert sum(result["wan_rx_bytes_by_dc"].values()) >= 2 * float32_bytes(task.model_dir)
