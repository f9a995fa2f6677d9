"""The TensorHub updater's sequence, driven through verl's own ``CheckpointEngineManager`` on CPU.

Each replica node is a stub server actor whose engine rank is our real extension and ``EngineHolder`` over
plain tensors, pulling real bytes through a real hub; ``CheckpointEngineManager.update_weights`` (patched)
routes to the updater. The real loop with verl's trainer and vLLM replicas is ``test_verl_trainer_on_cpu``.
What is checked here: each replica pauses only around its own apply; no KV-cache release or process-group
build; the bytes applied are the bytes published; the engines' parameters are the only copy; replicas
added between steps just pull.
"""

from __future__ import annotations

import pytest
import ray

from tests.verl.fakes import FakeReplica, Recorder, StubActorGroup, StubServer, TrainerStub, digest, weights_for
from tensorhub_verl.vllm.results import HolderStatus

pytestmark = pytest.mark.timeout(240)


def _th(hub_url, **extra):
    return {"hub_address": hub_url, "keep_versions": 2, "staging": "cpu", "chunk_mb": 1,
            "fetch_timeout_s": 180.0, "unpublish_timeout_s": 60.0, "apply_timeout_s": 180.0,
            "verify_digests": True, **extra}


def _servers(n, replica_rank, recorder):
    return [StubServer.remote(replica_rank, recorder) for _ in range(n)]


def _manager(th_cfg, actor_group, replicas):
    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.workers.config import CheckpointEngineConfig

    import tensorhub_verl.verl.checkpoint_engine  # noqa: F401  registers the backend, applies the patch

    config = CheckpointEngineConfig(backend="tensorhub", engine_kwargs={"tensorhub": th_cfg},
                                    custom_backend_module="tensorhub_verl.verl.checkpoint_engine")
    return CheckpointEngineManager(config=config, actor_wg=actor_group, replicas=replicas)


@pytest.fixture(scope="module")
def rig(ray_local):
    """One hub, one trainer and three replica nodes for the module: starting a process that imports verl
    costs ~5 s of CPU here, so tests reuse them and use disjoint version numbers."""
    import tensorhub_verl as th

    hub = th.start_hub(host="127.0.0.1", port=0)
    recorder = Recorder.remote()
    th_cfg = _th(hub.url)
    trainer = TrainerStub.remote(th_cfg, job="upd")
    servers = {0: _servers(2, 0, recorder), 1: _servers(1, 1, recorder)}
    yield {"hub": hub, "recorder": recorder, "th": th_cfg, "trainer": trainer, "servers": servers}
    ray.get(trainer.close.remote())
    hub.stop()


def _by_replica(events):
    out = {}
    for t, who, what, detail in events:
        out.setdefault(who, []).append((t, what, detail))
    return out


def test_each_replica_pauses_only_for_its_own_apply_and_gets_the_published_bytes(rig):
    replicas = [FakeReplica(r, rig["servers"][r], rig["recorder"]) for r in (0, 1)]
    manager = _manager(rig["th"], StubActorGroup([rig["trainer"]]), replicas)

    metrics = {version: manager.update_weights(global_steps=version) for version in (1, 2, 3)}

    events = _by_replica(ray.get(rig["recorder"].get.remote()))
    for r, replica in enumerate(replicas):
        # verl's default sequence would have released the KV cache and built a group; ours never does.
        assert replica.calls == ["abort", "resume"] * 3, replica.calls
        seq = [what for _, what, _ in events[r]]
        assert _is_interleaved_apply(seq, len(replica.servers)), seq
        applied = [d for _, what, d in events[r] if what == "apply_end"]
        n = len(replica.servers)
        assert [v for v, _ in applied] == [1] * n + [2] * n + [3] * n
        for v, got in applied:
            assert got == digest(weights_for(v).items()), f"replica {r} applied wrong bytes for v{v}"

    nbytes = sum(t.numel() * t.element_size() for t in weights_for(1).values())
    for version, m in metrics.items():
        assert m["tensorhub/bytes"] == 3 * nbytes  # three rollout workers pulled the whole version
        assert m["tensorhub/version_lag"] == 0.0
        assert m["tensorhub/replicas_updated"] == 2.0
        assert 0.0 <= m["tensorhub/sources_peer_fraction"] <= 1.0
        assert m["tensorhub/stall_s"] >= m["tensorhub/pull_s"] > 0.0  # rollout_staging='none': pull inside
        assert m["tensorhub/digests_checked"] == 3.0 and m["tensorhub/digest_mismatches"] == 0.0
        assert m["tensorhub/publish_bytes"] == nbytes
    # The trainer keeps exactly keep_versions versions.
    assert ray.get(rig["trainer"].held_versions.remote()) == [2, 3]
    # The engines' parameters are the holders and the only copy: no staging, no copy in a worker.
    for servers in rig["servers"].values():
        for status in ray.get([s.collective_rpc.remote("th_status") for s in servers]):
            rank = HolderStatus.from_wire(status[0])
            assert rank.served == 3 and rank.extra_bytes == 0, status


