"""The pure rules behind the hub's edge: the hub's proof, a publish's chunk count by runs of ranks, the caps derived
from the open-files limit, and the pending budgets' defaults. No processes."""

import random

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.http_guard import ConnectionLimits, listen_backlog, untrusted_cap
from tensorhub_verl.ros.hub.limits import HubLimits, rank_chunk_runs
from tensorhub_verl.ros.wire import hub_proof
from tensorhub_verl.ros.wire.manifest import TensorSpec, rank_chunk_counts


def test_only_the_tokens_holder_answers_a_nonce():
    nonce = hub_proof.new_nonce()
    assert hub_proof.is_nonce(nonce) and nonce != hub_proof.new_nonce()
    answer = hub_proof.proof("the-token", nonce, "abc123")
    assert hub_proof.proven("the-token", nonce, "abc123", answer)
    assert not hub_proof.proven("another-token", nonce, "abc123", answer)
    assert not hub_proof.proven("the-token", hub_proof.new_nonce(), "abc123", answer)  # an old answer
    assert not hub_proof.proven("the-token", nonce, "other", answer)  # another instance's
    for presented in (None, 0, "", "00", answer.upper() + "x"):
        assert not hub_proof.proven("the-token", nonce, "abc123", presented)
    odd = "bad instance!"
    assert not hub_proof.proven("the-token", nonce, odd, hub_proof.proof("the-token", nonce, odd))
    for text in ("", "0" * 31, "0" * 33, "g" * 32, "A" * 32):
        assert not hub_proof.is_nonce(text)


def test_chunk_counts_by_runs_of_ranks_equal_the_per_rank_count():
    rng = random.Random(7)
    for _ in range(2000):
        ranks = rng.randint(1, 40)
        specs = []
        for i in range(rng.randint(1, 5)):
            shape = tuple(rng.randint(0, 50) for _ in range(rng.choice([0, 1, 2])))
            n = 1
            for d in shape:
                n *= d
            specs.append(TensorSpec(f"t{i}", shape, "float32", 4 * n))
        chunk_bytes = rng.choice([4, 8, 64, 4096])
        runs = rank_chunk_runs(specs, chunk_bytes, ranks)
        assert [per for count, per in runs for _ in range(count)] == rank_chunk_counts(specs, chunk_bytes, ranks)


def test_a_huge_row_shard_count_is_counted_without_a_loop_over_ranks():
    specs = [TensorSpec(f"t{i}", (65536, 32), "float32", 65536 * 128) for i in range(32)]
    assert rank_chunk_runs(specs, 4096, 65536) == [(65536, 1)]
    assert rank_chunk_runs([TensorSpec("t", (3,), "float32", 12)], 4096, 65536) == [(3, 1), (65533, 0)]


def test_the_untrusted_cap_leaves_token_holders_half_of_the_descriptors():
    assert listen_backlog(1024) == 128 and untrusted_cap(1024) == (1024 - 64 - 128) // 2
    assert listen_backlog(1 << 20) == 2048 and untrusted_cap(64) == 16
    with pytest.raises(ConfigError, match="max_untrusted"):
        ConnectionLimits(max_untrusted=0)


def test_pending_budgets_per_job_and_hub_follow_the_workers_unless_set():
    limits = HubLimits(max_pending_pieces_per_worker=100)
    assert (limits.max_pending_pieces_per_job, limits.max_pending_pieces) == (200, 800)
    limits = HubLimits(max_pending_pieces_per_job=50, max_pending_pieces=60)
    assert (limits.max_pending_pieces_per_job, limits.max_pending_pieces) == (50, 60)
    with pytest.raises(ConfigError, match="max_pending_pieces"):
        HubLimits(max_pending_pieces=0)
