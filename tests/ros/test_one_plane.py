"""One data plane per hub: a worker whose plane differs from the hub's other live workers' is refused at
registration, with an error naming both planes and the setting that fixes it (not later, as re-plans)."""

import pytest

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.planes.one_plane import check_one_plane

from tests.ros.roles import holder, make_weights


def test_a_worker_on_another_plane_is_refused_at_registration(hub, roles):
    trainer = roles(holder, hub.url, "tcp-trainer", 3, 1.0, 256 << 10, 1, None, "tcp")
    trainer.result(120)
    with pytest.raises(errors.PlaneMismatch) as refused:
        th.connect(hub.url, "nixl-reader", transport="nixl")
    message = str(refused.value)
    assert "'nixl'" in message and "'tcp'" in message and "tcp-trainer" in message
    assert "transport='tcp'" in message and "PlaneConfig(kind='tcp')" in message
    assert list(hub.state.status().workers) == ["tcp-trainer"]  # the refused worker left no record
    with th.connect(hub.url, "tcp-reader", transport="tcp") as reader:  # the setting the error names
        assert reader.fetch("policy", 1).failed_reads == 0
    trainer.send("stop")
    trainer.stop(timeout=30)
    with th.connect(hub.url, "nixl-writer", transport="nixl") as nixl:  # no TCP worker left: NIXL is admitted
        nixl.publish("other", 1, make_weights(2, 1.0))


def test_the_rule_compares_with_the_other_workers_only():
    check_one_plane("w", "tcp", {})
    check_one_plane("w", "tcp", {"a": "tcp", "b": "tcp"})
    with pytest.raises(errors.PlaneMismatch) as refused:
        check_one_plane("w", "tcp", {"a": "tcp", "b": "nixl"})
    assert (refused.value.plane, refused.value.hub_plane) == ("tcp", "nixl")
