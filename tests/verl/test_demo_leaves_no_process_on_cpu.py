"""The demo's elastic phase leaves nothing behind: after ``tensorhub demo`` returns, no process it started (verl's
trainer, Ray's cluster and workers, the replicas' vLLM engines, the elastic node ``tensorhub attach-vllm`` and
its engine core) is still alive, children re-parented to init included. Found by a marker in the environment of
everything the demo starts (``tensorhub_dev.testing.leftovers`` scans /proc)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tensorhub_dev.demo.grpo import run
from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.task import build_task
from tensorhub_dev.testing.leftovers import MARKER_ENV, new_marker, wait_none_with_marker, with_marker
from tests.requires import require

require("vllm", reason="the rollout replicas and the elastic node are vLLM engines (CPU build)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

EXIT_GRACE_S = 60.0
"""How long processes of a stopped group may take to be reaped by the kernel before they count as left."""


def test_no_process_of_the_demo_outlives_it_with_an_elastic_node(tmp_path, monkeypatch):
    marker = new_marker()
    monkeypatch.setenv(MARKER_ENV, marker)  # TinyJob.environment() copies this process's environment
    # Steps after the first give the elastic node's vLLM engine time to start before the job ends.
    job = TinyJob(task=build_task(tmp_path / "task"), out_dir=tmp_path / "out", steps=10, replicas=2)
    assert with_marker(marker) == []
    try:
        result = run(job, quiet=True, elastic_at=1, timeout_s=1200)
        assert result["demo"] == "ok"
        # The node ran (it logs once it starts building its vLLM engine); on a busy 2-core machine it may still
        # be starting when the job ends, which is when the demo stops it. A node that served and then lost its hub
        # is tests/vllm/test_attach.py's.
        assert (job.out_dir / "elastic_node.log").read_text(errors="replace").strip(), "the elastic node never ran"
    finally:
        left = wait_none_with_marker(marker, EXIT_GRACE_S)
        for proc in left:  # no process outlives the test, whatever it found
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    assert left == [], "processes of the demo outlived it:\n" + "\n".join(map(str, left))
