"""Attacks from outside by workers that hold the shared token (issue 22, points 10 and 13): a real hub, raw hub
requests for the attacker. Each was accepted, or answered only after the hub built the attacker's chunk map,
before the checks they test existed."""

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.bench.publish_cost import piece_limit_publish, register
from tensorhub_verl.errors import JobKeyRequired, NotModelOwner, NotOwner, OverBudget
from tensorhub_verl.ros.wire import messages as msg

TOKEN = "trust-costs-token"
JOB = "the-trainers-own-job-key"
WEIGHTS = {"w": torch.arange(4096, dtype=torch.float32)}


def _hub(plane="auto", **limits):
    return th.start_hub(token=TOKEN, config=th.HubConfig(heartbeat_s=0.5, limits=HubLimits(**limits), plane=plane))


def _publish(client, req: msg.Publish) -> None:
    client.post("/v1/publish", req, msg.OkReply)


# ---------------------------------------------------------------- 10. nothing costs before the credential
def test_a_publish_is_refused_for_its_credential_and_owner_before_its_chunk_map_is_built():
    hub = _hub(max_shard_pieces=1024)
    try:
        with th.connect(hub.url, "trainer", token=TOKEN, job_key=JOB, chunk_bytes=4096) as trainer:
            trainer.publish("policy", 1, WEIGHTS)
            mallory = register(hub.url, "mallory", job_key="mallorys-job", token=TOKEN)
            # Over the piece limit: a hub that built (or checked) the chunk map first would answer InvalidRequest.
            with pytest.raises(NotOwner, match="without its credential"):
                _publish(mallory, piece_limit_publish("trainer", version=2, pieces=2048))
            with pytest.raises(NotModelOwner, match="may not create shards"):
                _publish(mallory, piece_limit_publish("mallory", version=2, pieces=2048))
            assert trainer.versions("policy") == {1: ["trainer"]}
    finally:
        hub.stop()


def test_pending_shards_are_budgeted_per_worker():
    hub = _hub(max_pending_shards_per_worker=2, max_pending_pieces_per_worker=160)
    try:
        rank0 = register(hub.url, "trainer", job_key=JOB, token=TOKEN)
        rank1 = register(hub.url, "trainer-1", job_key=JOB, token=TOKEN)
        for version in (1, 2):  # 64 pieces each: two ranks of 32 tensors, never completed
            _publish(rank0, piece_limit_publish("trainer", version=version, pieces=64))
        with pytest.raises(OverBudget, match=r"HubLimits\.max_pending_shards_per_worker=2"):
            _publish(rank0, piece_limit_publish("trainer", version=3, pieces=64))
        _publish(rank1, piece_limit_publish("trainer-1", version=1, pieces=64, rank=1))  # v1 complete
        with pytest.raises(OverBudget, match=r"HubLimits\.max_pending_pieces_per_worker=160"):
            _publish(rank0, piece_limit_publish("trainer", version=3, pieces=128))
        _publish(rank0, piece_limit_publish("trainer", version=3, pieces=64))
        status = rank0.get("/v1/status", reply=msg.StatusReply)
        assert sorted(v.version for v in status.models["policy"]) == [1, 2, 3]
    finally:
        hub.stop()


# ------------------------------------------------------------------- 13. a freed id stays with its job
def test_a_freed_worker_id_is_never_given_to_another_job():
    hub = _hub()
    try:
        with th.connect(hub.url, "trainer-0", token=TOKEN, job_key=JOB, chunk_bytes=4096) as trainer:
            trainer.publish("policy", 1, WEIGHTS)
        # trainer-0 left: its id is free, but only for its own job.
        with pytest.raises(JobKeyRequired):  # no job at all: refused before the id is looked at
            register(hub.url, "trainer-0", job_key=None, token=TOKEN)
        with pytest.raises(NotOwner, match="never given to another job"):
            register(hub.url, "trainer-0", job_key="another-job", token=TOKEN)
        with th.connect(hub.url, "trainer-0", token=TOKEN, job_key=JOB, chunk_bytes=4096) as again:
            again.publish("policy", 2, WEIGHTS)
            assert again.latest("policy") == 2
    finally:
        hub.stop()


# ------------------------------------------------------------ 8. NIXL metadata only to the job's own
def test_nixl_metadata_goes_only_to_workers_of_the_holders_job():
    hub = _hub(plane="nixl")
    try:
        with th.connect(hub.url, "trainer", token=TOKEN, job_key=JOB, transport="nixl",
                        chunk_bytes=4096) as trainer:
            published = trainer.publish("policy", 1, WEIGHTS)
            # Raw requests, as an attacker of another job: neither beginning a fetch nor an exchange may hand it
            # the trainer's NIXL metadata.
            mallory = register(hub.url, "mallory", job_key="another-job", token=TOKEN)
            begin = msg.BeginFetch(worker="mallory", holder="mallory", model="policy", version=1,
                                   layout=published.layout, digest=published.digest,
                                   regions=[msg.RegionMsg(addr=1 << 20)], want=16)
            with pytest.raises(NotOwner, match="goes only to workers of their own job"):
                mallory.post("/v1/fetch/begin", begin, msg.BeginFetchReply)
            with th.connect(hub.url, "outsider", token=TOKEN, job_key="another-job", transport="nixl") as outsider:
                with pytest.raises(NotOwner, match="job_key"):
                    outsider.fetch("policy", 1, hold=False)
            with th.connect(hub.url, "colleague", token=TOKEN, job_key=JOB, transport="nixl") as colleague:
                assert torch.equal(colleague.fetch("policy", 1, hold=False).buffers["w"], WEIGHTS["w"])
    finally:
        hub.stop()
    # One plane per hub: on a TCP hub, whose holders check a signed grant per read, a worker of another job reads.
    tcp_hub = _hub(plane="tcp")
    try:
        with th.connect(tcp_hub.url, "trainer", token=TOKEN, job_key=JOB, transport="tcp",
                        chunk_bytes=4096) as trainer, \
                th.connect(tcp_hub.url, "outsider", token=TOKEN, job_key="another-job", transport="tcp") as outsider:
            trainer.publish("policy", 1, WEIGHTS)
            assert torch.equal(outsider.fetch("policy", 1, hold=False).buffers["w"], WEIGHTS["w"])
    finally:
        tcp_hub.stop()