def _is_interleaved_apply(seq, n_workers):
    """Workers of one replica apply concurrently: begin/end may interleave, but all inside abort..resume."""
    size = 2 + 2 * n_workers
    steps = [seq[i:i + size] for i in range(0, len(seq), size)]
    return bool(steps) and all(s[0] == "abort" and s[-1] == "resume" and sorted(s[1:-1]) ==
                               sorted(["apply_begin"] * n_workers + ["apply_end"] * n_workers) for s in steps)


def test_replica_added_between_steps_pulls_without_a_group_rebuild(rig):
    first = FakeReplica(1, rig["servers"][1], rig["recorder"])
    manager = _manager(rig["th"], StubActorGroup([rig["trainer"]]), [first])
    manager.update_weights(global_steps=11)

    late = FakeReplica(0, rig["servers"][0], rig["recorder"])
    manager.add_replicas([late])
    m2 = manager.update_weights(global_steps=12)
    assert m2["tensorhub/replicas_updated"] == 2.0
    assert late.calls == ["abort", "resume"]

    manager.remove_replicas([first])
    m3 = manager.update_weights(global_steps=13)
    assert m3["tensorhub/replicas_updated"] == 1.0 and first.calls == ["abort", "resume"] * 2
    applied = [d for _, who, what, d in ray.get(rig["recorder"].get.remote())
               if who == 0 and what == "apply_end" and d[0] > 10]
    assert [v for v, _ in applied] == [12, 12, 13, 13]
    assert applied[-1][1] == digest(weights_for(13).items())


def test_a_failing_replica_keeps_its_version_and_is_reported_as_lag(rig):
    from tensorhub_verl.errors import TransferFailed

    th_cfg = dict(rig["th"], min_replica_fraction=0.5)
    good = FakeReplica(0, rig["servers"][0], rig["recorder"])
    flaky = FakeReplica(1, rig["servers"][1], rig["recorder"])
    manager = _manager(th_cfg, StubActorGroup([rig["trainer"]]), [good, flaky])
    manager.update_weights(global_steps=21)

    flaky.fail_abort = True
    m2 = manager.update_weights(global_steps=22)
    assert m2["tensorhub/version_lag"] == 1.0 and m2["tensorhub/replicas_updated"] == 1.0
    assert flaky.calls[-2:] == ["abort", "resume"]  # resumed even though its pause failed

    # With every replica required, the same failure fails the step (after resuming everyone).
    manager._tensorhub_updater.config.min_replica_fraction = 1.0
    with pytest.raises(TransferFailed, match="1/2 replicas applied version 23"):
        manager.update_weights(global_steps=23)
    assert good.calls[-2:] == ["abort", "resume"]


