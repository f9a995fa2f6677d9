"""Shared fixtures of the verl integration tests (marker ``verl``; they need verl 0.9.1 installed).

Everything runs on CPU: real processes, a real hub and real ROS transfers (NIXL over UCX tcp/sm).
Ray is pinned to 127.0.0.1 (these machines' eth0 address is not routable between test processes).
"""

from __future__ import annotations

import os
import socket

import pytest

from tests.requires import require

require("verl", reason="the verl integration tests need verl installed (pip install '.[verl]')")

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("UCX_TLS", "tcp,sm,self")


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.verl)


@pytest.fixture(scope="session")
def _ray_session():
    """Shuts down at the end of the run whatever Ray cluster ``ray_local`` (re)started."""
    import ray

    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """A one-node local Ray cluster, started once and kept for the run (started again after a module that needed
    a cluster of its own, e.g. test_node_location_on_cpu's two nodes, shut it down)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 namespace="tensorhub-tests",
                 # Workers unpickle tests.verl.fakes classes: they need the repository root on their path.
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "UCX_TLS": "tcp,sm,self",
                                           "PYTHONPATH": os.pathsep.join(filter(None, [
                                               os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                               os.environ.get("PYTHONPATH")]))}})
    yield ray


@pytest.fixture
def hub():
    import tensorhub_verl as th

    server = th.start_hub(host="127.0.0.1", port=0)
    yield server
    server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
