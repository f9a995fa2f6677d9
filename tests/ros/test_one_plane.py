"""One data plane per hub, chosen by the hub: a worker declaring another plane, or one the hub does not know, is
refused at registration with an error naming both planes and the setting that fixes it, and a worker left on
'auto' takes the hub's. Attacked from outside: a registration declaring plane 'zzz' (kept alive by heartbeats)
denies the hub to nobody, on a hub process that restarts too, where it may register first."""

import pytest

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.ros.planes.one_plane import check_hub_plane, hub_plane
from tensorhub_verl.ros.planes.factory import choose

from tests.ros.outsiders import Outsider
from tests.ros.roles import holder, make_weights

TOKEN = "one-plane-token"


def test_the_hub_chooses_the_plane_and_refuses_a_worker_on_another(roles):
    hub = th.start_hub(plane="tcp")
    try:
        trainer = roles(holder, hub.url, "tcp-trainer", 3, 1.0, 256 << 10, 1, None, "tcp")
        trainer.result(120)
        with pytest.raises(errors.PlaneMismatch) as refused:
            th.connect(hub.url, "nixl-reader", transport="nixl")
        message = str(refused.value)
        assert "'nixl'" in message and "this hub's plane is 'tcp'" in message
        assert "transport='tcp'" in message and "PlaneConfig(kind='tcp')" in message
        assert list(hub.state.status().workers) == ["tcp-trainer"]  # the refused worker left no record
        with th.connect(hub.url, "auto-reader") as reader:  # 'auto' takes the hub's plane
            assert reader._plane.name == "tcp" and reader.fetch("policy", 1).failed_reads == 0
        trainer.send("stop")
        trainer.stop(timeout=30)
        with pytest.raises(errors.PlaneMismatch):  # no TCP worker left: still the hub's plane, not the next one's
            th.connect(hub.url, "nixl-writer", transport="nixl")
    finally:
        hub.stop()


def test_an_auto_hub_resolves_its_plane_once_for_its_own_url():
    hub = th.start_hub()
    try:
        assert hub.state.plane == choose("auto", hub.url)[0]
        with th.connect(hub.url, "w") as worker:
            assert worker._plane.name == hub.state.plane
            worker.publish("policy", 1, make_weights(1, 0.25))
    finally:
        hub.stop()


def test_a_worker_declaring_plane_zzz_denies_the_hub_to_nobody_also_across_a_restart():
    hub = HubProcess(args=("--plane", "tcp", "--worker-timeout", "5")).start()
    attackers: list[Outsider] = []
    try:
        for round_ in range(2):
            # First to register (after the restart too): its plane is refused, it leaves no record.
            with pytest.raises(errors.PlaneMismatch, match="unknown data plane 'zzz'"):
                attackers.append(Outsider(hub.url, None, f"zzz-{round_}", plane="zzz"))
            with th.connect(hub.url, f"trainer-{round_}", transport="tcp") as trainer, \
                    th.connect(hub.url, f"reader-{round_}") as reader:
                trainer.publish("policy", 1, make_weights(round_, 0.25))
                assert reader.fetch("policy", 1, hold=False).failed_reads == 0
                assert sorted(trainer.status()["workers"]) == [f"reader-{round_}", f"trainer-{round_}"]
            hub.kill()
            hub.start()
    finally:
        hub.stop()


def test_the_rule_and_its_errors():
    check_hub_plane("w", "tcp", "tcp")
    with pytest.raises(errors.PlaneMismatch, match="unknown data plane 'zzz' \\(known: nixl, tcp\\)"):
        check_hub_plane("w", "zzz", "tcp")
    with pytest.raises(errors.ConfigError, match="got 'zzz'"):
        hub_plane("zzz", "http://127.0.0.1:1")
    with pytest.raises(errors.ConfigError, match="HubConfig.plane"):
        th.HubConfig(plane="zzz")
    assert hub_plane("tcp", "http://127.0.0.1:1") == "tcp"