def test_a_replica_beyond_max_version_lag_is_held_until_it_catches_up(rig):
    th_cfg = dict(rig["th"], min_replica_fraction=0.5, max_version_lag=0)
    good = FakeReplica(0, rig["servers"][0], rig["recorder"])
    lagging = FakeReplica(1, rig["servers"][1], rig["recorder"])
    manager = _manager(th_cfg, StubActorGroup([rig["trainer"]]), [good, lagging])
    holds = lambda r: [h for s in rig["servers"][r] for h in ray.get(s.hold_calls.remote())]  # noqa: E731
    m1 = manager.update_weights(global_steps=31)
    assert m1["tensorhub/replicas_held"] == 0.0 and holds(1) == [] and holds(0) == []

    lagging.fail_abort = True  # delayed on purpose: it misses v32 and keeps serving v31
    m2 = manager.update_weights(global_steps=32)
    assert m2["tensorhub/version_lag/replica_1"] == 1.0 and m2["tensorhub/version_lag/replica_0"] == 0.0
    assert m2["tensorhub/replicas_held"] == 1.0 and holds(1) == [True] and holds(0) == []

    lagging.fail_abort = False  # it applies v33: released, and the requests that met its gate are counted
    m3 = manager.update_weights(global_steps=33)
    assert m3["tensorhub/version_lag/replica_1"] == 0.0 and m3["tensorhub/replicas_held"] == 0.0
    assert holds(1) == [True, False] and m3["tensorhub/requests_held_back"] == 0.0
    assert m2["tensorhub/requests_held_back"] == 2.0  # the stub reports 2 held back when asked to hold

    # Every replica misses v34: all are behind, but those serving the fleet's newest version are never held
    # (holding them would stop all generation, and the trainer with it).
    good.fail_abort = lagging.fail_abort = True
    from tensorhub_verl.errors import TransferFailed

    with pytest.raises(TransferFailed, match="only 0/2 replicas applied version 34"):
        manager.update_weights(global_steps=34)
    assert holds(0) == [] and holds(1) == [True, False]


def test_other_backends_keep_verls_sequence(monkeypatch):
    """The patch routes only backend == 'tensorhub'; verl's own path still runs for the others."""
    from verl.checkpoint_engine import base
    from verl.utils.ray_utils import auto_await

    from tensorhub_verl.verl.patches import verl_0_9_1_manager_update_weights as patch

    called = []

    async def verls_own(self, global_steps=None):
        called.append((self.backend, global_steps))
        return {"verl": 1.0}

    # A fresh, unpatched method whose body we control; monkeypatch restores the real one afterwards.
    monkeypatch.setattr(base.CheckpointEngineManager, "update_weights", auto_await(verls_own))
    assert patch.apply(base) is True
    assert patch.apply(base) is False  # idempotent: a second import does not wrap twice
    manager = base.CheckpointEngineManager.__new__(base.CheckpointEngineManager)
    manager.backend = "nccl"
    assert manager.update_weights(global_steps=5) == {"verl": 1.0}
    assert called == [("nccl", 5)]


def test_after_the_first_version_every_replica_applies_the_delta_the_trainer_published_beside_it(rig):
    """tensorhub.delta=auto (the default): versions that move few elements travel as deltas, checked against the
    trainer's digests; the first one a replica sees (no delta from what it serves) travels in full."""
    from tests.verl.fakes import STEPPED_FROM, stepped_weights

    replicas = [FakeReplica(r, rig["servers"][r], rig["recorder"]) for r in (0, 1)]
    manager = _manager(rig["th"], StubActorGroup([rig["trainer"]]), replicas)
    first, *later = (STEPPED_FROM + 1, STEPPED_FROM + 2, STEPPED_FROM + 3)
    nbytes = sum(t.numel() * t.element_size() for t in stepped_weights(first).values())

    m = manager.update_weights(global_steps=first)
    assert m["tensorhub/delta_bytes"] == 0 and m["tensorhub/bytes"] == 3 * nbytes  # no delta from what they serve
    for version in later:
        m = manager.update_weights(global_steps=version)
        assert 0 < m["tensorhub/publish_delta_bytes"] < nbytes / 10
        # Every rank of both replicas read only the delta, applied it and matched the trainer's digests.
        assert m["tensorhub/delta_replicas"] == 2 and m["tensorhub/delta_fallbacks"] == 0
        assert m["tensorhub/delta_full_bytes"] == 0  # nothing read in full beside the deltas
        assert m["tensorhub/bytes"] == m["tensorhub/delta_bytes"] == 3 * m["tensorhub/publish_delta_bytes"]
        assert 0 < m["tensorhub/changed_fraction"] < 0.05
        assert m["tensorhub/digests_checked"] == 3 and m["tensorhub/digest_mismatches"] == 0
    applied = [d for _, who, what, d in ray.get(rig["recorder"].get.remote())
               if what == "apply_end" and d[0] == later[-1]]
    assert len(applied) == 3 and all(got == digest(stepped_weights(later[-1]).items()) for _, got in applied)
