"""Ownership that survives restarts and covers every form of a model, attacked from outside: a real hub process
with owner rules in its configuration is killed and started again, and a token holder of another job registers
before the job's workers are back; real clients for the job, raw hub requests for the attacker."""

import dataclasses

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.errors import NotModelOwner
from tensorhub_verl.ros.hub.ownership import OwnerRule, Owners, job_of
from tensorhub_verl.vllm.lora import ADAPTER_LAYOUT, adapter_model, pack_adapter
from tests.ros.outsiders import Outsider

TOKEN = "trust-ownership-token"
JOB = "the-trainers-own-job-key"
CHUNK = 4096
WEIGHTS = {"w": torch.arange(4 * CHUNK // 4, dtype=torch.float32)}
ADAPTER = {"base_model.model.q_proj.lora_A.weight": torch.ones(4, 16)}
PEFT = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}


def _hub(tmp_path, *owners: str) -> HubProcess:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    args = ["--token-file", str(token_file), "--worker-timeout", "5", "--plane", "tcp"]
    for rule in owners:
        args += ["--owner", rule]
    return HubProcess(args=tuple(args)).start()


def _connect(hub, worker, job_key=JOB):
    return th.connect(hub.url, worker, token=TOKEN, job_key=job_key, chunk_bytes=CHUNK, hub_retry_s=30.0)


def test_a_job_rule_keeps_the_model_and_its_forms_the_jobs_across_a_restart(tmp_path):
    hub = _hub(tmp_path, f"policy=job:{job_of(JOB)}")
    try:
        with _connect(hub, "trainer-0") as trainer:
            base = trainer.publish("policy", 1, WEIGHTS)
            adapter = trainer.publish(adapter_model("policy"), 1, pack_adapter(ADAPTER, PEFT, base_version=1),
                                      layout=ADAPTER_LAYOUT)
            hub.kill()
            hub.start()  # a new instance, with the same rules before its first request
            mallory = Outsider(hub.url, TOKEN, "trainer-9", job_key="another-job")  # registers first
            try:
                for forged in (dataclasses.replace(base, version=2**62),
                               dataclasses.replace(adapter, version=2**62),
                               dataclasses.replace(base, model="policy.delta", version=2)):
                    with pytest.raises(NotModelOwner, match=f"job {job_of(JOB)!r}"):
                        mallory.publish_copy(forged)
            finally:
                mallory.close()
            # The trainer's client re-registers its holdings; its next versions become latest everywhere.
            trainer.publish("policy", 2, WEIGHTS)
            trainer.publish(adapter_model("policy"), 2, pack_adapter(ADAPTER, PEFT, base_version=2),
                            layout=ADAPTER_LAYOUT)
            assert trainer.latest("policy") == 2 and trainer.latest(adapter_model("policy"), layout=ADAPTER_LAYOUT) == 2
    finally:
        hub.stop()


def test_a_worker_glob_rule_covers_the_models_adapter_and_every_form(tmp_path):
    hub = _hub(tmp_path, "policy=trainer-*")
    try:
        mallory = Outsider(hub.url, TOKEN, "mallory", job_key="another-job")
        try:
            with _connect(hub, "trainer-0") as trainer:
                published = trainer.publish(adapter_model("policy"), 1, pack_adapter(ADAPTER, PEFT, base_version=0),
                                            layout=ADAPTER_LAYOUT)
                for model in (adapter_model("policy"), "policy.delta", "policy.x.y"):
                    with pytest.raises(NotModelOwner, match="hub rule policy=trainer-"):
                        mallory.publish_copy(dataclasses.replace(published, model=model, version=7))
        finally:
            mallory.close()
    finally:
        hub.stop()


def test_the_matching_rule_a_model_and_its_dotted_forms():
    rule = OwnerRule.parse("policy=job:job-0123")
    assert [rule.covers(m) for m in ("policy", "policy.lora", "policy.delta.v2", "policy2", "other.policy")] == \
        [True, True, True, False, False]
    owners = Owners()
    owners.bind("critic.lora", "job-a")  # a form published first binds its base name's family
    assert not owners.owns("critic", "w", "job-b") and owners.owns("critic.delta", "w", "job-a")
    assert OwnerRule.for_job("policy", JOB).admits("anyone", job_of(JOB))
