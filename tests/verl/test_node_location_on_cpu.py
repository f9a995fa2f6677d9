"""Location labels per Ray node (``node_location``) and the hub's placement setting, without a cluster. The
multi-node path (labels read in each worker, hub placed on the head) runs in
tests/netlab/test_verl_across_hosts.py, on a Ray cluster across lab hosts."""

from __future__ import annotations

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl.config import TensorHubVerlConfig, hub_placement
from tensorhub_verl.verl.node_location import node_labels, worker_location


def test_node_labels_come_from_ray_then_the_nodes_environment():
    env = {"TENSORHUB_DC": "env-dc", "TENSORHUB_RACK": "env-rack", "TENSORHUB_TOKEN": "not-a-label"}
    assert node_labels({"tensorhub/dc": "ray-dc", "ray.io/node-id": "x"}, env) == {"dc": "ray-dc", "rack": "env-rack"}
    assert node_labels(None, {}) == {}
    # The node's labels win over the job's defaults; node defaults to the node's IP.
    assert worker_location({"dc": "d", "rack": "r"}, {"rack": "mine"}, "10.0.0.7") == {
        "dc": "d", "rack": "mine", "node": "10.0.0.7"}
    with pytest.raises(ConfigError, match="location label"):
        node_labels({"tensorhub/dc": "x" * 200})


def test_placements_parse_and_an_unknown_one_is_refused_naming_the_forms():
    assert hub_placement("head") == ("head", None, None)
    assert hub_placement("label:tensorhub/dc=dc1") == ("label", "tensorhub/dc", "dc1")
    assert hub_placement("resource:th_hub_host") == ("resource", "th_hub_host", None)
    with pytest.raises(ConfigError, match="label:KEY=VALUE"):
        TensorHubVerlConfig(hub_placement="rack7")


def test_null_job_labels_are_unset():
    assert TensorHubVerlConfig(location={"dc": None, "rack": "r1"}).location == {"rack": "r1"}
