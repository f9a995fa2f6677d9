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
from tensorhub_dev.demo.job import PROMPTS_PER_STEP, TinyJob
from tensorhub_dev.demo.progress import read_metrics
from tensorhub_dev.demo.task import build_task
from tensorhub_verl.bench.tiny_model import float32_bytes
from tests.requires import require

require("vllm", reason="the rollout replicas are vLLM engines (CPU build)")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GROUP_SIZE = 8
"""actor_rollout_ref.rollout.n of the preset: responses per prompt."""
ON_POLICY_GAP = 0.02
"""Largest |p_rollout - p_trainer| on a step whose rollouts used the trainer's current weights. Measured
~2e-4 (float32 vLLM vs eager HF); vLLM's dummy start-up weights, or a missed update, give ~0.5."""


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_task(tmp_path_factory.mktemp("task"))


def _run(task, tmp_path, steps: int, dtype_overrides: tuple[str, ...] = (), replicas: int = 2, **kw
         ) -> tuple[dict, list[tuple[int, dict]]]:
    job = TinyJob(task=task, out_dir=tmp_path, steps=steps, replicas=replicas,
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
    audit = tmp_path / "audit"
    result, metrics = _run(task, tmp_path, steps=3, trainer_ranks=2,
                           dtype_overrides=("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
                                            "actor_rollout_ref.actor.optim.lr=1e-5", "tensorhub.delta=auto",
                                            f"tensorhub.version_audit_dir={audit}"))
    assert result["demo"] == "ok"
    assert [step for step, _ in metrics] == [1, 2, 3]
    fp32_bytes = float32_bytes(task.model_dir)
    on_policy_steps = 0
    for step, m in metrics:
        # Published in the rollouts' dtype: float32 bytes from bf16 parameters, read once by each replica. Exactly
        # the checkpoint's float32 bytes: the model ties its head to its embedding, and the version carries
        # that tensor once, as the checkpoint does (not lm_head.weight beside it).
        assert m["tensorhub/publish_bytes"] == fp32_bytes
        # verl syncs version 0 (the initial weights) before step 1, in full: every step's version is a delta,
        # every rank's part of it applied by both replicas, and nothing else moved.
        assert m["tensorhub/publish_delta_bytes"] > 0 and m["tensorhub/delta_replicas"] == 2, m
        assert m["tensorhub/bytes"] == m["tensorhub/delta_bytes"] == 2 * m["tensorhub/publish_delta_bytes"], m
        assert m["tensorhub/delta_fallbacks"] == 0 and 0 < m["tensorhub/changed_fraction"] < 0.5, m
        assert m["tensorhub/publish_delta_bytes"] < m["tensorhub/publish_bytes"] / 4, m  # a delta, not the version
        # The float32 words hold bf16 values: the delta carries only their bf16 halves (the codec's ``_bf16``
        # encodings), as a bf16 version's delta would, about a byte per changed element at these changed
        # fractions; whole float32 words take about 0.4 byte more.
        changed = m["tensorhub/changed_fraction"] * m["tensorhub/publish_bytes"] / 4
        assert m["tensorhub/publish_delta_bytes"] <= 1.25 * changed, m
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
        # No gather: both trainer ranks published their rows and both served them. This model is one 0.67 MB
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
    # Every sample is labelled by the spans its replica's engine recorded for it (matched by engine request id),
    # never by verl's counter alone: the audit lines of every server and every sample agree, one by one.
    samples = _assert_samples_carry_their_engines_spans(audit, _applied_versions(audit, tmp_path / "metrics.jsonl"))
    assert len(samples) >= 3 * PROMPTS_PER_STEP * GROUP_SIZE, len(samples)


@pytest.mark.slow  # ~3 min
def test_a_replica_whose_first_version_came_raw_from_its_peer_applies_every_delta(task, tmp_path):
    """Replica 1 starts its pull of version 0 only once replica 0 holds it in the engines' layout, so it reads it
    raw from its peer (``tests/verl/lag_injection.py``; the order a slow replica start gives by chance). Neither
    its engine's layout nor the trainer's 'hf' versions carry the tied ``lm_head.weight`` (the trainer leaves it
    out): each step's delta applies on both replicas, none of its chunks re-read in full. The default suite's
    versions: tests/vllm/test_engine_tied_head.py (real engines, head-less versions, a base read raw from a peer)
    and tests/vllm/test_holder_delta.py's tied-head tests (a publisher that keeps the head: its scratch is
    filled from the embedding)."""
    from tests.verl.lag_injection import hook

    _, metrics = _run(task, tmp_path, steps=2, trainer_ranks=2, dtype_overrides=(
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16", "actor_rollout_ref.actor.optim.lr=1e-5",
        "tensorhub.delta=auto",
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={hook('replica_1_reads_v0_raw_from_replica_0')}"))
    assert [step for step, _ in metrics] == [1, 2]
    for _, m in metrics:
        assert m["tensorhub/delta_replicas"] == 2 and m["tensorhub/delta_fallbacks"] == 0, m
        assert m["tensorhub/bytes"] == m["tensorhub/delta_bytes"] == 2 * m["tensorhub/publish_delta_bytes"], m
        assert m["tensorhub/digests_checked"] == 2 and m["tensorhub/digest_mismatches"] == 0, m


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


def _engine_records(directory) -> dict[str, dict]:
    """What every rollout server's engine recorded, by engine request id."""
    records = {}
    for rec in _audit(directory, "server-replica"):
        assert rec["request_id"] not in records, rec
        records[rec["request_id"]] = rec
    return records


def _assert_samples_carry_their_engines_spans(directory, applied: set[int]) -> list[dict]:
    """Every engine request's spans cover its tokens in order, each from a version the updater applied, and its
    labels are theirs; every sample's spans are its engine requests' spans, part by part, matched by the engine
    request id, and its labels (verl's min/max_global_steps) are theirs. Returns the samples' audit lines."""
    from tensorhub_verl.vllm.version_spans import concat, from_wire, label

    engines, samples = _engine_records(directory), _audit(directory, "client")
    assert engines and samples
    for rec in engines.values():
        spans = from_wire(rec["spans"])
        assert spans[0].start == 0 and spans[-1].end == rec["tokens"], rec
        assert all(a.end == b.start for a, b in zip(spans, spans[1:])), rec
        assert {s.version for s in spans} <= applied, (rec, applied)
        assert (rec["min"], rec["max"]) == label(spans), rec
    for rec in samples:
        parts = [(from_wire(s), n) for s, n in rec["parts"]]
        assert rec["engine_requests"] and len(rec["engine_requests"]) == len(parts), rec
        for (part, n), engine_request in zip(parts, rec["engine_requests"]):
            engine = engines[engine_request]
            assert from_wire(engine["spans"]) == part and engine["tokens"] == n, (rec, engine)
        spans = concat([p for p, _ in parts], [n for _, n in parts])
        assert from_wire(rec["spans"]) == spans and rec["tokens"] == sum(n for _, n in parts), rec
        assert (rec["min"], rec["max"]) == label(spans), rec
    return samples


def _applied_versions(directory, metrics_file) -> set[int]:
    """Every version a replica switched to (the servers' audit, the initial sync's version 0 too); each step's
    version in verl's metrics is one of them."""
    applied = {int(rec["version"]) for rec in _audit(directory, "serving-replica")}
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    stepped = {int(r["data"]["tensorhub/version"]) for r in rows if "tensorhub/version" in r.get("data", {})}
    assert stepped and stepped <= applied, (stepped, applied)
    return applied


@pytest.mark.slow  # ~4 min: one fully_async run with partial rollouts, every assertion of version truth on it
def test_fully_async_samples_carry_the_versions_their_engines_recorded(task, tmp_path):
    """Partial rollouts on: a sync aborts the requests in flight and verl resumes them on the new version, so a
    response straddles two versions. Every rollout server writes what its engine recorded per request, every
    agent-loop client what its sample carries (``tensorhub.version_audit_dir``).

    A straddle needs requests in flight when a sync comes. Unbounded, the engines batch every request the
    rollouter submits and finish the whole run's prompts before the trainer's first step ends (every sync then
    finds idle engines); ``max_num_seqs=1`` keeps most of them queued, so generation outlasts several syncs. The
    default suite's shorter versions: tests/vllm/test_version_spans_engine.py (a real engine, an apply
    mid-generation) and tests/verl/test_version_labels_on_cpu.py (verl's resume loop and gate, patched)."""
    from tensorhub_verl.vllm.version_spans import from_wire

    audit = tmp_path / "audit"
    result, metrics = _run(task, tmp_path, steps=4, trainer_mode="fully_async", dtype_overrides=(
        f"tensorhub.version_audit_dir={audit}", "async_training.partial_rollout=true",
        "async_training.staleness_threshold=3", "data.max_response_length=128",
        "actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.rollout.max_num_seqs=1"))
    assert result["demo"] == "ok"
    samples = _assert_samples_carry_their_engines_spans(audit, _applied_versions(audit, tmp_path / "metrics.jsonl"))
    straddles = [rec for rec in samples if len({s.version for s in from_wire(rec["spans"])}) > 1]
    # A response aborted by a sync and resumed on the next version: two spans, min < max, split where the
    # first part ended.
    assert straddles, "no response straddled a sync"
    for rec in straddles:
        spans = from_wire(rec["spans"])
        ends = {sum(n for _, n in rec["parts"][:i + 1]) for i in range(len(rec["parts"]))}
        assert len(rec["parts"]) > 1 and spans[0].end in ends, rec
        assert rec["min"] < rec["max"] and rec["min"] == spans[0].version and rec["max"] == spans[-1].version
    # The labels above are the ones the sample carries into verl's batch (``min_global_steps`` /
    # ``max_global_steps``, which fully_async's ``fully_async/partial/*`` metrics count). Those metrics are not
    # asserted: the straddling samples finish last, in the last step's batch, whose metrics verl 0.9.1's
    # fully_async trainer never logs (with test_freq=-1).


def _serving_over_time(directory) -> list[set[int]]:
    """The versions the fleet served after each change of one replica's version, in time order (from the
    servers' audit: each line is written inside the replica's pause, after its apply)."""
    serving: dict[int, int] = {}
    seen = []
    for rec in sorted(_audit(directory, "serving-replica"), key=lambda r: r["time"]):
        serving[rec["replica"]] = rec["version"]
        seen.append(set(serving.values()))
    return seen


def _fully_async_with_a_replica_delayed(task, out, hook: str, replicas: int, *overrides: str,
                                        trainer_mode: str = "fully_async") -> dict:
    """One run (fully_async unless told) in which a replica is delayed on purpose (``tests/verl/lag_injection.py``:
    Ray's worker set-up hook changes only the updater in verl's trainer; the engines, transfers and hub are
    real)."""
    from tests.verl.lag_injection import hook as hook_path

    audit = out / "audit"
    mode = ("async_training.partial_rollout=true", "async_training.staleness_threshold=2") \
        if trainer_mode == "fully_async" else ()
    result, _ = _run(task, out, steps=5, replicas=replicas, trainer_mode=trainer_mode, dtype_overrides=(
        f"tensorhub.version_audit_dir={audit}", "tensorhub.min_replica_fraction=0.5", *mode,
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={hook_path(hook)}", *overrides))
    assert result["demo"] == "ok"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    synced = sorted((r["data"] for r in rows if "tensorhub/version" in r.get("data", {})),
                    key=lambda m: m["tensorhub/version"])
    return {"synced": synced, "audit": audit, "applied": _applied_versions(audit, out / "metrics.jsonl")}


@pytest.mark.slow  # ~5 min
def test_a_lagging_replica_is_held_back_by_max_version_lag_then_catches_up(task, tmp_path):
    """``max_version_lag=1``; replica 1 applies nothing while versions 2 and 3 roll out: two behind at 3, it is
    held (it leaves verl's load balancer, those in flight finish), released by the first version it applies (4),
    and serves the newest from then on. The default suite's versions: tests/verl/test_updater_on_cpu.py (the
    updater's hold and release, stub servers over real holders) and tests/verl/test_version_labels_on_cpu.py
    (verl's real gate, patched)."""
    from tests.verl.lag_injection import LAGGING

    run = _fully_async_with_a_replica_delayed(
        task, tmp_path, "replica_1_misses_2_and_3", 2, "tensorhub.max_version_lag=1",
        # generation still running while the replica is held (else every prompt is done before), so that new
        # requests meet its held gate
        "data.max_response_length=64", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.max_num_seqs=2")
    by_version = {int(m["tensorhub/version"]): m for m in run["synced"]}
    lag = f"tensorhub/version_lag/replica_{LAGGING}"
    trace = {v: (m.get(lag), m.get("tensorhub/replicas_held"), m.get("tensorhub/requests_held_back"))
             for v, m in by_version.items()}
    assert by_version[2][lag] == 1 and by_version[2]["tensorhub/replicas_held"] == 0, trace  # within the bound
    assert by_version[3][lag] == 2 and by_version[3]["tensorhub/replicas_held"] == 1, trace  # held
    # released by the first version it applies
    assert by_version[4][lag] == 0 and by_version[4]["tensorhub/replicas_held"] == 0, trace
    # Held back: from its gate's hold to its release no request entered it, while the other replica kept
    # admitting (requests already inside finished).
    gate = sorted(_audit(run["audit"], f"hold-replica{LAGGING}"), key=lambda r: r["time"])
    assert [g["held"] for g in gate] == [True, False], gate
    held_at, released_at = gate[0]["time"], gate[1]["time"]
    admitted = {r: [rec["admitted"] for rec in _audit(run["audit"], f"server-replica{r}")] for r in (0, 1)}
    assert not [t for t in admitted[LAGGING] if held_at <= t < released_at], (held_at, released_at)
    assert [t for t in admitted[1 - LAGGING] if held_at <= t < released_at], (held_at, released_at)
    assert by_version[5]["tensorhub/version_lag"] == 0 and by_version[5]["tensorhub/replicas_updated"] == 2, trace
    # every sample it served carries the versions it really served
    _assert_samples_carry_their_engines_spans(run["audit"], run["applied"])
    served = [rec["version"] for rec in sorted(_audit(run["audit"], f"serving-replica{LAGGING}"),
                                               key=lambda r: r["time"])]
    assert served[-2:] == [4, 5] and 2 not in served and 3 not in served, served


@pytest.mark.slow  # ~5 min
def test_separate_async_keeps_making_progress_while_a_replica_is_held(task, tmp_path):
    """separate_async, ``max_version_lag=1``; replica 1 applies nothing while versions 2 and 3 roll out. Held at 3,
    it leaves verl's load balancer: no new request is routed to it (none meets its held gate) and the other
    replica serves the whole batch of step 4, whose update releases it. A held replica left in rotation got part
    of that batch parked at its gate, and the batch, the update and the job waited for it. The default suite's
    version: tests/verl/test_balancer_rotation_on_cpu.py (verl's real balancer and client)."""
    from tests.verl.lag_injection import LAGGING

    run = _fully_async_with_a_replica_delayed(
        task, tmp_path, "replica_1_misses_2_and_3", 2, "tensorhub.max_version_lag=1",
        "data.max_response_length=64", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.max_num_seqs=2", trainer_mode="separate_async")
    by_version = {int(m["tensorhub/version"]): m for m in run["synced"]}
    assert sorted(by_version) == [1, 2, 3, 4, 5], sorted(by_version)  # every step, none stalled
    assert by_version[3]["tensorhub/replicas_held"] == 1 and by_version[4]["tensorhub/replicas_held"] == 0
    assert all(m["tensorhub/requests_held_back"] == 0 for m in by_version.values()), by_version
    gate = sorted(_audit(run["audit"], f"hold-replica{LAGGING}"), key=lambda r: r["time"])
    assert [g["held"] for g in gate] == [True, False], gate
    admitted = {r: [rec["admitted"] for rec in _audit(run["audit"], f"server-replica{r}")] for r in (0, 1)}
    assert not [t for t in admitted[LAGGING] if gate[0]["time"] <= t < gate[1]["time"]], gate
    assert [t for t in admitted[1 - LAGGING] if gate[0]["time"] <= t < gate[1]["time"]], gate


@pytest.mark.slow  # ~5 min
def test_the_fleet_flip_never_serves_three_versions_with_a_replica_behind(task, tmp_path):
    """``flip_together``, three replicas; replica 2 applies nothing while version 2 rolls out. At version 3 it
    catches up to 2 first, then the others flip to 3: the replicas' serving versions (audited inside each
    replica's pause, at each switch) never number three, where replicas updating on their own would pass
    through {1, 2, 3}. The default suite's version: test_fleet_flip_on_cpu.py (stub servers over real holders,
    and the flip-order planner)."""
    from tests.verl.lag_injection import STRAGGLER

    run = _fully_async_with_a_replica_delayed(task, tmp_path, "replica_2_misses_2", 3,
                                              "tensorhub.rollout_staging=cpu", "tensorhub.flip_together=true")
    seen = _serving_over_time(run["audit"])
    assert seen and all(len(s) <= 2 for s in seen), seen
    assert {1, 2} in seen, seen  # replica 2 really was behind the others
    by_version = {int(m["tensorhub/version"]): m for m in run["synced"]}
    assert all(m["tensorhub/versions_served"] <= 2 for m in by_version.values()), by_version
    straggler = [rec["version"] for rec in sorted(_audit(run["audit"], f"serving-replica{STRAGGLER}"),
                                                  key=lambda r: r["time"])]
    assert 2 in straggler, straggler  # its catch-up to the fleet's commit, before the others moved on
    _assert_samples_carry_their_engines_spans(run["audit"], run["applied"])
