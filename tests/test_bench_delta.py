"""`tensorhub bench delta` on a tiny model (real AdamW steps, one core), and the synthetic delta sequence the
lab and the simulator draw from its measured profile: the figures come out, the codec's results are exact, and
drawn versions change as the profile says."""

from __future__ import annotations

import json

import numpy as np
import torch

from tensorhub_verl.bench import delta as bench
from tensorhub_verl.bench.delta_profile import DeltaProfile, default_profile, delta_sequence
from tensorhub_verl.ros.wire import delta_codec as dc


def test_bench_delta_runs_real_steps_and_prints_exact_figures_and_json_last(capsys, tmp_path):
    out = tmp_path / "profiles.json"
    assert bench.main(["--params", "300k", "--vocab", "256", "--steps", "2", "--device", "cpu", "--seq", "16",
                       "--chunk-mib", "0.25", "--profile-out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["bench"] == "delta" and set(result["steps"]) == {"1e-06", "1e-05"}
    for lr, s in result["summary"].items():
        assert s["cpu"]["all_exact"], lr
        assert 0 < s["changed_fraction"] < 1
        assert s["chosen_bytes_per_changed"] <= min(s["bytes_per_changed"].values()) + 1e-9
        # the float32 version of the same bf16 values: its delta on the bf16 halves is the bf16 delta's size
        # (chunks of half as many words: a few more frames), smaller than the one of whole float32 words
        f = s["float32"]
        assert f["cpu"]["all_exact"], lr
        assert f["over_bf16"] < 1.1 and f["over_bf16"] < f["plain_over_bf16"], f
    # a larger learning rate changes more of the bf16 words
    assert result["summary"]["1e-05"]["changed_fraction"] > result["summary"]["1e-06"]["changed_fraction"]
    assert any(line.startswith("lr 1e-06 step 1: changed") for line in lines)
    assert any(line.startswith("  float32 version (bf16 values): chosen") for line in lines)
    for step in result["steps"]["1e-06"]:
        assert set(step["float32"]["mix"]) <= set(dc.BF16_ENCODINGS), step["float32"]["mix"]
    profiles = json.loads(out.read_text())
    p = DeltaProfile.from_dict(profiles["1e-06"])
    assert p.block_fractions and abs(sum(prob for _, prob in p.steps) - 1) < 0.5


def test_the_shape_search_hits_the_parameter_count():
    s = bench.shape_for(17_000_000)
    assert abs(s["params"] - 17e6) / 17e6 < 0.1


def test_drawn_versions_change_as_the_measured_profile_says():
    profile = default_profile(1e-6)
    versions = list(delta_sequence(8 << 20, 3, profile=profile, seed=1))
    assert len(versions) == 3 and all(v.numel() == 8 << 20 for v in versions)
    for base, target in zip(versions, versions[1:]):
        changed = float((base.view(torch.int16) != target.view(torch.int16)).float().mean())
        assert 0.3 * profile.changed_fraction < changed < 3 * profile.changed_fraction
        e = dc.encode_chunk(base, target, dtype=torch.bfloat16)
        assert e.encoding == dc.ULP
        assert e.nbytes / e.changed < 2.0
    # the same seed draws the same versions
    again = list(delta_sequence(8 << 20, 2, profile=profile, seed=1))
    assert torch.equal(again[1], versions[1])


def test_a_profile_round_trips_through_json_and_draws_its_steps():
    steps = np.array([1, -1, 1, 2, -2, 1, 300, -7000], dtype=np.int64)
    p = DeltaProfile.measure(1e-5, [0.1, 0.2], steps, bytes_per_changed=1.1, changed_fraction=0.15)
    q = DeltaProfile.from_dict(json.loads(p.to_json()))
    assert q == p
    drawn = q.draw_steps(np.random.default_rng(0), 10000)
    assert set(drawn.tolist()) <= set(steps.tolist())
    assert abs((drawn == 1).mean() - 3 / 8) < 0.03
