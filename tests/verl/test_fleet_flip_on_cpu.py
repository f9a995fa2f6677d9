"""The fleet flip (``tensorhub.flip_together``) in the rollout updater, through verl's own
``CheckpointEngineManager``: three replicas whose engine ranks are our real extension and holder (stub servers,
``fakes.py``), pulling real bytes into real staging through a real hub. What is checked, from the applies the
engines recorded: the fleet never serves three versions at once, a version whose check failed on one replica is
served by none, a version one replica could not read is still committed by the others, a replica that missed a version catches up to the fleet's before the fleet moves on, and the hub's
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


def test_a_pull_that_found_no_holder_blocks_nothing_and_a_digest_mismatch_blocks_everywhere(ray_local):
    """Replica 2's first pull of v42 finds no holder: it keeps v41 and reports v42 unavailable, which says nothing
    about v42, so the quorum commits it; replica 2 catches up to it on the next step. Replica 0's pull of v44
    reads bytes that fail their digests: v44 is blocked everywhere, though replica 1 alone is a quorum (0.3)."""
    import tensorhub_verl as th

    hub = th.start_hub(host="127.0.0.1", port=0)
    recorder = Recorder.remote()
    th_cfg = {"hub_address": hub.url, "keep_versions": 2, "staging": "cpu", "rollout_staging": "cpu",
              "chunk_mb": 1, "fetch_timeout_s": 180.0, "unpublish_timeout_s": 60.0, "apply_timeout_s": 180.0,
              "verify_digests": True, "min_replica_fraction": 0.3, "flip_together": True, "delta": "off"}
    trainer = TrainerStub.remote(th_cfg, job="unavailable")
    servers = {0: [StubServer.remote(0, recorder, corrupt=44)], 1: [StubServer.remote(1, recorder)],
               2: [StubServer.remote(2, recorder, unavailable_once=42)]}
    replicas = [FakeReplica(r, servers[r], recorder) for r in (0, 1, 2)]
    try:
        manager = _manager(th_cfg, StubActorGroup([trainer]), replicas)
        manager.update_weights(global_steps=41)
        m42 = manager.update_weights(global_steps=42)
        assert m42["tensorhub/flip_committed"] == 42.0 and m42["tensorhub/versions_served"] == 2.0, m42
        with th.connect(hub.url, "observer") as observer:
            status = observer.status()["flips"]["policy"]
        assert status["failed"] == [] and sorted(
            (r["serving"], r["pull"], r["outcome"]) for r in status["replicas"].values()) == [
            (41, 42, "unavailable"), (42, None, None), (42, None, None)], status
        m43 = manager.update_weights(global_steps=43)  # replica 2 catches up to v42, then the others flip to v43
        assert m43["tensorhub/flip_committed"] == 43.0 and m43["tensorhub/versions_served"] == 2.0, m43
        m44 = manager.update_weights(global_steps=44)
        assert m44["tensorhub/flip_committed"] == 43.0 and m44["tensorhub/flip_blocked"] == 1.0, m44
        assert m44["tensorhub/digest_mismatches"] == 1.0, m44
        served = _served_sets(ray.get(recorder.get.remote()), {0, 1, 2})
        assert all(len(s) <= 2 for _, s in served), served
        assert sorted(v for v, _ in served) == [41, 41, 41, 42, 42, 42, 43, 43, 43], served
        with th.connect(hub.url, "observer") as observer:
            status = observer.status()["flips"]["policy"]
        assert status["failed"] == [44] and sorted(r["serving"] for r in status["replicas"].values()) == [43] * 3
        assert sorted((r["pull"], r["outcome"]) for r in status["replicas"].values()
                      if r["outcome"] is not None) == [(44, "check_failed")], status
        for r in (0, 1, 2):
            assert ray.get(servers[r][0].served_digest.remote()) == digest(weights_for(43).items())
    finally:
        ray.get(trainer.close.remote())
        hub.stop()


def test_a_commit_the_trainer_dropped_is_caught_up_through_the_peers_that_serve_the_one_before(ray_local):
    """keep_versions=1: the trainer holds only its newest version. v53 is committed but its flips are held back (the
    straggler's catch-up failed), so nobody serves it; once the trainer drops it, the straggler catches up to what
    its peers serve and the others flip to the newest, instead of every replica pulling v53 from nobody."""
    import tensorhub_verl as th

    hub = th.start_hub(host="127.0.0.1", port=0)
    recorder = Recorder.remote()
    th_cfg = {"hub_address": hub.url, "keep_versions": 1, "staging": "cpu", "rollout_staging": "cpu",
              "chunk_mb": 1, "fetch_timeout_s": 120.0, "unpublish_timeout_s": 60.0, "apply_timeout_s": 120.0,
              "min_replica_fraction": 0.5, "flip_together": True}
    trainer = TrainerStub.remote(th_cfg, job="dropped")
    servers = {r: [StubServer.remote(r, recorder)] for r in (0, 1, 2)}
    replicas = [FakeReplica(r, servers[r], recorder) for r in (0, 1, 2)]
    try:
        manager = _manager(th_cfg, StubActorGroup([trainer]), replicas)
        manager.update_weights(global_steps=51)
        replicas[2].fail_abort = True  # replica 2 misses v52, then its catch-up to v52 fails too
        manager.update_weights(global_steps=52)
        m53 = manager.update_weights(global_steps=53)
        # v53 committed, but replicas 0 and 1 keep v52: flipping them would show {51, 52, 53}
        assert m53["tensorhub/flip_committed"] == 53.0 and m53["tensorhub/flip_blocked"] == 1.0, m53
        replicas[2].fail_abort = False
        m54 = manager.update_weights(global_steps=54)  # the trainer dropped v53: no holder of it is left
        assert m54["tensorhub/flip_committed"] == 54.0 and m54["tensorhub/versions_served"] == 2.0, m54
        m55 = manager.update_weights(global_steps=55)
        assert m55["tensorhub/flip_committed"] == 55.0 and m55["tensorhub/versions_served"] == 2.0, m55
        served = _served_sets(ray.get(recorder.get.remote()), {0, 1, 2})
        assert all(len(s) <= 2 for _, s in served), served
        assert sorted(v for v, _ in served) == [51, 51, 51, 52, 52, 52, 54, 54, 54, 55, 55], served
        with th.connect(hub.url, "observer") as observer:
            status = observer.status()["flips"]["policy"]
        assert sorted(r["serving"] for r in status["replicas"].values()) == [54, 55, 55] and status["failed"] == []
        assert ray.get(servers[2][0].served_digest.remote()) == digest(weights_for(54).items())
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


def test_a_replica_behind_a_commit_no_holder_has_stages_what_its_peers_serve_else_the_newest():
    from tensorhub_verl.verl.fleet_flip import stage_target

    # v3 is committed but gone (no holder); the peers serve v2, the trainer holds v4.
    assert stage_target(served=1, committed=3, newest=4, fetchable={1, 2, 4}, others=[2, 2]) == 2
    assert stage_target(served=None, committed=3, newest=4, fetchable={2, 4}, others=[2, None]) == 2
    # the replicas serving v2 have no peer ahead of them: the newest
    assert stage_target(served=2, committed=3, newest=4, fetchable={1, 2, 4}, others=[2, 1]) == 4
    # what the peers serve is gone too (the hub released it), or failed its check somewhere: the newest
    assert stage_target(served=1, committed=3, newest=4, fetchable={4}, others=[2]) == 4
    assert stage_target(served=1, committed=3, newest=4, fetchable={1, 2, 4}, others=[2], failed={2}) == 4
    # a commit some holder still has is staged as before
    assert stage_target(served=1, committed=3, newest=4, fetchable={1, 2, 3, 4}, others=[2]) == 3


def _plan(flips, serving, fail=()):
    """Runs flip_batches as flip_fleet does: each safe batch flips (except replicas in ``fail``), and the versions
    served are read again before the next; returns the batches and every set of versions served on the way."""
    from tensorhub_verl.verl.fleet_flip import flip_batches

    serving = list(serving)
    batches, seen = [], [{v for v in serving if v is not None}]
    for batch in flip_batches(flips, serving):
        batches.append(batch)
        if batch.safe:
            moved = [i for i in batch.replicas if i not in fail]
            # while a batch flips, some of its replicas may serve the old version and some the new one
            seen.append({v for j, v in enumerate(serving) if j not in moved and v is not None} |
                        ({batch.old, batch.target} if len(moved) > 1 else {batch.target}) - {None})
            for i in moved:
                serving[i] = batch.target
            seen.append({v for v in serving if v is not None})
    return batches, seen, serving


def test_a_failed_catch_up_holds_back_the_flip_that_would_show_a_third_version():
    # r2 serves 1 and catches up to 2 (wave 1); r0 and r1 flip 2 -> 3 (wave 2). The catch-up fails.
    batches, seen, serving = _plan([(0, 2, 3), (1, 2, 3), (2, 1, 2)], [2, 2, 1], fail={2})
    assert batches[0].replicas == (2,) and batches[0].safe  # catch-ups first
    assert all(not b.safe for b in batches[1:]) and {i for b in batches[1:] for i in b.replicas} == {0, 1}
    assert serving == [2, 2, 1] and all(len(s) <= 2 for s in seen), seen


def test_replicas_flip_oldest_first_and_one_by_one_where_together_would_show_three_versions():
    # Everyone flips to the commit 3; r2 is still on 1 (a catch-up that failed before): r2 moves first and alone.
    batches, seen, serving = _plan([(0, 2, 3), (1, 2, 3), (2, 2, 3)], [2, 2, 1])
    assert [(b.replicas, b.safe) for b in batches] == [((2,), True), ((0, 1), True)]
    assert serving == [3, 3, 3] and all(len(s) <= 2 for s in seen), seen
    # With no straggler the whole wave flips at once.
    batches, _, serving = _plan([(0, 2, 4), (1, 2, 4), (2, 2, 4)], [3, 3, 3])
    assert [(b.replicas, b.safe) for b in batches] == [((0, 1, 2), True)] and serving == [4, 4, 4]
