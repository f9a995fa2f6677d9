"""The main job's step rows, read from verl's file logger while it writes, and its start-up lines, read from
verl's log while it grows."""

import json
import re
import sys

from tensorhub_dev.demo.grpo import run
from tensorhub_dev.demo.job import TinyJob
from tensorhub_dev.demo.progress import read_metrics, read_steps
from tensorhub_dev.demo.startup import LogTail, StartupWatch
from tensorhub_dev.demo.task import TaskFiles


def _write(path, records, partial=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + partial)


def test_lines_of_one_step_merge_and_a_half_written_line_waits(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, [{"step": 0, "data": {"fully_async/rollouter/idle_ratio": 1.0}},   # no reward: not a step
                  {"step": 1, "data": {"critic/score/mean": 0.25}},
                  {"step": 1, "data": {"tensorhub/version": 1, "tensorhub/bytes": 2e6,
                                       "tensorhub/bytes_from_peers": 1e6, "tensorhub/bytes_from_trainer": 1e6,
                                       "tensorhub/sources_peer_fraction": 0.5}},
                  {"step": 2, "data": {"critic/score/mean": 0.5}}], partial='{"step": 2, "data": {"tens')
    assert [s for s, _ in read_metrics(path)] == [1, 2]
    assert [s for s, _ in read_metrics(path, final=False)] == [1]  # step 2 may still get lines
    row = read_steps(path)[0]
    assert (row.step, row.version, row.reward_mean, row.bytes, row.peer_fraction) == (1, 1, 0.25, 2_000_000, 0.5)
    assert row.sources == "trainer 1.00 MB, peers 1.00 MB"
    assert "sources" not in row.as_json()


def test_no_file_yet_means_no_steps(tmp_path):
    assert read_steps(tmp_path / "absent.jsonl") == []


# Lines in the formats verl 0.9.1's CPU job writes (Ray's driver, then actors prefixed "(Class pid=N)" in colour).
_C, _R = "\x1b[36m", "\x1b[0m"
VERL_LOG = [
    "WARNING:2026-11-28 18:59:24,309:tensorhub_verl: applied verl patch verl_0_9_1_manager_update_weights",
    "2026-11-28 18:59:38,711\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at x",
    f"{_C}(TaskRunnerV1 pid=4118){_R} Using dataset class: RLHFDataset",
    f"{_C}(TaskRunnerV1 pid=4118){_R} INFO:2026-11-27 11:47:10,256:create worker group dict_keys(['actor'])",
    f"{_C}(WorkerDict pid=4351){_R} Warning: Failed to set NUMA affinity",
    f"{_C}(WorkerDict pid=4352){_R} Warning: Failed to set NUMA affinity",
    f"{_C}(vLLMHttpServer pid=4890){_R} Triton is installed, but doesn't include CPU backend.",
    f"{_C}(vLLMHttpServer pid=4890){_R} (EngineCore pid=5190) WARNING Model Runner V2 requires Triton",
    f"{_C}(vLLMHttpServer pid=4924){_R} Triton is installed, but doesn't include CPU backend.",
    f"{_C}(TaskRunnerV1 pid=4118){_R} LLMServerManager: ['192.0.2.2:41037', '192.0.2.2:38217']",
    "Training Progress:   0%|          | 0/3 [00:00<?, ?it/s]",
    f"{_C}(vLLMHttpServer pid=4999){_R} a replica after training began is not start-up",
]
EVENTS = [
    "Ray is up",
    "verl's task runner started (reads the data, builds the workers)",
    "trainer workers starting (FSDP2, loading the model)",
    "rollout replica 1: vLLM engine starting",
    "rollout replica 2: vLLM engine starting",
    "rollout replicas ready: 2 vLLM servers up",
    "training starts: first step under way",
]


def test_start_up_events_come_once_each_in_the_order_of_the_log():
    watch = StartupWatch()
    events = []
    for line in VERL_LOG[:-1]:
        events += watch.feed(line)
    assert events == EVENTS
    assert watch.training
    assert watch.hub_ready("http://127.0.0.1:1") == ["hub ready at http://127.0.0.1:1"]
    assert watch.hub_ready("http://127.0.0.1:1") == []


def test_the_tail_returns_complete_lines_once(tmp_path):
    path = tmp_path / "verl.log"
    tail = LogTail(path)
    assert tail.new_lines() == []  # no file yet
    path.write_text("one\ntw")
    assert tail.new_lines() == ["one"]
    with open(path, "a") as f:
        f.write("o\nthree\n")
    assert tail.new_lines() == ["two", "three"]
    assert tail.new_lines() == []


class _ScriptedJob(TinyJob):
    """The demo's loop around a real child process that writes verl's log lines, the hub URL file and one step's
    metrics as verl's job would (verl itself is the slow tests' job: tests/verl/test_verl_trainer_on_cpu.py)."""

    def command(self) -> list[str]:
        script = (
            "import json, sys, time\n"
            f"lines = {VERL_LOG[1:7]!r}\n"
            "for line in lines:\n"
            "    print(line, flush=True); time.sleep(0.3)\n"
            f"open({str(self.hub_url_file)!r}, 'w').write('http://127.0.0.1:7777')\n"
            "time.sleep(1.5)\n"
            f"for line in {VERL_LOG[8:11]!r}:\n"
            "    print(line, flush=True); time.sleep(0.3)\n"
            f"open({str(self.metrics_file)!r}, 'w').write(json.dumps("
            "{'step': 1, 'data': {'critic/score/mean': 0.5, 'tensorhub/version': 1}}) + '\\n')\n"
        )
        return [sys.executable, "-c", script]


def test_the_demo_prints_each_part_as_it_starts_in_order(tmp_path, capfd):
    task = TaskFiles(model_dir=tmp_path, train_file=tmp_path, val_file=tmp_path, reward_file=tmp_path)
    job = _ScriptedJob(task=task, out_dir=tmp_path / "out", steps=1, replicas=2)
    result = run(job, quiet=True, timeout_s=120)
    assert result["demo"] == "ok" and [s["step"] for s in result["steps"]] == [1]
    err = capfd.readouterr().err
    lines = [line.split("] ", 1)[1] for line in err.splitlines() if re.match(r"\s+\[\s*\d+ s\] ", line)]
    assert lines[0].startswith("starting verl's trainer")
    assert [e for e in lines if e in EVENTS] == EVENTS
    assert "hub ready at http://127.0.0.1:7777" in lines
    assert lines.index("hub ready at http://127.0.0.1:7777") < lines.index("rollout replicas ready: 2 vLLM servers up")
