"""A host that reboots and rejoins, inside verl's real job across lab hosts (``--mode elastic --hosts 3``, the
TensorHub run only): the elastic vLLM node (``tensorhub attach-vllm`` on d0r1h1, outside the job's Ray cluster,
with the job's token and key in its environment) applies a version, then every process of its host dies at once
(the node, vLLM's engine core and workers: a reboot, no goodbye to the hub) and the node is started again; it
rejoins mid-run and reads its first version from its peer. The job goes on to its last step; the node's copies
were accepted (the job's key: no ``NotModelOwner`` in any log of the run); no process of the run is alive
afterwards (/proc scan for the run's marker). verl's helper actors run on the trainer's host, where
``tensorhub.helper_placement`` puts them."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from tensorhub_dev.demo.task import build_task
from tensorhub_dev.netlab.verl_modes import run_variant
from tensorhub_dev.testing.leftovers import MARKER_ENV, new_marker, wait_none_with_marker
from tests.requires import require

require("vllm", reason="the replica and the elastic node are vLLM engines (CPU build)")
pytestmark = [pytest.mark.netns, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(3600)]

EXIT_GRACE_S = 60.0
STEPS = 170
"""2-3 s each here: the node's engine comes up twice (about 3 minutes each on this machine's CPUs) within them."""


def test_an_elastic_nodes_host_reboots_and_the_node_rejoins_from_its_peer(no_leftovers, tmp_path, monkeypatch):
    marker = new_marker()
    monkeypatch.setenv(MARKER_ENV, marker)  # the lab's hosts, Ray's nodes and the node inherit this environment
    out = tmp_path / "out"
    try:
        result = run_variant(build_task(tmp_path / "task"), out, "elastic", 3, "tensorhub", STEPS, 2400.0,
                             reboot=True)
    finally:
        left = wait_none_with_marker(marker, EXIT_GRACE_S)
        for proc in left:  # no process outlives the test, whatever it found
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    node = result["elastic_node"]
    print(json.dumps({"node": node, "summary": result["summary"]}))
    assert left == [], "processes of the run outlived it:\n" + "\n".join(map(str, left))
    assert [s["step"] for s in result["steps"]] == list(range(1, STEPS + 1))  # the job went on
    reboot = node["reboot"]
    assert reboot["killed"] >= 2 and reboot["before"]["first"] is not None  # the node, its engine core, ...
    # It rejoined after the reboot with a newer version, read from its peer (the job's replica on its rack).
    assert node["first"]["version"] > reboot["before"]["first"]["version"], node
    assert node["first"]["peer_fraction"] > 0.0, node["first"]
    assert node["served"] >= node["first"]["version"]
    # With the job's key the node may publish its own copies: nothing refused them, and the job's replica, whose
    # only peer in this layout is the node, read versions from it after it rejoined.
    logs = [p for p in out.rglob("*.log")]
    refused = [p.name for p in logs if "NotModelOwner" in p.read_text(errors="replace")]
    assert refused == [], refused
    after = [s for s in result["steps"] if s["step"] > node["first"]["version"]]
    assert any(s["peer_fraction"] > 0 for s in after), after
    # verl's helper actors where tensorhub.helper_placement put them: the trainer's host.
    helpers = {(a["class"], a["host"]) for a in result["actors"]
               if a["class"].startswith(("TaskRunner", "AgentLoopWorker", "RewardLoopWorker"))}
    print(json.dumps(sorted(helpers)))
    assert {cls for cls, _ in helpers} >= {"TaskRunnerV1", "RewardLoopWorker"}, helpers
    assert any(cls.startswith("AgentLoopWorker") for cls, _ in helpers), helpers  # AgentLoopWorkerTQ in 0.9.1
    assert {host for _, host in helpers} == {"d0r0h0"}, helpers
