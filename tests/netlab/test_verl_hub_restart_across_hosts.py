"""The hub's host restarting inside verl's real job across lab hosts: the job's hub actor (a Ray actor on the head
host) is killed outright while a version is arriving at a rollout host, and Ray starts it again on its URL and
token (``tensorhub.hub_max_restarts``).

The trainer and the hub on d0r0h0, replicas on d0r1h0 and d0r0h1, ``+tensorhub=elastic``, ``verify_digests``;
d0r1h0's link is slowed to 4 Mbit/s so that a version takes seconds to arrive, and the hub dies mid-pull after
step 2. The job goes on to its last step; the workers re-register with the new hub; the step metrics show the
restart (``tensorhub/hub_restarts`` 0, then 1); no replica ever serves a half-applied version (every applied
version's parameters match the trainer's digests); the last version reaches both replicas."""

from __future__ import annotations

import json

import pytest

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tensorhub_dev.netlab.verl_faults import HubRestart
from tensorhub_dev.netlab.verl_job import TRAINER_HOST, run_on_lab
from tensorhub_dev.netlab.verl_modes import ROLLOUT_RESOURCE, mode_lab
from tests.requires import require

require("vllm", reason="the rollout replicas are vLLM engines (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 6


def test_the_hub_killed_mid_pull_comes_back_and_the_job_goes_on(no_leftovers, tmp_path):
    lab = mode_lab("standalone", 3)
    pull_host = "d0r1h0"
    assert pull_host in lab.rollout_hosts
    job = TinyJob(task=build_task(tmp_path / "task"), out_dir=tmp_path / "out", steps=STEPS, replicas=2,
                  mode="elastic",
                  extra=(f"tensorhub.trainer_placement='label:tensorhub/node={TRAINER_HOST}'",
                         f"tensorhub.rollout_placement=resource:{ROLLOUT_RESOURCE}",
                         "tensorhub.allow_plain_http=true", "tensorhub.verify_digests=true"))
    fault = HubRestart(hub_host=TRAINER_HOST, pull_host=pull_host, after_step=2)
    result = run_on_lab(job, lab.spec, head=TRAINER_HOST, gpus={TRAINER_HOST: 1, **{h: 1 for h in lab.rollout_hosts}},
                        resources={h: {ROLLOUT_RESOURCE: 1} for h in lab.rollout_hosts}, during=fault.during)
    print(json.dumps(result))
    assert result["during"]["killed"] and result["during"]["restarted"], result["during"]
    hubs = {a["host"] for a in result["actors"] if a["class"] == "TensorHubHubActor"}
    assert hubs == {TRAINER_HOST}, result["actors"]  # where the hub ran, and came back
    assert [s["step"] for s in result["steps"]] == list(range(1, STEPS + 1))  # the job went on
    synced = [m for _, m in read_metrics(job.metrics_file) if "tensorhub/version" in m]
    print(json.dumps([{k: m[k] for k in sorted(m) if k.startswith("tensorhub/")} for m in synced]))
    # The step metrics show the restart: no restart before the kill, one from the step that met it on.
    restarts = [m.get("tensorhub/hub_restarts") for m in synced]
    assert restarts[0] == 0 and restarts[-1] == 1, restarts
    # No replica served a version whose parameters differ from the trainer's.
    assert all(m["tensorhub/digest_mismatches"] == 0 for m in synced)
    assert all(m["tensorhub/digests_checked"] == m["tensorhub/replicas_updated"] for m in synced)
    # The workers re-registered with the new hub: the last version reached both replicas.
    assert synced[-1]["tensorhub/replicas_updated"] == 2 and synced[-1]["tensorhub/version_lag"] == 0, synced[-1]
