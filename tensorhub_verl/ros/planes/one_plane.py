"""One data plane per hub, chosen by the hub: a reader can read only from holders on its own plane (NIXL metadata
means nothing to a TCP reader, and the reverse), so every worker of a hub uses the hub's plane.

The hub's configuration names it (``HubConfig.plane``); ``auto`` resolves once, when the hub starts, by the same
rule a client's ``auto`` follows for that hub's URL (``planes/factory.choose``: NIXL for a loopback hub, RDMA
devices or a UCX_TLS beyond TCP; else TCP). It never depends on which worker registers first: a worker declaring
another plane, or one this hub does not know, is refused at registration (``PlaneMismatch``), and a client left on
``auto`` asks the hub for its plane (``GET /v1/hub``) before it creates one.
"""

from __future__ import annotations

from tensorhub_verl.errors import ConfigError, PlaneMismatch

AUTO = "auto"


def known_planes() -> tuple[str, ...]:
    """The registered data planes' names (``planes/factory.py``)."""
    from tensorhub_verl.ros.planes.factory import plane_names

    return plane_names()


def hub_plane(configured: str, hub_url: str) -> str:
    """The plane of a hub configured with ``configured`` (a plane name or ``auto``) and serving ``hub_url``."""
    if configured == AUTO:
        from tensorhub_verl.ros.planes.factory import choose

        return choose(AUTO, hub_url)[0]
    if configured not in known_planes():
        raise ConfigError(f"the hub's data plane must be 'auto' or one of {known_planes()}, got {configured!r}")
    return configured


def check_hub_plane(worker: str, plane: str, hub: str) -> None:
    """Raises PlaneMismatch when ``plane`` (what ``worker`` declares) is not ``hub`` (the hub's plane)."""
    if plane == hub:
        return
    known = known_planes()
    what = f"an unknown data plane {plane!r} (known: {', '.join(known)})" if plane not in known else \
        f"the {plane!r} data plane"
    raise PlaneMismatch(
        f"worker {worker!r} registers with {what}, but this hub's plane is {hub!r}: every worker of a hub uses "
        f"the hub's plane, which the hub's configuration chooses (HubConfig.plane, tensorhub hub --plane). Leave "
        f"the worker's transport on 'auto' (it then asks the hub) or set it to {hub!r}: "
        f"ClientConfig(plane=PlaneConfig(kind={hub!r})) or connect(..., transport={hub!r}); in a verl job "
        f"tensorhub.transport={hub}, and tensorhub attach-vllm --transport {hub}", plane=plane, hub_plane=hub)
