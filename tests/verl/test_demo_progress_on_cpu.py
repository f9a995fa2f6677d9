"""The main job's step rows, read from verl's file logger while it writes (no processes)."""

import json

from tensorhub_dev.demo.progress import read_metrics, read_steps


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
