"""verl's own trainer, for real, through TensorHub: ``python -m verl.trainer.main_ppo`` on CPU.

No fakes: Ray, FSDP2 trainer ranks over gloo, two vLLM replicas (vLLM's CPU build, float32), the hub as a
Ray actor, NIXL/UCX transfers; the tiny model and the toy task are built locally (``tensorhub_dev.demo``).
Each step's metrics come from verl's own "file" logger.
"""

from __future__ import annotations

import json
import math

import pytest

from tensorhub_dev.demo.grpo import run
from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tensorhub_verl.bench.tiny_model import float32_bytes
from tests.requires import require

require("vllm", reason="the rollout replicas are vLLM engines (CPU build)")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ON_POLICY_GAP = 0.02
"""Largest |p_rollout - p_trainer| on a step whose rollouts used the trainer's current weights. Measured
~2e-4 (float32 vLLM vs eager HF); vLLM's dummy start-up weights, or a missed update, give ~0.5."""


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_task(tmp_path_factory.mktemp("task"))


def _run(task, tmp_path, steps: int, dtype_overrides: tuple[str, ...] = (), **kw
         ) -> tuple[dict, list[tuple[int, dict]]]:
    job = TinyJob(task=task, out_dir=tmp_path, steps=steps, replicas=2,
                  extra=("tensorhub.verify_digests=true", *dtype_overrides), **kw)
    result = run(job, quiet=True, timeout_s=800)
    return result, read_metrics(job.metrics_file)


def test_separate_async_steps_sync_every_replica_through_tensorhub(task, tmp_path):
    """Two FSDP2 trainer ranks holding bf16 weights, each publishing its own shard cast to the rollouts' float32
    (vLLM's CPU build serves float32 only: the cast is tested in that direction); the replicas' engines hold what
    they serve, and no replica copies the old version in its pause while the trainer's ranks hold it.
    Deltas (``auto``): from the second step on each trainer rank also publishes the delta of its rows from the
    version before, and every replica applies it in place, checked against the version's digests. At a learning
    rate of 1e-5 a step moves a small part of the bf16 elements, and the delta each replica reads is a small part
    of the float32 version (the toy job's own rate moves nearly all of them, where ``auto`` rightly sends full
    versions)."""
    result, metrics = _run(task, tmp_path, steps=3, trainer_ranks=2,
                           dtype_overrides=("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
                                            "actor_rollout_ref.actor.optim.lr=1e-5", "tensorhub.delta=auto"))
    assert result["demo"] == "ok"
    assert [step for step, _ in metrics] == [1, 2, 3]
    fp32_bytes = float32_bytes(task.model_dir)
    on_policy_steps = 0
    for step, m in metrics:
        # Published in the rollouts' dtype: float32 bytes from bf16 parameters, read once by each replica.
        assert m["tensorhub/publish_bytes"] >= fp32_bytes
        # verl syncs version 0 (the initial weights) before step 1, in full: every step's version is a delta,
        # every rank's part of it applied by both replicas, and nothing else moved.
        assert m["tensorhub/publish_delta_bytes"] > 0 and m["tensorhub/delta_replicas"] == 2, m
        assert m["tensorhub/bytes"] == m["tensorhub/delta_bytes"] == 2 * m["tensorhub/publish_delta_bytes"], m
        assert m["tensorhub/delta_fallbacks"] == 0 and 0 < m["tensorhub/changed_fraction"] < 0.5, m
        assert m["tensorhub/publish_delta_bytes"] < m["tensorhub/publish_bytes"] / 4, m  # a delta, not the version
        # The trainer's complete shard group holds the version the replicas stop serving: no copy in the pause.
        assert m["tensorhub/preserved_bytes"] == 0
        # Every replica pulled and applied this step's version: verl's step counter is the version.
        assert m["tensorhub/version"] == step
        assert m["tensorhub/replicas_updated"] == 2 and m["tensorhub/version_lag"] == 0
        # Each rollout worker's pulled bytes have the digest of what the trainer published.
        assert m["tensorhub/digests_checked"] == 2 and m["tensorhub/digest_mismatches"] == 0
        assert m["tensorhub/bytes"] > 0 and m["tensorhub/stall_s"] > 0
        # The second replica read from the first, not only from the trainer.
        assert m["tensorhub/bytes_from_peers"] > 0
        # No gather: both trainer ranks published their rows and both served them. This model is one 0.76 MB
        # chunk per rank, so of the 3 chunk reads that reach the trainer (the other goes to the peer replica)
        # one rank serves 2: measured 0.667; with many chunks per rank the share tends to 1/2.
        assert m["tensorhub/publish_ranks"] == 2 and m["tensorhub/trainer_sources"] == 2
        assert m["tensorhub/trainer_share_max"] <= 0.7
        assert math.isfinite(m["critic/score/mean"])
        if m.get("training/off_policy/trajectory_staleness/max") == 0:
            on_policy_steps += 1
            # vLLM started from dummy weights: only TensorHub's sync makes its log-probs match the trainer's.
            assert m["training/rollout_probs_diff_max"] < ON_POLICY_GAP
    assert on_policy_steps >= 1
    assert [s["step"] for s in result["steps"]] == [1, 2, 3]
    assert result["plot"].endswith(".png")


