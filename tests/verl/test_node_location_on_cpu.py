"""Across Ray nodes (a real two-node Ray cluster on this host): each worker's location labels are its own node's
(Ray node labels ``tensorhub/...``), the job's ``tensorhub.location`` only fills what a node does not give;
the hub actor runs where ``tensorhub.hub_placement`` says; ``hub_url_file: auto`` is a file of the Ray session
on the hub's node, removed when the hub stops."""

from __future__ import annotations

import os

import pytest
import ray

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.hub_actor import ensure_hub, stop_hub
from tensorhub_verl.verl.node_location import actor_node, node_labels, this_node, worker_location

pytestmark = pytest.mark.timeout(300)

HEAD = {"tensorhub/dc": "dc0", "tensorhub/rack": "r0"}
OTHER = {"tensorhub/dc": "dc1", "tensorhub/rack": "r1", "tensorhub/node": "far-1"}


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # another module's cluster: this module needs its own (ray_local re-inits after)
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "labels": HEAD, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    try:
        cluster.add_node(num_cpus=1, labels=OTHER, resources={"th_hub_host": 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="tensorhub-node-location", log_to_driver=False,
                 _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join(
                     filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}})
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@ray.remote(num_cpus=0)
class Probe:
    def where(self):
        return this_node()

    def checkpoint_engine_location(self, tensorhub: dict) -> dict:
        from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

        return TensorHubCheckpointEngine(is_master=True, **tensorhub)._location


def _probe_on(labels: dict) -> "ray.actor.ActorHandle":
    return Probe.options(label_selector={"tensorhub/dc": labels["tensorhub/dc"]}).remote()


def test_each_worker_takes_the_labels_of_its_own_node(two_nodes):
    near, far = _probe_on(HEAD), _probe_on(OTHER)
    (near_labels, _), (far_labels, far_ip) = ray.get([near.where.remote(), far.where.remote()], timeout=60)
    assert near_labels == {"dc": "dc0", "rack": "r0"}
    assert far_labels == {"dc": "dc1", "rack": "r1", "node": "far-1"} and far_ip == "127.0.0.1"
    # What the updater asks of verl's server actors (any actor): the node it runs on, from outside.
    assert ray.get(actor_node(far), timeout=60) == (far_labels, far_ip)
    # A trainer rank's checkpoint engine on each node: the node's dc/rack win over the job-wide default.
    job = {"location": {"dc": "job-dc", "rack": "job-rack", "gpu": "g0"}}
    assert ray.get(near.checkpoint_engine_location.remote(job), timeout=120) == {
        "dc": "dc0", "rack": "r0", "gpu": "g0", "node": "127.0.0.1"}
    assert ray.get(far.checkpoint_engine_location.remote(job), timeout=120) == {
        "dc": "dc1", "rack": "r1", "node": "far-1", "gpu": "g0"}


def test_node_labels_come_from_ray_then_the_nodes_environment():
    env = {"TENSORHUB_DC": "env-dc", "TENSORHUB_RACK": "env-rack", "TENSORHUB_TOKEN": "not-a-label"}
    assert node_labels({"tensorhub/dc": "ray-dc", "ray.io/node-id": "x"}, env) == {"dc": "ray-dc", "rack": "env-rack"}
    assert node_labels(None, {}) == {}
    assert worker_location({"dc": "d", "rack": "r"}, {"rack": "mine"}, "10.0.0.7") == {
        "dc": "d", "rack": "mine", "node": "10.0.0.7"}
    with pytest.raises(ConfigError, match="location label"):
        node_labels({"tensorhub/dc": "x" * 200})


def _hub_node(cfg: TensorHubVerlConfig) -> dict:
    return ray.get(actor_node(ray.get_actor(cfg.hub_actor_name, namespace=cfg.hub_namespace)), timeout=60)[0]


@pytest.mark.parametrize("placement, dc", [("head", "dc0"), ("label:tensorhub/dc=dc1", "dc1"),
                                           ("resource:th_hub_host", "dc1")])
def test_the_hub_runs_where_the_placement_says(two_nodes, placement, dc):
    cfg = TensorHubVerlConfig(hub_actor_name=f"hub-{dc}-{placement.split(':')[0]}", hub_namespace="th-placement",
                              hub_host="127.0.0.1", hub_placement=placement)
    try:
        ensure_hub(cfg)
        assert _hub_node(cfg)["dc"] == dc
    finally:
        stop_hub(cfg.hub_actor_name, cfg.hub_namespace)


def test_an_unknown_placement_is_refused_naming_the_forms():
    with pytest.raises(ConfigError, match="label:KEY=VALUE"):
        TensorHubVerlConfig(hub_placement="rack7")


def test_an_auto_url_file_lives_in_the_ray_session_and_goes_with_the_hub(two_nodes):
    cfg = TensorHubVerlConfig(hub_actor_name="hub-auto-file", hub_namespace="th-url-file", hub_host="127.0.0.1",
                              hub_url_file="auto")
    try:
        url = ensure_hub(cfg)
        actor = ray.get_actor(cfg.hub_actor_name, namespace=cfg.hub_namespace)
        path = ray.get(actor.url_file.remote(), timeout=30)
        session_dir = ray._private.worker._global_node.get_session_dir_path()
        assert path == os.path.join(session_dir, "tensorhub", "th-url-file.hub-auto-file.url")
        with open(path) as f:
            assert f.read().strip() == url
    finally:
        stop_hub(cfg.hub_actor_name, cfg.hub_namespace)
    assert not os.path.exists(path), "the stopped hub left its URL file behind"
