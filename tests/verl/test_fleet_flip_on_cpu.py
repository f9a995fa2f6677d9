"""The fleet flip (``tensorhub.flip_together``) in the rollout updater, through verl's own
``CheckpointEngineManager``: three replicas whose engine ranks are our real extension and holder (stub servers,
``fakes.py``), pulling real bytes into real staging through a real hub. What is checked, from the applies the
engines recorded: the fleet never serves three versions at once, a version whose check failed on one replica is
served by none, a replica that missed a version catches up to the fleet's before the fleet moves on, and the hub's
status shows each replica's serving version."""

from __future__ import annotations

import pytest
import ray

from tests.verl.fakes import FakeReplica, Recorder, StubActorGroup, StubServer, TrainerStub, digest, weights_for
from tests.verl.test_updater_on_cpu import _manager

pytestmark = pytest.mark.timeout(300)


def _served_sets(events, replicas):
    """The set of versions served after each apply, in the order the engines finished them."""
    serving: dict[int, int] = {}
    seen = []
    for _t, who, what, detail in sorted(events, key=lambda e: e[0]):
        if what == "apply_end" and who in replicas:
            serving[who] = detail[0]
            seen.append((detail[0], set(serving.values())))
    return seen


def test_the_fleet_flips_together_never_serving_three_versions_nor_a_failed_one(ray_local):
    import tensorhub_verl as th

    hub = th.start_hub(host="127.0.0.1", port=0)
    recorder = Recorder.remote()
    th_cfg = {"hub_address": hub.url, "keep_versions": 2, "staging": "cpu", "rollout_staging": "cpu",
              "chunk_mb": 1, "fetch_timeout_s": 180.0, "unpublish_timeout_s": 60.0, "apply_timeout_s": 180.0,
              "verify_digests": True, "min_replica_fraction": 0.5, "flip_together": True}
    trainer = TrainerStub.remote(th_cfg, job="flip")
    servers = {0: [StubServer.remote(0, recorder)], 1: [StubServer.remote(1, recorder)],
               2: [StubServer.remote(2, recorder, fail_check_of=42)]}
    replicas = [FakeReplica(r, servers[r], recorder) for r in (0, 1, 2)]
    try:
        manager = _manager(th_cfg, StubActorGroup([trainer]), replicas)
        manager.update_weights(global_steps=41)
        m42 = manager.update_weights(global_steps=42)  # replica 2's check of v42 fails: nobody flips to it
        assert m42["tensorhub/flip_committed"] == 41.0 and m42["tensorhub/flip_blocked"] == 1.0
        replicas[2].fail_abort = True  # replica 2 misses v43; the quorum (2 of 3) flips without it
        m43 = manager.update_weights(global_steps=43)
        assert m43["tensorhub/flip_committed"] == 43.0 and m43["tensorhub/versions_served"] == 2.0
        replicas[2].fail_abort = False  # it catches up to v43 first, then the others flip to v44
        m44 = manager.update_weights(global_steps=44)
        assert m44["tensorhub/flip_committed"] == 44.0 and m44["tensorhub/versions_served"] == 2.0
        served = _served_sets(ray.get(recorder.get.remote()), {0, 1, 2})
        versions = [v for v, _ in served]
        assert 42 not in versions, served
        assert all(len(s) <= 2 for _, s in served), served
        assert sorted(versions) == [41, 41, 41, 43, 43, 43, 44, 44], served
        with th.connect(hub.url, "observer") as observer:
            status = observer.status()["flips"]["policy"]
        assert sorted(r["serving"] for r in status["replicas"].values()) == [43, 44, 44]
        assert status["failed"] == [42]
        for r in (0, 1):
            assert ray.get(servers[r][0].served_digest.remote()) == digest(weights_for(44).items())
        assert ray.get(servers[2][0].served_digest.remote()) == digest(weights_for(43).items())
    finally:
        ray.get(trainer.close.remote())
        hub.stop()


def test_flip_together_needs_a_staged_pull():
    from tensorhub_verl.errors import ConfigError
    from tensorhub_verl.verl.config import TensorHubVerlConfig

    with pytest.raises(ConfigError, match="rollout_staging"):
        TensorHubVerlConfig.from_mapping({"flip_together": True})
    assert TensorHubVerlConfig.from_mapping({"flip_together": True, "rollout_staging": "gpu"}).flip_together


def test_a_replica_behind_the_fleet_stages_the_fleets_version_first():
    from tensorhub_verl.verl.fleet_flip import stage_target

    assert stage_target(served=1, committed=3, newest=4) == 3
    assert stage_target(served=None, committed=3, newest=4) == 3
    assert stage_target(served=3, committed=3, newest=4) == 4
    assert stage_target(served=None, committed=None, newest=4) == 4
