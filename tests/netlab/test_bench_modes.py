"""`tensorhub bench modes` helpers (pure), and one tiny end-to-end run in the lab (netns + slow)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tensorhub_dev.bench import modes, transport_lab
from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.calibrate import interleave, lab_cluster, lab_spec


def test_interleave_alternates_racks():
    assert interleave(("a0", "a1", "a2"), ("b0",)) == ["a0", "b0", "a1", "a2"]


def test_bench_and_simulator_share_one_lab():
    p = modes.LabBenchParams(rollouts=3, holders=2, joiners=3, nic_mbit=150, wan_mbit=50)
    spec, hosts = lab_spec(p, "standalone")
    assert [[r.hosts for r in dc.racks] for dc in spec.datacenters] == \
        [[("trainer", "hub", "sink"), ("a0", "a1", "a2"), ("b0", "b1")]]
    assert hosts == ["a0", "b0", "a1", "b1", "a2"] and spec.nic_mbit == 150 and spec.wan_mbit is None
    cluster, sim_hosts = lab_cluster(p, "standalone")
    assert sim_hosts == hosts and set(cluster.nodes) == {h for dc in spec.datacenters for r in dc.racks for h in r.hosts}
    xdc, hosts = lab_spec(p, "cross_dc")
    assert [dc.name for dc in xdc.datacenters] == ["dc0", "dc1"] and hosts == ["c0", "c1", "c2"]
    assert xdc.wan_mbit == 50 and lab_cluster(p, "cross_dc")[0].nodes["c1"].dc == "dc1"


def test_receivers_buffers_are_resident_before_the_clock_starts():
    """A receiver's timed fetch writes into pages already faulted in, as a rollout's weights are: without
    ``_resident`` every 4 KiB page of a fresh buffer faults during the receive."""
    import resource

    import torch

    from tensorhub_dev.bench.modes_roles import _resident

    def faults_writing(t: torch.Tensor) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t.fill_(1)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    pages = (64 << 20) // 4096
    assert faults_writing(torch.empty(64 << 20, dtype=torch.uint8)) > pages // 2  # fresh: faulted while written
    buffers = {"a": torch.empty(32 << 20, dtype=torch.uint8), "b": torch.empty(32 << 20, dtype=torch.uint8)}
    _resident(buffers.values())
    assert sum(faults_writing(t) for t in buffers.values()) < pages // 8


def test_summary_adds_sources():
    fetched = [{"seconds": 1.0, "sources": {"trainer": 3, "p": 1}, "partial_source_bytes": 1},
               {"seconds": 3.0, "sources": {"trainer": 4}, "partial_source_bytes": 0}]
    s = modes._summary(fetched)
    assert (s["total_s"], s["max_s"], s["mean_s"], s["bytes_from"], s["partial_source_bytes"]) == \
        (4.0, 3.0, 2.0, {"p": 1, "trainer": 7}, 1)


def test_result_keys_and_ratios():
    runs = {"tensorhub": {"total_s": 2.0, "max_s": 1.0, "seconds": [1.0, 1.0]},
            "pull_from_trainer": {"total_s": 10.0, "max_s": 6.0, "seconds": [4.0, 6.0]},
            "broadcast": {"total_s": 5.0, "max_s": 3.0, "seconds": [2.0, 3.0]}}
    r = modes._result("standalone", runs, modes.LabBenchParams(size_mb=25, nic_mbit=200))
    assert (r["tensorhub_s"], r["baseline_s"], r["ratio"], r["ratio_max"]) == \
        (2.0, {"pull_from_trainer": 10.0, "broadcast": 5.0}, 5.0, 6.0)
    assert r["ratio_vs"] == {"pull_from_trainer": 5.0, "broadcast": 2.5}
    assert r["readers"] == 2 and r["paper_ratio"] == 6.7 and r["runs"] is runs
    assert r["ideal_one_reader_s"] == pytest.approx(25 * 2**20 * 8 / 200e6, abs=1e-3)


def test_bool_flag_parses():
    assert modes._yes_no("false") is False and modes._yes_no("1") is True


def test_bad_params():
    with pytest.raises(ConfigError):
        modes.LabBenchParams(rollouts=0)


def test_unknown_mode_is_reported_as_json(capsys):
    assert modes.main(["--modes", "nope"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "ConfigError"


@pytest.mark.netns
@pytest.mark.slow
def test_cross_dc_tiny_run(no_leftovers, tmp_path, capsys):
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    rc = modes.main(["--modes", "cross_dc", "--size-mb", "4", "--rollouts", "2", "--nic-mbit", "400",
                     "--wan-mbit", "200", "--json", "--plots", str(tmp_path)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, res
    xdc = res["modes"]["cross_dc"]
    assert set(xdc["runs"]["tensorhub"]["bytes_from"]) <= {"trainer", "cross_dc-tensorhub-0", "cross_dc-tensorhub-1"}
    assert xdc["runs"]["pull_from_trainer"]["bytes_from"].keys() == {"trainer"}
    assert {"tensorhub_s", "baseline_s", "ratio", "wan_bytes"} <= xdc.keys()
    assert {r["mode"] for r in res["sim_vs_lab"]} == {"cross_dc"}
    # Every baseline reader pulled its own copy across the WAN; TensorHub crossed with fewer.
    assert xdc["wan_copies_per_version"]["pull_from_trainer"] >= 2
    assert xdc["wan_copies_per_version"]["tensorhub"] < xdc["wan_copies_per_version"]["pull_from_trainer"]
    assert {p.name for p in tmp_path.glob("*.png")} == {"lab_modes.png", "time_vs_readers.png", "time_vs_size.png"}


@pytest.mark.netns
def test_bench_transport_in_the_lab_compares_with_raw_flows_over_the_same_shaped_nics(no_leftovers, capsys):
    """`bench transport-lab --lab-mbit`: every process on its own host; rows for each reader count, TensorHub's
    readers serve each other (peer bytes), the raw flows all leave the holder's NIC."""
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    assert transport_lab.main(["--lab-mbit", "400", "--size-mb", "4", "--chunk-mb", "0.5", "--window", "4",
                           "--readers", "1,3", "--repeats", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    one, three = res["rows"]
    assert (one["readers"], three["readers"]) == (1, 3)
    assert one["peer_fraction"] == 0 and three["peer_fraction"] > 0
    for row in res["rows"]:
        assert row["tensorhub_mbit_s"] > 0 and row["raw_socket_mbit_s"] > 0 and row["ratio"] > 0


@pytest.mark.netns
@pytest.mark.slow
def test_raw_flows_over_the_cross_dc_wan_fill_it(no_leftovers, capsys):
    """`bench.wan_raw`: one plain TCP flow over the lab's shaped WAN reaches its rate (headers counted; tbf's burst
    lets the first 125 kB through at once), and flows to every reader at once carry one copy each."""
    from tensorhub_dev.bench import wan_raw

    assert wan_raw.main(["--size-mb", "8", "--rollouts", "2", "--wan-mbit", "200"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.8 < res["one_flow"]["of_floor"] <= 1.1, res
    assert res["all_flows"]["flows"] == 2 and res["all_flows"]["total_s"] >= 2 * res["floor_one_copy_s"] * 0.9


def test_delta_versions_draw_v2_from_v1_as_the_measured_profile_says():
    """`bench modes --delta`'s versions: bf16, whole MiB per tensor, v2 differing from v1 in about the profile's
    changed fraction (lr 1e-6: a few percent)."""
    import torch

    from tensorhub_verl.bench.delta_profile import default_profile
    from tensorhub_dev.bench.modes_roles import delta_versions

    v1, v2 = delta_versions(8, 1e-6, tensors=4)
    assert list(v1) == list(v2) == [f"layers.{i}.weight" for i in range(4)]
    assert all(t.dtype == torch.bfloat16 and t.numel() * 2 == 2 << 20 for t in v1.values())
    changed = sum(int((a.view(torch.int16) != b.view(torch.int16)).sum()) for a, b in zip(v1.values(), v2.values()))
    fraction = changed / sum(t.numel() for t in v1.values())
    assert 0 < fraction < 0.1 and fraction == pytest.approx(default_profile(1e-6).changed_fraction, rel=0.8)


def test_delta_extra_states_each_goal_against_the_encoded_delta():
    runs = {"tensorhub": {"total_s": 1.0, "wan_bytes": 120, "wan_bytes_into": {"dc0": 20, "dc1": 104},
                          "delta": {"transfer_total_s": 0.5}},
            "tensorhub_full": {"total_s": 8.0, "wan_bytes": 900, "wan_bytes_into": {"dc1": 880}},
            "pull_from_trainer": {"total_s": 30.0, "wan_bytes": 8000, "wan_bytes_into": {"dc1": 7900}},
            "delta_from_trainer": {"total_s": 3.0, "wan_bytes": 900, "wan_bytes_into": {"dc1": 800},
                                   "delta": {"transfer_total_s": 2.5}}}
    trainer = {"delta_bytes": 100, "bytes": 4000, "lr": 1e-6, "changed_fraction": 0.02, "encodings": {"ulp": 2},
               "encode_s": 0.1}
    x = modes._delta_extra("cross_dc", runs, trainer, "dc1")
    assert x["goals"]["vs_pull_from_trainer"] == {"goal": 19.0, "ratio": 30.0, "met": True, "ratio_without_apply": 60.0}
    assert x["goals"]["vs_delta_from_trainer"] == {"goal": 4.0, "ratio": 3.0, "met": False, "ratio_without_apply": 5.0}
    assert x["transfer_s"] == {"tensorhub": 0.5, "tensorhub_full": 8.0, "pull_from_trainer": 30.0,
                               "delta_from_trainer": 2.5}
    assert x["goals"]["wan_over_delta"]["ratio"] == 1.04 and x["goals"]["wan_over_delta"]["met"]
    assert x["wan_over_delta"]["pull_from_trainer"] == 79.0
    sa = modes._delta_extra("standalone", runs, trainer, None)
    assert set(sa["goals"]) == {"vs_delta_from_trainer"} and "wan_over_delta" not in sa


def test_delta_flag_takes_no_value_and_refuses_elastic(capsys):
    assert modes.main(["--delta", "--modes", "standalone,elastic"]) == 2
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["error"] == "ConfigError" and "elastic" in out["message"]


def test_delta_roles_update_readers_from_v1_each_way_on_loopback(tmp_path):
    """The roles of `bench modes --delta` as plain processes on loopback (no lab, no root): the trainer publishes
    v1, v2 and the deltas; each variant's reader holds v1 first, then updates to v2 as its variant says."""
    from tensorhub_dev.bench.modes import _DELTA_READS, DELTA_VARIANTS, LabProcess, _ROLES

    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    env, stop = {"UCX_TLS": "tcp"}, tmp_path / "stop"
    procs = []
    try:
        hub = LabProcess.on_this_host([*_ROLES, "hub", "--host", "127.0.0.1", "--port", "0", "--stop", str(stop),
                                       "--timeout", "240"], "hub", env)
        procs.append(hub)
        url = hub.expect("ready", 60)["url"]
        trainer = LabProcess.on_this_host([*_ROLES, "trainer", "--hub", url, "--size-mb", "4", "--chunk-mb", "1",
                                           "--private-copies", "2", "--delta-lr", "1e-6", "--stop", str(stop),
                                           "--timeout", "240"], "trainer", env)
        procs.append(trainer)
        ready = trainer.expect("ready", 120)
        assert 0 < ready["delta_bytes"] < ready["bytes"] / 5 and 0 < ready["changed_fraction"] < 0.1
        got = {}
        for variant in DELTA_VARIANTS:
            model, base, delta = _DELTA_READS[variant]
            go = tmp_path / f"go-{variant}"
            reader = LabProcess.on_this_host(
                [*_ROLES, "reader", "--hub", url, "--worker", variant, "--location", f"dc=dc0,rack=r1,node={variant}",
                 "--model", model.format(i=1), "--base-model", base.format(i=1), "--delta", delta, "--go", str(go),
                 "--stop", str(stop), "--timeout", "120"], variant, env)
            procs.append(reader)
            reader.expect("ready", 120)
            go.touch()
            got[variant] = reader.expect("fetched", 120)
    finally:
        stop.touch()
        for p in reversed(procs):
            p.wait(30)
    for variant in ("tensorhub", "delta_from_trainer"):
        d = got[variant]["delta"]
        assert d["used"] and d["fallback_chunks"] == 0 and d["delta_bytes"] == got[variant]["bytes"] <= ready["delta_bytes"] * 1.01
        # (b) does the apply TensorHub does (the same client code: decode, write, digest), timed the same way.
        assert d["apply_s"] > 0 and 0 <= d["apply_after_wire_s"] <= got[variant]["seconds"]
        # each of v1's chunks (1 MiB each) digested once as the base: ahead, or on landing
        assert d["base_ahead"] + d["landed_digests"] == ready["bytes"] >> 20
    for variant in ("tensorhub_full", "pull_from_trainer"):
        assert not got[variant]["delta"]["used"] and got[variant]["bytes"] >= ready["bytes"]
    assert set(got["delta_from_trainer"]["sources"]) == {"trainer"} == set(got["pull_from_trainer"]["sources"])


@pytest.mark.netns
@pytest.mark.slow
def test_cross_dc_tiny_delta_run(no_leftovers, capsys):
    """`bench modes --delta` in the lab: every variant's readers update from v1; TensorHub's delta crosses the WAN
    once (the readers read one copy of it from the trainer), every baseline reader pulls its own from the trainer."""
    pytest.importorskip("nixl_cu12" if importlib.util.find_spec("nixl_cu12") else "nixl_cu13", reason="no NIXL build installed")
    rc = modes.main(["--delta", "--modes", "cross_dc", "--size-mb", "8", "--rollouts", "2", "--nic-mbit", "400",
                     "--wan-mbit", "200", "--json"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, res
    xdc = res["modes"]["cross_dc"]
    runs, delta = xdc["runs"], xdc["delta"]["bytes"]
    assert set(runs) == set(modes.DELTA_VARIANTS) and "sim_vs_lab" not in res
    assert runs["tensorhub"]["delta"]["used"] == runs["delta_from_trainer"]["delta"]["used"] == 2
    assert runs["tensorhub"]["bytes_from"]["trainer"] == delta
    assert runs["delta_from_trainer"]["bytes_from"] == {"trainer": 2 * delta}
    assert runs["pull_from_trainer"]["bytes_from"] == {"trainer": 2 * xdc["delta"]["version_bytes"]}
    assert xdc["wan_bytes_into_readers_dc"]["tensorhub"] < xdc["wan_bytes_into_readers_dc"]["delta_from_trainer"]
    assert set(xdc["goals"]) == {"vs_pull_from_trainer", "vs_delta_from_trainer", "wan_over_delta"}
    # What each update asked of the lab's cores beside the readers' own: the hub answered their exchanges
    for run in runs.values():
        assert set(run["control_cpu_s"]) == {"hub", "trainer"} and run["control_cpu_s"]["hub"] > 0, run
        assert run["update_wall_s"] >= max(run["seconds"])