@pytest.mark.slow  # ~4 min
def test_ppo_with_a_critic_syncs_through_tensorhub(task, tmp_path):
    """PPO (GAE advantages, a value model trained beside the actor: +tensorhub_cpu=tiny_ppo). verl 0.9.1
    cannot load the critic without flash-attn; patched, the critic trains and the actor's versions reach both
    replicas. Short versions in the default suite: the sync path is the 3-step separate_async test above
    (test_separate_async_steps_sync_every_replica_through_tensorhub), the critic's patched load is
    tests/verl/test_patch_guards_on_cpu.py::test_on_the_cpu_platform_the_critic_honours_the_configured_attention."""
    result, metrics = _run(task, tmp_path, steps=3, algorithm="ppo")
    assert result["demo"] == "ok"
    assert [step for step, _ in metrics] == [1, 2, 3]
    for step, m in metrics:
        # the critic trained on this step's batch
        assert math.isfinite(m["critic/vf_loss"]) and math.isfinite(m["critic/vpred_mean"])
        assert m["tensorhub/version"] == step
        assert m["tensorhub/replicas_updated"] == 2 and m["tensorhub/version_lag"] == 0
        assert m["tensorhub/digests_checked"] == 2 and m["tensorhub/digest_mismatches"] == 0
        assert m["tensorhub/bytes"] > 0
        if m.get("training/off_policy/trajectory_staleness/max") == 0:
            assert m["training/rollout_probs_diff_max"] < ON_POLICY_GAP


@pytest.mark.slow  # ~3 min; the 3-step PPO run is the test above
def test_ppo_value_loss_falls_over_a_longer_run(task, tmp_path):
    """The critic learns the returns of the policy the replicas serve: its value loss falls well below the
    untrained value head's of the first steps (figures in docs/recipes.md)."""
    _, metrics = _run(task, tmp_path, steps=16, algorithm="ppo")
    assert [step for step, _ in metrics] == list(range(1, 17))
    losses = [m["critic/vf_loss"] for _, m in metrics]
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.5 * first, f"the critic's value loss did not fall: {losses}"
    assert all(m["tensorhub/digest_mismatches"] == 0 and m["tensorhub/replicas_updated"] == 2 for _, m in metrics)


@pytest.mark.slow
def test_the_reward_rises_over_a_longer_run(task, tmp_path):
    result, _ = _run(task, tmp_path, steps=24)
    rewards = [s["reward_mean"] for s in result["steps"]]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.05, f"reward did not rise: {rewards}"


@pytest.mark.slow  # ~3 min; the default suite's hub-of-regions checks are test_engine_transfer / test_hub_actor's
def test_a_job_on_a_hub_of_regions_syncs_every_replica(task, tmp_path):
    """``tensorhub.hub_regions=2``: the job's hub actor serves regions dc0/r0 and dc0/r1 (relays on), the trainer
    publishes to both, and every replica, connected to its region through ``connect``, pulls each step's version
    with the trainer's digests."""
    result, metrics = _run(task, tmp_path, steps=2,
                           dtype_overrides=("tensorhub.hub_regions=2", "tensorhub.relay_fanout=1"))
    assert result["demo"] == "ok" and [step for step, _ in metrics] == [1, 2]
    for step, m in metrics:
        assert m["tensorhub/version"] == step and m["tensorhub/replicas_updated"] == 2
        assert m["tensorhub/digests_checked"] == 2 and m["tensorhub/digest_mismatches"] == 0


