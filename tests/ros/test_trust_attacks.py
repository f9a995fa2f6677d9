"""Attacks from outside by workers that hold the shared token (issue 22, points 1-5 and 7): a real hub, real
clients for the victims, raw hub requests for the attacker. Each was accepted before owners, required digests,
vouched copies and independent evidence existed."""

import dataclasses

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import InvalidRequest, ManifestMismatch, NotModelOwner
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.hub_client import HubClient
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.wire.convert import manifest_to_msg

TOKEN = "trust-attacks-token"
JOB = "the-trainers-own-job-key"
CHUNK = 4096
WEIGHTS = {"w": torch.arange(4 * CHUNK // 4, dtype=torch.float32)}  # 4 chunks


@pytest.fixture
def hub():
    # Keyless workers admitted (HubConfig.allow_keyless): the default job is one of the jobs these attacks come
    # from. A hub with a token refuses keyless workers by default (test_trust_edge.py).
    server = th.start_hub(token=TOKEN, config=th.HubConfig(heartbeat_s=0.5, allow_keyless=True))
    yield server
    server.stop()


def _connect(hub, worker, **config):
    return th.connect(hub.url, worker, token=TOKEN, chunk_bytes=CHUNK, **config)


def _attacker(hub, worker="mallory", job_key=None) -> HubClient:
    raw = HubClient(hub.url, TOKEN, request_timeout_s=10, retry_s=2, job_key=job_key)
    raw.post(msg.REGISTER_PATH, msg.RegisterWorker(
        worker=worker, location=msg.LocationMsg(), agent_name=f"{worker}-agent", agent_metadata_b64="bWV0YQ=="),
        msg.WorkerAck)
    return raw


def _publish(raw: HubClient, worker: str, manifest: Manifest, regions=None, **shard):
    regions = regions or [msg.RegionMsg(addr=1 << 20)] * len(manifest.tensors)
    return raw.post("/v1/publish", msg.Publish(
        worker=worker, holder=worker, manifest=manifest_to_msg(manifest), regions=regions, **shard), msg.OkReply)


def _holders(client, model="policy") -> dict[str, dict]:
    return {h["holder"]: h for v in client.status()["models"].get(model, []) for h in v["holders"]}


# ------------------------------------------------------------------------------------ 1. owners
def test_a_worker_of_another_job_cannot_hijack_latest_nor_add_a_layout(hub):
    with _connect(hub, "trainer", job_key=JOB) as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        for job_key in (None, "another-job"):
            name = f"mallory-{job_key}"  # a worker id stays with the job that first registered it
            mallory = _attacker(hub, name, job_key=job_key)
            for forged in (dataclasses.replace(published, version=2**62),
                           dataclasses.replace(published, layout="vllm/tp1/rank0")):
                with pytest.raises(NotModelOwner, match="model 'policy' belongs to job 'job-"):
                    _publish(mallory, name, forged)
            mallory.post("/v1/workers/leave", params={"worker": name}, reply=msg.OkReply)
        assert trainer.versions("policy") == {1: ["trainer"]} and trainer.latest("policy") == 1
        with _connect(hub, "trainer-rank-1", job_key=JOB) as colleague:  # the same job may
            colleague.publish("policy", 2, WEIGHTS)
            assert trainer.latest("policy") == 2


def test_two_jobs_on_one_hub_cannot_collide_on_a_model_name(hub):
    with _connect(hub, "a-trainer", job_key="job-a") as a, _connect(hub, "b-trainer", job_key="job-b") as b:
        a.publish("policy", 1, WEIGHTS)
        with pytest.raises(NotModelOwner, match="Publish under another model name"):
            b.publish("policy", 2, WEIGHTS)
        b.publish("b/policy", 2, WEIGHTS)
        assert a.versions("policy") == {1: ["a-trainer"]}


def test_configured_owners_decide_who_creates_versions(hub):
    hub.stop()
    owned = th.start_hub(token=TOKEN, owners=("policy=trainer-*",), config=th.HubConfig(allow_keyless=True))
    try:
        with th.connect(owned.url, "rollout-0", token=TOKEN) as rollout:
            with pytest.raises(NotModelOwner, match="workers matching 'trainer-\\*'"):
                rollout.publish("policy", 1, WEIGHTS)
            with th.connect(owned.url, "trainer-0", token=TOKEN) as trainer:
                trainer.publish("policy", 1, WEIGHTS)
                stats = rollout.fetch("policy", 1)  # a reader holds what it fetched through the hub
                assert torch.equal(stats.buffers["w"], WEIGHTS["w"])
                assert sorted(rollout.versions("policy")[1]) == ["rollout-0", "trainer-0"]
    finally:
        owned.stop()


def test_a_non_owner_may_hold_a_copy_of_a_visible_version_only_with_its_digests(hub):
    with _connect(hub, "trainer", job_key=JOB) as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        mallory = _attacker(hub)
        wrong = dataclasses.replace(published, chunk_digests=("0" * 16,) * len(published.chunk_digests))
        with pytest.raises(ManifestMismatch):
            _publish(mallory, "mallory", wrong)
        _publish(mallory, "mallory", published)  # a copy, as a reader re-registering after a hub restart
        assert trainer.versions("policy") == {1: ["mallory", "trainer"]}


# ------------------------------------------------------------------------------ 2. shard ranks
def test_an_outsider_cannot_take_a_shard_rank(hub):
    specs = {"w": ((4096,), torch.float32)}
    full = torch.arange(4096, dtype=torch.float32)
    with _connect(hub, "rank-0", job_key=JOB) as rank0, _connect(hub, "rank-1", job_key=JOB) as rank1:
        mine = rank0.publish_shard("policy", 1, {"w": full[:2048]}, specs=specs, rank=0, ranks=2)
        mallory = _attacker(hub)
        forged = tuple("" if d else "0" * 16 for d in mine.chunk_digests)  # rank 1's chunks, garbage
        rows = dataclasses.replace(mine, chunk_digests=forged)
        with pytest.raises(NotModelOwner, match="shards of group 'shards'"):
            _publish(mallory, "mallory", rows, [msg.RegionMsg(addr=1 << 20, offset=8192, nbytes=8192)],
                     shard_group="shards", shard_count=2, shard_rank=1)
        rank1.publish_shard("policy", 1, {"w": full[2048:]}, specs=specs, rank=1, ranks=2)
        with _connect(hub, "reader", job_key=JOB) as reader:  # NIXL holders serve their own job's readers
            assert torch.equal(reader.fetch("policy", 1, hold=False).buffers["w"], full)


# ---------------------------------------------------------------------------------- 3. digests
def test_a_version_without_digests_is_refused(hub):
    mallory = _attacker(hub)
    with pytest.raises(InvalidRequest, match="must carry a digest of every chunk"):
        bare = th.Manifest("fresh", 1, "hf", (th.TensorSpec("w", (1024,), "float32", 4096),), CHUNK)
        _publish(mallory, "mallory", bare)
    with pytest.raises(InvalidRequest, match="must carry a digest"):
        with _connect(hub, "trainer", chunk_digests=False) as trainer:
            trainer.publish("policy", 1, WEIGHTS)


# --------------------------------------------------------------------------- 4. announced chunks
def test_a_holder_that_only_announced_its_chunks_is_no_copy_for_the_trainers_unpublish(hub):
    with _connect(hub, "trainer") as trainer:  # one job: the liar is even a member of it
        published = trainer.publish("policy", 1, WEIGHTS)
        liar = _attacker(hub, "liar")
        key = {"worker": "liar", "holder": "liar", "model": "policy", "version": 1, "layout": "hf"}
        liar.post("/v1/fetch/begin", msg.BeginFetch(**key, digest=published.digest, regions=[msg.RegionMsg(
            addr=1 << 20)], have=list(range(len(published.chunks())))), msg.BeginFetchReply)
        liar.post("/v1/fetch/end", msg.EndFetch(**key, ok=True, hold=True), msg.EndFetchAck)
        assert _holders(trainer)["liar"]["state"] == "held", "announced chunks never make a source"
        assert trainer.versions("policy") == {1: ["trainer"]}
        trainer.unpublish("policy", 1)
        assert trainer.preserved_bytes == published.nbytes, "the liar was counted as a copy: v1 would be lost"
        assert _holders(trainer)["trainer~cpu"]["state"] == "active"


# ------------------------------------------------------------------------------ 7. fetch/end
def test_fetch_end_cannot_turn_a_pending_shard_active(hub):
    with _connect(hub, "trainer") as trainer:
        trainer.publish("policy", 1, WEIGHTS, layout="tp/rank0", shard_group="engine", shard_count=2)
        key = {"worker": "trainer", "holder": "trainer", "model": "policy", "version": 1,
               "layout": "tp/rank0"}
        with pytest.raises(InvalidRequest, match="pending; only a fetch begun"):
            trainer._hub.post("/v1/fetch/end", msg.EndFetch(**key, ok=True, hold=True), msg.EndFetchAck)
        assert trainer.versions("policy") == {}, "1 of 2 shards must stay invisible"


# ------------------------------------------------------------------------- 5. corruption reports
def test_one_workers_false_corruption_reports_quarantine_nobody(hub):
    with _connect(hub, "trainer") as trainer:
        published = trainer.publish("policy", 1, WEIGHTS)
        mallory = _attacker(hub)
        key = {"worker": "mallory", "holder": "mallory", "model": "policy", "version": 1, "layout": "hf"}
        begin = msg.BeginFetch(**key, digest=published.digest, regions=[msg.RegionMsg(addr=1 << 20)], want=4)
        first = mallory.post("/v1/fetch/begin", begin, msg.BeginFetchReply).first
        assert len(first.assignments) == 4, "the attacker got leases on the trainer's copy"
        mallory.post("/v1/fetch/exchange", msg.Exchange(**key, want=0, failed=[
            msg.FailedRead(lease=a.lease, corrupt=True) for a in first.assignments]), msg.ExchangeReply)
        mallory.post("/v1/fetch/end", msg.EndFetch(**key, ok=False, hold=False), msg.EndFetchAck)
        again = mallory.post("/v1/fetch/begin", begin, msg.BeginFetchReply).first
        assert again.assignments == [], "the accuser is not planned on the copy it accused: it cannot repeat"
        assert not _holders(trainer)["trainer"]["quarantined"]
        with _connect(hub, "reader") as reader:
            assert torch.equal(reader.fetch("policy", 1, hold=False).buffers["w"], WEIGHTS["w"])
