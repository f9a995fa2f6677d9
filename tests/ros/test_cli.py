"""The `tensorhub` console script: hub, status, demo, bench (small sizes; figures are not asserted)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import free_port
from tensorhub_verl.cli import hub_parser, hub_seeds_per_dc
from tests.ros.roles import make_weights

TENSORHUB = str(Path(sys.executable).parent / "tensorhub")


def run_cli(*args, timeout=300, env=None):
    return subprocess.run([TENSORHUB, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TENSORHUB_LOG_LEVEL": "WARNING", **(env or {})})


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_status_shows_models_versions_and_holders(hub):
    with th.connect(hub.url, "trainer", chunk_bytes=64 << 10) as trainer:
        trainer.publish("policy", 3, make_weights(0, 0.2))
        table = run_cli("status", "--hub", hub.url)
        assert table.returncode == 0, table.stderr
        assert "policy" in table.stdout and "trainer" in table.stdout and "active" in table.stdout
        as_json = json.loads(run_cli("status", "--json", env={"TENSORHUB_HUB": hub.url}).stdout)
        assert as_json["models"]["policy"][0]["version"] == 3


def test_status_without_a_hub_says_how_to_fix_it():
    result = run_cli("status", env={"TENSORHUB_HUB": ""})
    assert result.returncode == 2 and "--hub" in result.stderr


def test_hub_command_reads_its_token_from_a_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    port = free_port()
    hub = subprocess.Popen([TENSORHUB, "hub", "--port", str(port), "--token-file", str(token_file)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert response.status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer from-a-file"}).status_code == 200
    finally:
        hub.kill()
        hub.wait(10)


def test_bench_transport_prints_json_last():
    result = run_cli("bench", "transport", "--size-mb", "4", "--repeats", "1", "--chunk-mb", "1", "--first-mb", "2",
                     "--first-readers", "1", "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    figures = last_json(result.stdout)
    assert figures["tensorhub_gbps"] > 0 and figures["raw_socket_gbps"] > 0 and figures["ratio"] > 0
    row = figures["rows"][0]
    assert figures["device"] == row["device"] == "cpu"
    assert row["device_copy_gbps"] > 0 and row["ratio_to_device_copy"] > 0  # torch's copy, the same rounds
    first = row["first_read"]
    assert first["joiners"] == 1 and first["first_s"] > 0 and first["later_s"] > 0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_bench_transport_on_cuda_without_a_gpu_is_refused_before_starting_anything():
    result = run_cli("bench", "transport", "--device", "cuda", "--json")
    assert result.returncode == 2 and "--device cuda needs a CUDA GPU" in result.stderr


@pytest.mark.slow
def test_bench_fanout_offloads_the_publisher():
    result = run_cli("bench", "fanout", "--readers", "3", "--size-mb", "6", "--chunk-mb", "0.5", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    figures = last_json(result.stdout)
    version = figures["version_bytes"]
    assert figures["publisher_bytes_naive"] == 3 * version  # naive: every reader pulls everything
    assert figures["publisher_bytes_tensorhub"] < 3 * version


@pytest.mark.slow
def test_demo_runs_and_checks_its_bytes():
    result = run_cli("demo", "ros", "--readers", "2", "--size-mb", "4", "--versions", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert last_json(result.stdout)["demo"] == "ok"
    assert "version 2:" in result.stdout


@pytest.mark.parametrize("flags, seeds", [([], 1), (["--nic-gbps", "100", "--wan-gbps", "400"], 4),
                                          (["--nic-gbps", "400", "--wan-gbps", "100"], 1),
                                          (["--nic-gbps", "100", "--wan-gbps", "400", "--seeds-per-dc", "2"], 2)])
def test_hub_sizes_wan_seeds_from_link_rates_unless_given(flags, seeds):
    assert hub_seeds_per_dc(hub_parser().parse_args(flags)) == seeds


def test_bench_control_drives_the_real_hub_with_synthetic_readers():
    result = run_cli("bench", "control", "--chunks", "24", "--readers", "6", "--procs", "2", "--max-seconds", "60",
                     "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    point = last_json(result.stdout)["points"][0]
    # Every reader booked every chunk through the hub's begin/exchange/end, and the hub's CPU was measured.
    assert point["complete"] and point["readers_done"] == 6 and point["reads"] == 6 * 24
    assert point["hub_cpu_s"] > 0 and point["exchanges_per_reader"] >= 24 / 8


def test_bench_control_readers_ask_for_runs_and_count_chunks_per_exchange():
    result = run_cli("bench", "control", "--chunks", "64", "--readers", "4", "--procs", "1", "--run-chunks", "16",
                     "--max-seconds", "60", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    point = last_json(result.stdout)["points"][0]
    assert point["complete"] and point["reads"] == 4 * 64  # every chunk booked once, through run leases
    assert point["leases"] < point["reads"] and point["exchanges_per_reader"] < 64 / 8
    assert 0 < point["peer_read_share"] < 1  # the readers read from each other, not only from the trainer


@pytest.mark.parametrize("split", ["chunks", "readers"])
def test_bench_control_splits_the_hub_across_shard_processes(split):
    relays = ["--relay-fanout", "1"] if split == "readers" else []  # region 1 fed by a reader of region 0
    result = run_cli("bench", "control", "--chunks", "64", "--readers", "4", "--procs", "1", "--run-chunks", "16",
                     "--shards", "2", "--split", split, "--max-seconds", "300", "--json", *relays)
    assert result.returncode == 0, result.stderr[-2000:]
    point = last_json(result.stdout)["points"][0]
    # Every reader booked every chunk once across the shards, and each shard process's CPU was measured.
    assert point["complete"] and point["reads"] == 4 * 64 and len(point["hub_cpu_per_shard_s"]) == 2
    assert point["critical_path_per_update_s"] == max(point["hub_cpu_per_shard_s"])
    if relays:  # one copy from the trainer (region 0's); region 1's from region 0's relay (here on the same node)
        assert point["trainer_copies"] == 1.0 and 64 <= point["relay_reads"] <= 2 * 64 and point["relays"] >= 1
