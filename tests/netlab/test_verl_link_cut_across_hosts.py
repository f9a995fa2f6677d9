"""A rollout host's link cut mid-pull inside verl's real job across lab hosts (``+tensorhub=elastic``: a replica
that fails to pull keeps serving its previous version, ``min_replica_fraction=0.5``).

The trainer on d0r0h0, replicas on d0r1h0 and d0r0h1; d0r1h0's link is slowed to 4 Mbit/s (a version takes
seconds to arrive), then cut for 30 s once a version is arriving after step 2, longer than the pull's limit
(``fetch_timeout_s=10``). The job goes on to its last step; the step of the cut shows the loss (a replica that did
not apply its version: ``replicas_updated`` 1, ``version_lag`` 1); no replica ever serves a half-applied version
(``verify_digests``: every applied version's parameters match the trainer's digests); after the link is back the
host's replica applies the newest version again."""

from __future__ import annotations

import json

import pytest

from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tensorhub_dev.netlab.verl_faults import RAY_TOLERATES_CUT, LinkCut
from tensorhub_dev.netlab.verl_job import TRAINER_HOST, run_on_lab
from tensorhub_dev.netlab.verl_modes import ROLLOUT_RESOURCE, mode_lab
from tests.requires import require

require("vllm", reason="the rollout replicas are vLLM engines (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = 8


def test_a_rollout_hosts_link_cut_mid_pull_costs_one_version_not_the_job(no_leftovers, tmp_path):
    lab = mode_lab("standalone", 3)
    cut_host = "d0r1h0"
    assert cut_host in lab.rollout_hosts
    job = TinyJob(task=build_task(tmp_path / "task"), out_dir=tmp_path / "out", steps=STEPS, replicas=2,
                  mode="elastic",
                  extra=(f"tensorhub.trainer_placement='label:tensorhub/node={TRAINER_HOST}'",
                         f"tensorhub.rollout_placement=resource:{ROLLOUT_RESOURCE}",
                         "tensorhub.allow_plain_http=true", "tensorhub.verify_digests=true",
                         "tensorhub.fetch_timeout_s=10"))
    cut = LinkCut(host=cut_host, cut_s=30.0, after_step=2)
    result = run_on_lab(job, lab.spec, head=TRAINER_HOST, gpus={TRAINER_HOST: 1, **{h: 1 for h in lab.rollout_hosts}},
                        resources={h: {ROLLOUT_RESOURCE: 1} for h in lab.rollout_hosts}, during=cut.during,
                        cluster_env=RAY_TOLERATES_CUT)
    print(json.dumps(result))
    assert result["during"]["cut"], result["during"]
    assert [s["step"] for s in result["steps"]] == list(range(1, STEPS + 1))  # the job went on
    synced = [m for _, m in read_metrics(job.metrics_file) if "tensorhub/version" in m]
    print(json.dumps([{k: m[k] for k in sorted(m) if k.startswith("tensorhub/")} for m in synced]))
    # No replica served a version whose parameters differ from the trainer's.
    assert all(m["tensorhub/digest_mismatches"] == 0 for m in synced)
    assert all(m["tensorhub/digests_checked"] == m["tensorhub/replicas_updated"] for m in synced)
    # The cut shows in the step metrics: a version one replica did not apply.
    lost = [m for m in synced if m["tensorhub/replicas_updated"] < 2]
    assert lost and all(m["tensorhub/version_lag"] >= 1 for m in lost), synced
    # The link came back: the last version reached both replicas.
    assert synced[-1]["tensorhub/replicas_updated"] == 2 and synced[-1]["tensorhub/version_lag"] == 0, synced[-1]
