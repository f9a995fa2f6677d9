"""``HubState.must_preserve`` with row shards, without HTTP or processes (fake clock): a complete, live, non-spot
row-shard group (an FSDP trainer's ranks) is a reliable copy, so a rollout unpublishing that version copies
nothing; anything less is no copy."""

from __future__ import annotations

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.config import HubConfig
from tensorhub_verl.ros.hub.state import HubState
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec, shard_bytes
from tensorhub_verl.ros.wire.convert import manifest_to_msg

RANKS = 2
TIMEOUT_S = 5.0


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


ENGINE_LAYOUT = "vllm/qwen2/tp1/rank0"


def _manifest(version: int, row_shards: int = RANKS, layout: str = "hf") -> Manifest:
    return Manifest("policy", version, layout, (TensorSpec("w", (2048,), "float32", 8192),
                                                TensorSpec("s", (), "int64", 8)), 4096, row_shards=row_shards)


def _register(state, worker, spot=False):
    state.register_worker(msg.RegisterWorker(worker=worker, location=msg.LocationMsg(), spot=spot,
                                             agent_name=f"{worker}-a", agent_metadata_b64="AAAA"))


def _publish_rank(state, version, rank, worker=None, group="trainer"):
    manifest = _manifest(version)
    regions = []
    for spec in manifest.tensors:
        start, stop = shard_bytes(spec, rank, RANKS)
        regions.append(msg.RegionMsg(addr=1 << 20, offset=start, nbytes=stop - start))
    worker = worker or f"actor-{rank}"
    state.publish(msg.Publish(worker=worker, holder=worker, manifest=manifest_to_msg(manifest), regions=regions,
                              shard_group=group, shard_count=RANKS, shard_rank=rank))


def _publish_full(state, version, worker, layout=ENGINE_LAYOUT):
    """A rollout engine holding the version whole, in its own layout."""
    state.publish(msg.Publish(worker=worker, holder=worker, manifest=manifest_to_msg(_manifest(version, 1, layout)),
                              regions=[msg.RegionMsg(addr=2 << 20), msg.RegionMsg(addr=3 << 20)]))


def _ask(state, version=1, holder="rollout", layout=ENGINE_LAYOUT):
    return state.must_preserve(msg.PreserveQuery(holder=holder, model="policy", version=version, layout=layout))


def _trainer_and_rollout(spot_ranks=(), ranks=(0, 1)):
    """Trainer ranks publish v1 (row shards), a rollout holds v1 whole: the rollout is about to unpublish it."""
    clock = Clock()
    state = HubState(HubConfig(worker_timeout_s=TIMEOUT_S, keep_versions=2, require_digests=False),
                     clock=clock)
    for rank in range(RANKS):
        _register(state, f"actor-{rank}", spot=rank in spot_ranks)
    _register(state, "rollout")
    for rank in ranks:
        _publish_rank(state, 1, rank)
    _publish_full(state, 1, "rollout")
    return state, clock


def test_a_complete_live_trainer_shard_group_is_a_reliable_copy():
    state, _ = _trainer_and_rollout()
    answer = _ask(state)
    assert not answer.must_preserve
    assert answer.reason == "row shards actor-0, actor-1 together hold a complete copy"
    # A rank itself still never preserves its rows.
    rank = _ask(state, holder="actor-0", layout="hf")
    assert "row shard" in rank.reason and not rank.must_preserve


def test_an_incomplete_group_is_no_copy():
    state, _ = _trainer_and_rollout(ranks=(0,))  # rank 1 never published: the group stays pending
    assert _ask(state).must_preserve


def test_a_group_missing_a_rank_that_unpublished_is_no_copy():
    state, _ = _trainer_and_rollout()
    state.unpublish(msg.Unpublish(worker="actor-1", holder="actor-1", model="policy", version=1, layout="hf",
                                  wait_s=0.0))
    assert _ask(state).must_preserve


def test_a_silent_rank_is_no_copy_even_before_the_sweep_drops_it():
    state, clock = _trainer_and_rollout()
    clock.now += TIMEOUT_S - 1
    state.heartbeat("actor-0")
    state.heartbeat("rollout")
    assert not _ask(state).must_preserve  # both ranks heard within the timeout
    clock.now += 2  # actor-1 silent for TIMEOUT_S + 1; not swept yet
    state.heartbeat("rollout")
    assert _ask(state).must_preserve
    state.sweep()  # dropped now: still no copy
    assert _ask(state).must_preserve


def test_spot_ranks_are_no_reliable_copy():
    state, _ = _trainer_and_rollout(spot_ranks=(1,))
    assert _ask(state).must_preserve


def test_a_stand_in_rank_completes_the_group_again():
    state, _ = _trainer_and_rollout()
    state.unpublish(msg.Unpublish(worker="actor-1", holder="actor-1", model="policy", version=1, layout="hf",
                                  wait_s=0.0))
    _register(state, "actor-1b")
    _publish_rank(state, 1, 1, worker="actor-1b")
    answer = _ask(state)
    assert not answer.must_preserve and answer.reason == "row shards actor-0, actor-1b together hold a complete copy"


def test_outside_the_retention_window_nothing_is_preserved_anyway():
    state, _ = _trainer_and_rollout(ranks=(0,))
    for version in (2, 3):
        _publish_full(state, version, "rollout")
    assert _ask(state).reason == "outside the retention window"
