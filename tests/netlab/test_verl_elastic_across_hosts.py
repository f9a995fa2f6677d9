"""``tensorhub demo --mode elastic --hosts 3`` for real: verl's tiny job on a Ray cluster of two lab hosts (the
trainer on rack r0, one replica on rack r1) while an elastic vLLM node (``tensorhub attach-vllm``) joins mid-run
from a third host of rack r1, outside the job's Ray cluster; with TensorHub it reads its first version from its
peer, in the baseline (``cooperative=false``, the node steered to the trainer) from the trainer. Afterwards no
process of the run is left: everything it started carries a marker in its environment, found by a /proc scan."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from tensorhub_dev.demo import hosts
from tensorhub_dev.demo.task import build_task
from tensorhub_dev.testing.leftovers import MARKER_ENV, new_marker, wait_none_with_marker
from tensorhub_verl.bench.tiny_model import float32_bytes
from tests.requires import require

require("vllm", reason="the replica and the elastic node are vLLM engines (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(3600)]

EXIT_GRACE_S = 60.0
STEPS = 40
"""A few seconds each: the node's vLLM engine, started while the job starts, is up after some of them."""


def test_an_elastic_node_joins_from_another_host_and_reads_from_its_peer(no_leftovers, tmp_path, monkeypatch):
    marker = new_marker()
    monkeypatch.setenv(MARKER_ENV, marker)  # the lab's hosts, Ray's nodes and the node inherit this environment
    task = build_task(tmp_path / "task")
    try:
        result = hosts.run(task, tmp_path / "out", mode="elastic", hosts=3, steps=STEPS)
    finally:
        left = wait_none_with_marker(marker, EXIT_GRACE_S)
        for proc in left:  # no process outlives the test, whatever it found
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    print(json.dumps(result))
    assert left == [], "processes of the run outlived it:\n" + "\n".join(map(str, left))
    th, base = (result["runs"][v] for v in ("tensorhub", "pull_from_trainer"))
    copy = float32_bytes(task.model_dir)
    for run in (th, base):
        node = run["elastic_node"]
        # It joined mid-run, once its engine was up: a version the job trained before its last step.
        assert node["host"] == "d0r1h1" and 1 <= node["first"]["version"] < STEPS
        # A whole version: the trainer's 'hf' copy or the engine's layout, each holding the tied embedding once.
        assert node["first"]["bytes"] >= copy * 0.8 and node["served"] >= node["first"]["version"]
        assert "vLLMHttpServer@d0r1h0" in run["actors"] and "WorkerDict@d0r0h0" in run["actors"]
        assert not any(a.endswith("@d0r1h1") for a in run["actors"]), run["actors"]  # the node is outside Ray
        assert [s["step"] for s in run["steps"]] == list(range(1, STEPS + 1))
    assert th["elastic_node"]["first"]["peer_fraction"] == 1.0, th["elastic_node"]
    assert base["elastic_node"]["first"]["peer_fraction"] == 0.0, base["elastic_node"]
    assert set(result["compare"]["joiner_peer_fraction"]) == {"tensorhub", "pull_from_trainer"}
