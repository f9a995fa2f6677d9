"""The trust rules without processes: who owns a model, when reports quarantine a copy, what is a copy."""

import pytest

from tensorhub_verl.errors import ConfigError, InvalidRequest, NotModelOwner, NotOwner
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.corruption import CorruptionEvidence
from tensorhub_verl.ros.hub.ownership import DEFAULT_JOB, OwnerRule, Owners, job_of

from tests.ros.test_hub_state import begin, make_state, manifest, publish, register

KEY = ("policy", 1, "hf")


def test_a_model_belongs_to_its_first_publishers_job_unless_a_rule_names_its_owners():
    owners = Owners((OwnerRule.parse("policy=trainer-*"),))
    assert owners.owns("policy", "trainer-3", "any-job") and not owners.owns("policy", "rollout-0", "any-job")
    assert owners.owns("critic", "anyone", "job-a")  # unbound: anyone may create, and binds it
    owners.bind("critic", "job-a")
    assert owners.owns("critic", "other-worker", "job-a") and not owners.owns("critic", "w", "job-b")
    with pytest.raises(NotModelOwner, match="model 'critic' belongs to job 'job-a'"):
        owners.check_create("critic", "w", "job-b", "version 2 (hf)")
    assert job_of("") == DEFAULT_JOB and job_of("k") == job_of("k") != job_of("other")
    assert "secret" not in job_of("secret")
    with pytest.raises(ConfigError):
        OwnerRule.parse("policy")


def test_a_report_quarantines_a_copy_only_on_its_own_jobs_word():
    evidence = CorruptionEvidence(hold_s=10.0)
    # Another job's reports, however many workers send them: only that job's readers read elsewhere.
    for reader in ("stranger-a", "stranger-b", "stranger-c"):
        assert not evidence.report(KEY, "holder", reader, "job-x", "job-owner", protected=False, now=0.0)
    assert evidence.excluded(KEY, "holder", "stranger-d", "job-x", 1.0), "the whole reporting job reads elsewhere"
    assert not evidence.excluded(KEY, "holder", "rollout", "job-owner", 1.0) and not evidence.quarantined(
        KEY, "holder", 1.0)
    # Its own job's word quarantines it for everyone, unless it is the last vouched copy of a retained version.
    assert not evidence.report(KEY, "holder", "rollout", "job-owner", "job-owner", protected=True, now=1.0)
    assert evidence.excluded(KEY, "holder", "rollout", "job-owner", 1.0), "the reporter itself reads elsewhere"
    assert not evidence.excluded(KEY, "holder", "rollout-2", "job-owner", 1.0)
    assert evidence.report(KEY, "holder", "rollout", "job-owner", "job-owner", protected=False, now=2.0)
    assert evidence.excluded(KEY, "holder", "anyone", "job-y", 2.0) and evidence.quarantined(KEY, "holder", 2.0)
    evidence.expire(20.0)
    assert not evidence.excluded(KEY, "holder", "stranger-d", "job-x", 20.0)


def test_neither_an_announced_copy_nor_a_quarantined_one_counts_as_a_copy():
    state, _ = make_state()
    m = manifest(chunks=4)
    for worker in ("trainer", "liar", "mirror"):
        register(state, worker)
    publish(state, "trainer", m)
    begin(state, "liar", m, have=range(4))
    state.end_fetch(msg.EndFetch(worker="liar", holder="liar", model="policy", version=1, layout="hf",
                                 ok=True, hold=True))

    def must_preserve() -> bool:
        return state.must_preserve(msg.PreserveQuery(holder="trainer", model="policy", version=1,
                                                     layout="hf")).must_preserve

    assert must_preserve(), "the liar read nothing through the hub"
    publish(state, "mirror", m)
    assert not must_preserve(), "an owner's copy counts"
    state.quarantine.evidence.report(KEY, "mirror", "r1", "default", "default", protected=False,
                                     now=state._clock())
    assert must_preserve(), "a quarantined copy does not"
    with pytest.raises(InvalidRequest, match="active; only a fetch begun"):
        state.end_fetch(msg.EndFetch(worker="mirror", holder="mirror", model="policy", version=1, layout="hf",
                                     ok=True, hold=True))


def test_a_live_worker_keeps_its_job():
    state, _ = make_state()
    join = msg.RegisterWorker(worker="w", location=msg.LocationMsg(), agent_name="w-a", agent_metadata_b64="AAAA")
    credential = state.register_worker(join, job_key="job-a").credential
    state.register_worker(join, credential, job_key="job-a")  # refreshing its metadata: fine
    with pytest.raises(NotOwner, match="a live worker keeps its job"):
        state.register_worker(join, credential, job_key="job-b")
