import pytest

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.bench.procs import Role


def _plane_of(request) -> str:
    """The data plane a test runs on: its indirect parameter of ``hub``, else the value of a parameter of the
    test that names a plane ('nixl' or 'tcp'), else 'auto'."""
    if hasattr(request, "param"):
        return request.param
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    named = {v for v in params.values() if isinstance(v, str) and v in ("nixl", "tcp")}
    return named.pop() if len(named) == 1 else "auto"


@pytest.fixture
def hub(request):
    """A hub on loopback; its data plane is the test's (``_plane_of``: ``@pytest.mark.parametrize("hub",
    ["tcp"], indirect=True)``, or a parameter naming a plane), else 'auto' (NIXL on loopback)."""
    server = th.start_hub(config=th.HubConfig(worker_timeout_s=10.0, heartbeat_s=0.5, lease_ttl_s=30.0,
                                              suspect_s=2.0, plane=_plane_of(request)))
    yield server
    server.stop()


class Roles:
    """Starts a test's processes (``roles(target, *args)``); ``stop_all`` asks each to stop and kills the ones
    still running after ``timeout``. A test whose hub goes away first stops its roles before that: a role
    closing its client says goodbye to the hub, retrying a dead one for several seconds."""

    def __init__(self):
        self.started: list[Role] = []

    def __call__(self, target, *args) -> Role:
        role = Role(target, *args)
        self.started.append(role)
        return role

    def stop_all(self, timeout: float = 10) -> None:
        for role in self.started:
            try:
                role.send("stop")
            except Exception:
                pass
        for role in self.started:
            role.stop(timeout=timeout)
        self.started.clear()


@pytest.fixture
def roles():
    """Processes started by a test; all are stopped (killed if need be) when it ends."""
    started = Roles()
    yield started
    started.stop_all()


def _two_hubs():
    procs = []
    try:
        for _ in range(2):
            procs.append(HubProcess(args=("--worker-timeout", "10", "--plane", "tcp")).start())
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture
def two_hub_processes():
    """Two ``tensorhub hub`` processes on the TCP plane (a hub of shards or of regions); both stopped when the
    test ends."""
    yield from _two_hubs()


@pytest.fixture(scope="module")
def two_hub_processes_per_module():
    """As ``two_hub_processes``, shared by a module's tests (each uses its own models and workers)."""
    yield from _two_hubs()
