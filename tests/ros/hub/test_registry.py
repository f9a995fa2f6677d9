"""The hub's registry alone: credentials, the one-plane rule, id-to-job bindings, silence."""

import pytest

from tensorhub_verl.errors import NotOwner, PlaneMismatch, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.registry import Registry, hash_secret
from tensorhub_verl.ros.hub.ownership import job_of

from tests.ros.hub.parts import worker


def _req(name, agent="a1", plane="nixl"):
    return msg.RegisterWorker(worker=name, location=msg.LocationMsg(), agent_name=agent, agent_metadata_b64="AAAA",
                              plane=plane)


def _admit(registry, name, credential="", job_key="", agent="a1", plane="nixl"):
    admission = registry.admit(_req(name, agent, plane), credential, job_key)
    registry.put(_record(name, admission, agent, plane))
    return admission


def _record(name, admission, agent, plane):
    record = worker(name, job=admission.job)
    record.credential_hash = hash_secret(admission.secret)
    record.agent_name = agent
    record.plane = plane
    return record


def test_a_live_id_needs_its_credential_and_authenticate_checks_it():
    registry = Registry("hub1", worker_timeout_s=10.0)
    first = _admit(registry, "w")
    assert first.secret and first.old is None and not first.restarted
    with pytest.raises(NotOwner, match="held by a live worker"):
        registry.admit(_req("w"), "wrong", "")
    again = registry.admit(_req("w"), first.secret, "")
    assert again.secret == first.secret and again.old is not None and not again.restarted
    assert registry.authenticate("w", first.secret).worker == "w"
    with pytest.raises(NotOwner, match="without its credential"):
        registry.authenticate("w", "")
    with pytest.raises(UnknownWorker, match="register first"):
        registry.authenticate("nobody", first.secret)


def test_a_new_agent_under_a_live_id_is_a_restart():
    registry = Registry("hub1", worker_timeout_s=10.0)
    first = _admit(registry, "w", agent="a1")
    assert registry.admit(_req("w", agent="a2"), first.secret, "").restarted


def test_a_freed_id_stays_with_the_job_that_first_registered_it():
    registry = Registry("hub1", worker_timeout_s=10.0)
    _admit(registry, "w", job_key="job-a-key")
    assert registry.remove("w") is not None and "w" not in registry
    with pytest.raises(NotOwner, match="never given to another job"):
        registry.admit(_req("w"), "", "job-b-key")
    assert registry.admit(_req("w"), "", "job-a-key").job == job_of("job-a-key")


def test_a_plane_other_than_the_hubs_is_refused_at_registration():
    registry = Registry("hub1", worker_timeout_s=10.0, plane="tcp")
    with pytest.raises(PlaneMismatch):
        registry.admit(_req("first", plane="nixl"), "", "")  # the first worker chooses nothing
    _admit(registry, "a", plane="tcp")
    for plane in ("nixl", "zzz"):
        with pytest.raises(PlaneMismatch):
            registry.admit(_req("b", plane=plane), "", "")


def test_silence_discounts_the_hubs_own_stall():
    registry = Registry("hub1", worker_timeout_s=10.0)
    _admit(registry, "w")
    registry.touch("w", now=100.0, stalled=0.0)
    assert registry.silent(now=111.0, stalled=0.0) == [(registry.get("w"), 11.0)]
    assert registry.silent(now=111.0, stalled=5.0) == []  # 5 s of the 11 the hub itself was stalled
    assert registry.alive(registry.get("w"), now=105.0, stalled=0.0)
