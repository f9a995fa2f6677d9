"""Quarantine from evidence, attacked from outside: a real hub, real clients on the TCP plane for the victims,
raw hub requests (and a real TCP plane serving garbage) for the attackers. Workers of another job cannot take a
job's copies away with corruption reports, a member of the job cannot take its last copy away, and a copy built
from chunks a reader only announced is never a source."""

import time

import pytest
import torch

import tensorhub_verl as th
from tests.ros.outsiders import Outsider

TOKEN = "trust-evidence-token"
JOB = "the-trainers-own-job-key"
CHUNK = 4096
WEIGHTS = {"w": torch.arange(4 * CHUNK // 4, dtype=torch.float32)}  # 4 chunks


@pytest.fixture
def hub():
    # Attackers send no heartbeats: the hub keeps them registered for the whole attack.
    server = th.start_hub(token=TOKEN, config=th.HubConfig(heartbeat_s=0.5, worker_timeout_s=120, plane="tcp"))
    yield server
    server.stop()


def _connect(hub, worker, job_key=JOB):
    return th.connect(hub.url, worker, token=TOKEN, chunk_bytes=CHUNK, job_key=job_key, transport="tcp")


def _accuse(attacker: Outsider, digest: str) -> set[str]:
    """One round of the attack: begin a fetch, report every lease it is given corrupt, end it. A failed read makes
    its source suspect until its next heartbeat, so the attacker begins again until it is given leases."""
    deadline = time.monotonic() + 10
    while True:
        first = attacker.begin(digest, want=8)
        attacker.report_corrupt([a.lease for a in first.assignments])
        attacker.end(ok=False, hold=False)
        if first.assignments or time.monotonic() > deadline:
            return {a.source for a in first.assignments}
        time.sleep(0.2)


def _holders(client, model="policy") -> dict[str, dict]:
    return {h["holder"]: h for v in client.status()["models"].get(model, []) for h in v["holders"]}


def test_two_workers_of_another_job_cannot_quarantine_a_jobs_copies(hub):
    with _connect(hub, "trainer") as trainer, _connect(hub, "rollout-0") as rollout:
        published = trainer.publish("policy", 1, WEIGHTS)
        rollout.fetch("policy", 1)  # a second, vouched copy
        attackers = [Outsider(hub.url, TOKEN, f"mallory-{i}", job_key="another-job") for i in range(2)]
        try:
            # The first begins, is leased reads on both copies, and reports every one corrupt.
            assert _accuse(attackers[0], published.digest) == {"trainer", "rollout-0"}, "leased both copies"
            # From then on its job is kept off both copies: neither attacker is leased a read to report again.
            for attacker in attackers * 2:
                again = attacker.begin(published.digest, want=8)
                assert again is not None and not again.assignments, again
                attacker.end(ok=False, hold=False)
            assert not any(h["quarantined"] for h in _holders(trainer).values())
            with _connect(hub, "rollout-1") as honest:
                stats = honest.fetch("policy", 1, hold=False)
                assert torch.equal(stats.buffers["w"], WEIGHTS["w"])
        finally:
            for attacker in attackers:
                attacker.close()


def test_members_of_the_job_cannot_quarantine_its_last_copy(hub):
    with _connect(hub, "trainer") as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        liars = [Outsider(hub.url, TOKEN, f"liar-{i}", job_key=JOB) for i in range(2)]  # two ids of the job
        try:
            for liar in liars:
                assert _accuse(liar, published.digest) == {"trainer"}
            assert not _holders(trainer)["trainer"]["quarantined"], "the only copy of a retained version"
            with _connect(hub, "rollout-0") as honest:
                assert torch.equal(honest.fetch("policy", 1, hold=False).buffers["w"], WEIGHTS["w"])
        finally:
            for liar in liars:
                liar.close()


def test_a_copy_built_from_announced_chunks_never_serves_a_read(hub):
    with _connect(hub, "trainer") as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        garbage = torch.full((WEIGHTS["w"].numel() * 4,), 0x5A, dtype=torch.uint8)
        liar = Outsider(hub.url, TOKEN, "liar", job_key=JOB, served=garbage)  # a real plane serving garbage
        try:
            liar.begin(published.digest, have=range(len(published.chunks())))
            liar.end(ok=True, hold=True)
            assert _holders(trainer)["liar"]["state"] == "held"
            assert trainer.versions("policy") == {1: ["trainer"]}, "not listed among the holders"
            for i in range(3):
                with _connect(hub, f"rollout-{i}") as reader:
                    stats = reader.fetch("policy", 1, hold=False)
                    assert torch.equal(stats.buffers["w"], WEIGHTS["w"]) and "liar" not in stats.sources
            assert hub.state.quarantine.corrupt_reads == {}, "no reader was planned on the liar"
        finally:
            liar.close()
