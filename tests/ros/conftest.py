import pytest

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.bench.procs import Role


@pytest.fixture
def hub():
    server = th.start_hub(config=th.HubConfig(worker_timeout_s=10.0, heartbeat_s=0.5, lease_ttl_s=30.0,
                                              suspect_s=2.0))
    yield server
    server.stop()


@pytest.fixture
def roles():
    """Processes started by a test; all are stopped (killed if need be) when it ends."""
    started: list[Role] = []

    def start(target, *args) -> Role:
        role = Role(target, *args)
        started.append(role)
        return role

    yield start
    for role in started:
        try:
            role.send("stop")
        except Exception:
            pass
    for role in started:
        role.stop(timeout=10)


@pytest.fixture
def two_hub_processes():
    """Two ``tensorhub hub`` processes (a hub of shards or of regions); both stopped when the test ends."""
    procs = []
    try:
        for _ in range(2):
            procs.append(HubProcess(args=("--worker-timeout", "10")).start())
        yield procs
    finally:
        for p in procs:
            p.stop()