@pytest.mark.slow  # ~3 min; the default suite's real loop is the separate_async test above
def test_fully_async_syncs_through_tensorhub(task, tmp_path):
    """verl's fully async policy (its own entry point, rollouter and trainer as separate actors)."""
    result, metrics = _run(task, tmp_path, steps=3, trainer_mode="fully_async")
    synced = [m for _, m in metrics if "tensorhub/version" in m]
    assert len(synced) >= 2, [sorted(m) for _, m in metrics]
    for m in synced:
        assert m["tensorhub/replicas_updated"] == 2 and m["tensorhub/version_lag"] == 0
        assert m["tensorhub/digests_checked"] == 2 and m["tensorhub/digest_mismatches"] == 0
        assert m["tensorhub/bytes_from_peers"] > 0
    assert all(math.isfinite(s["reward_mean"]) for s in result["steps"])


def _audit(directory, kind: str) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob(f"{kind}*.jsonl")) for line in f.read_text().splitlines()]


@pytest.mark.slow  # ~3 min: one fully_async run with partial rollouts, every assertion of version truth on it
def test_fully_async_samples_carry_the_versions_their_engines_recorded(task, tmp_path):
    """Partial rollouts on: a sync aborts the requests in flight and verl resumes them on the new version, so a
    response straddles two versions. Every rollout server writes what its engine recorded per request, every
    agent-loop client what its sample carries (``tensorhub.version_audit_dir``). The default suite's shorter
    versions: tests/vllm/test_version_spans_engine.py (a real engine, an apply mid-generation) and
    tests/verl/test_version_labels_on_cpu.py (verl's resume loop and gate, patched)."""
    from tensorhub_verl.vllm.version_spans import concat, from_wire, label

    audit = tmp_path / "audit"
    result, metrics = _run(task, tmp_path, steps=4, trainer_mode="fully_async", dtype_overrides=(
        f"tensorhub.version_audit_dir={audit}", "async_training.partial_rollout=true",
        "async_training.staleness_threshold=3", "data.max_response_length=128",
        "actor_rollout_ref.rollout.ignore_eos=true"))  # long generations: a sync finds requests in flight
    assert result["demo"] == "ok"
    servers, clients = _audit(audit, "server-replica"), _audit(audit, "client")
    assert servers and clients
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    applied = {int(r["data"]["tensorhub/version"]) for r in rows if "tensorhub/version" in r.get("data", {})}
    for rec in servers:
        spans = from_wire(rec["spans"])
        # the engine's spans cover the response's tokens, in order, each from a version the updater applied
        assert spans[0].start == 0 and spans[-1].end == rec["tokens"], rec
        assert all(a.end == b.start for a, b in zip(spans, spans[1:])), rec
        assert {s.version for s in spans} <= applied, (rec, applied)
        assert (rec["min"], rec["max"]) == label(spans), rec
    engine_records = [(json.dumps(r["spans"]), r["tokens"]) for r in servers]
    straddles = []
    for rec in clients:
        parts = [(from_wire(s), n) for s, n in rec["parts"]]
        spans = concat([p for p, _ in parts], [n for _, n in parts])
        # the sample's label is the spans its replica's engine recorded, part by part, and nothing else
        assert from_wire(rec["spans"]) == spans and rec["tokens"] == sum(n for _, n in parts), rec
        assert (rec["min"], rec["max"]) == label(spans), rec
        for p, n in parts:
            assert (json.dumps([list(s.as_list()) for s in p]), n) in engine_records, rec
        if len({s.version for s in spans}) > 1:
            straddles.append(rec)
    # A response aborted by a sync and resumed on the next version: two spans, min < max, split where the
    # first part ended.
    assert straddles, "no response straddled a sync"
    for rec in straddles:
        spans = from_wire(rec["spans"])
        assert rec["min"] < rec["max"] and rec["min"] == spans[0].version and rec["max"] == spans[-1].version
    # verl's trainer saw those labels: its partial-rollout metric counts samples whose min and max differ.
    assert any(m.get("fully_async/partial/total_partial_num", 0) > 0 for _, m in metrics), \
        [sorted(k for k in m if "partial" in k) for _, m in metrics]
