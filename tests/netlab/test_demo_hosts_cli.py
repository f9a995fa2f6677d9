"""``tensorhub demo --hosts N``: what it refuses before it builds anything (a lab needs a trainer host and a
rollout host, elastic also the joining node's host), and the lab it plans for each mode."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.netlab.verl_modes import mode_job, mode_lab

pytestmark = [pytest.mark.timeout(300)]


def _demo(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorhub_verl.cli", "demo", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=240)


def test_refusals_name_the_problem(netns_ok, tmp_path):
    proc = _demo("--mode", "elastic", "--hosts", "2", tmp_path=tmp_path)
    assert proc.returncode != 0 and "--mode elastic needs --hosts >= 3" in proc.stderr
    proc = _demo("--mode", "cross_dc", "--hosts", "1", tmp_path=tmp_path)
    assert proc.returncode != 0 and "--hosts must be >= 2" in proc.stderr


def test_mode_labs_put_the_replicas_on_two_racks_or_in_the_second_dc(tmp_path):
    standalone = mode_lab("standalone", 3)
    racks = {r.name: r.hosts for r in standalone.spec.datacenters[0].racks}
    assert racks == {"r0": ("d0r0h0", "d0r0h1"), "r1": ("d0r1h0",)}
    assert sorted(standalone.rollout_hosts) == ["d0r0h1", "d0r1h0"]
    cross = mode_lab("cross_dc", 3)
    assert [dc.name for dc in cross.spec.datacenters] == ["dc0", "dc1"]
    assert cross.rollout_hosts == ("d1r0h0", "d1r0h1") and cross.rollout_dc == "dc1"
    with pytest.raises(ConfigError, match="modes are standalone, elastic, cross_dc"):
        mode_lab("bulk", 3)
    job = mode_job(task=None, out_dir=tmp_path, mode="cross_dc", hosts=3, variant="pull_from_trainer", steps=2)
    assert job.replicas == 2 and "tensorhub.cooperative=false" in job.extra
    assert "tensorhub.rollout_placement=resource:th_rollout_host" in job.extra


def test_the_elastic_lab_puts_the_joining_node_beside_the_replicas_outside_the_job(tmp_path):
    from tensorhub_dev.netlab.verl_modes import elastic_joiner, elastic_secrets

    lab = mode_lab("elastic", 4)
    racks = {r.name: r.hosts for r in lab.spec.datacenters[0].racks}
    assert racks == {"r0": ("d0r0h0",), "r1": ("d0r1h0", "d0r1h1", "d0r1h2")}
    assert lab.rollout_hosts == ("d0r1h0", "d0r1h1") and lab.elastic_host == "d0r1h2"
    from tensorhub_dev.demo.task import TaskFiles

    task = TaskFiles(*(tmp_path / name for name in ("model", "train", "val", "reward")))
    job = mode_job(task=task, out_dir=tmp_path, mode="elastic", hosts=4, variant="tensorhub", steps=8)
    assert job.replicas == 2 and job.mode == "elastic"
    # With TensorHub the node gives its own rack (its peers are nearest); in the baseline the trainer's.
    assert elastic_joiner(lab, "tensorhub", {}).location["rack"] == "r1"
    base = elastic_joiner(lab, "pull_from_trainer", {})
    assert base.location["rack"] == "r0" and base.args == ("--source-layout", "hf")
    job_secrets = elastic_secrets()
    node = elastic_joiner(lab, "tensorhub", job_secrets)
    command = " ".join(node.command(job, "http://10.77.0.10:1"))
    assert all(value not in command for value in job_secrets.values())  # never on a command line
    assert node.env == job_secrets and set(job_secrets) == {"TENSORHUB_TOKEN", "TENSORHUB_JOB_KEY"}
    assert not node.reboot and elastic_joiner(lab, "tensorhub", job_secrets, reboot=True).reboot


def test_the_elastic_nodes_status_becomes_its_first_pull_and_the_ones_that_followed():
    from tensorhub_dev.netlab.verl_elastic import summary

    assert summary(None, host="h", started_after_step=None)["first"] is None
    first = {"version": 3, "pull_s": 0.2, "stall_s": 0.3, "sources": {"job-rollout-0-0": 1000}}
    follow = {"version": 4, "pull_s": 0.1, "stall_s": 0.2,
              "sources": {"job-actor-0": 500, "job-rollout-0-0": 500}}
    out = summary({"served": 4, "first": first, "history": [first, follow]}, host="h", started_after_step=2)
    assert out["first"]["peer_fraction"] == 1.0 and out["first"]["bytes"] == 1000
    assert [f["peer_fraction"] for f in out["followed"]] == [0.5] and out["served"] == 4


def test_the_summary_counts_the_trainers_copies_per_version_and_compares_the_variants():
    from tensorhub_dev.netlab.verl_modes import compare, summarize

    step = {"step": 1, "version": 1, "reward_mean": 0.1, "stall_s": 0.4, "pull_s": 0.2, "bytes": 3000,
            "peer_fraction": 0.5}
    result = {"steps": [step, {**step, "step": 2, "version": 2}], "wan_rx_bytes_by_dc": {"dc1": 8000},
              "seconds": 9.0}
    th = summarize(result, replicas=2, rollout_dc="dc1")
    # Two replicas pulled 1500 bytes each per version, half of it from a peer: one copy from the trainer.
    assert th["trainer_copies_per_version"] == 1.0 and th["router_bytes_into_rollout_dc_per_step"] == 4000
    base = summarize({**result, "steps": [{**s, "peer_fraction": 0.0, "stall_s": 0.8} for s in result["steps"]]},
                     replicas=2, rollout_dc="dc1")
    assert compare({"tensorhub": {"summary": th}, "pull_from_trainer": {"summary": base}}) == {
        "trainer_copies_ratio": 2.0, "stall_ratio": 2.0, "pull_ratio": 1.0}


def test_the_model_size_option_reaches_the_tiny_models_config(tmp_path):
    import json

    from tensorhub_dev.demo.grpo import main
    from tensorhub_dev.demo.task import ModelSize, build_task

    size = ModelSize.parse("256,512,3")
    task = build_task(tmp_path / "task", size=size, train_prompts=4, val_prompts=2)
    config = json.loads((task.model_dir / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (256, 512, 3)
    # Each size has its own directory, so a task directory never reuses a model of another size.
    assert task.model_dir.name == "model-256x512x3" and ModelSize().dir_name == "model"
    # The CLI parses the option before it builds or starts anything, and names what it accepts.
    with pytest.raises(ConfigError, match="head sizes"):
        main(["--model-size", "100,256,2", "--hosts", "3", "--out", str(tmp_path / "refused")])
    with pytest.raises(ConfigError, match="HIDDEN,INTERMEDIATE,LAYERS"):
        main(["--model-size", "512x1536x4", "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
