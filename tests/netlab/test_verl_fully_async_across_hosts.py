"""verl's fully async policy (``fully_async_main``: rollouter and trainer as separate Ray actors) on a Ray cluster
of two lab hosts: the trainer rank on d0r0h0 (``trainer_placement``, applied to fully_async's ``trainer_pool``),
the vLLM replica on d0r1h0 (``rollout_placement``); every trainer step's weights cross the lab's links to the
replica through the job's hub on the head host."""

from __future__ import annotations

import json

import pytest

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tensorhub_dev.netlab.verl_job import TRAINER_HOST, run_on_lab
from tensorhub_dev.netlab.verl_modes import ROLLOUT_RESOURCE, mode_lab
from tensorhub_verl.bench.tiny_model import float32_bytes
from tests.netlab.test_verl_across_hosts import ROLLOUT_CLASSES, TRAINER_CLASSES
from tests.requires import require

require("vllm", reason="the rollout replica is a vLLM engine (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_fully_async_with_the_trainer_and_the_rollouts_on_different_hosts(no_leftovers, tmp_path):
    lab = mode_lab("standalone", 2)
    (rollout_host,) = lab.rollout_hosts
    task = build_task(tmp_path / "task")
    job = TinyJob(task=task, out_dir=tmp_path / "out", steps=3, replicas=1, trainer_mode="fully_async",
                  extra=(f"tensorhub.trainer_placement='label:tensorhub/node={TRAINER_HOST}'",
                         f"tensorhub.rollout_placement=resource:{ROLLOUT_RESOURCE}",
                         "tensorhub.allow_plain_http=true"))
    # Two GPU slots per host: either host could take the trainer rank or the replica; the placement decides.
    result = run_on_lab(job, lab.spec, head=TRAINER_HOST, gpus={TRAINER_HOST: 2, rollout_host: 2},
                        resources={rollout_host: {ROLLOUT_RESOURCE: 1}})
    print(json.dumps(result))
    hosts: dict[str, set] = {}
    for actor in result["actors"]:
        hosts.setdefault(actor["class"].rsplit(".", 1)[-1], set()).add(actor["host"])
    assert {c: hosts.get(c) for c in ROLLOUT_CLASSES} == {c: {rollout_host} for c in ROLLOUT_CLASSES}, hosts
    trainer = {c: hosts[c] for c in TRAINER_CLASSES if c in hosts}
    assert trainer and all(h == {TRAINER_HOST} for h in trainer.values()), hosts
    assert "FullyAsyncTrainer" in hosts and "FullyAsyncRollouter" in hosts, hosts  # fully_async's own actors
    synced = [m for _, m in read_metrics(job.metrics_file) if "tensorhub/version" in m]
    assert len(synced) >= 2, [sorted(m) for _, m in read_metrics(job.metrics_file)]
    for m in synced:  # every sync reached the replica on the other host, whole
        assert m["tensorhub/replicas_updated"] == 1 and m["tensorhub/version_lag"] == 0
        assert m["tensorhub/bytes"] >= float32_bytes(task.model_dir)
