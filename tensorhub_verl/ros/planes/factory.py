"""Which data plane a client uses, and the factory that creates it by name.

Planes register by name with the module and class that implement them (``register_plane``, as vLLM's
weight-transfer factory does); the class is looked up when a plane is created, and NIXL's library is imported
only when a NIXL plane is created (a broken NIXL install raises its own ImportError then; a TCP-only host never
imports it). A duplicate name and an unknown name raise.

``auto`` picks NIXL wherever it is faster than TCP streams: a loopback hub (every peer is on this host: UCX's
shared memory and CUDA IPC beat any socket), RDMA devices (GPUDirect RDMA included), or a UCX_TLS that names more
than TCP. Otherwise the wire between hosts is TCP, and TCP streams beat UCX's emulated GET over TCP
(docs/benchmarks.md), on CUDA hosts too: the TCP plane moves GPU memory through pinned bounce buffers, whose
device copies run far above any TCP link's speed (docs/gpu.md). The price there: peers on the same host also
read over loopback TCP instead of CUDA IPC; a job whose readers mostly share a host with their source can set
``PlaneConfig.kind='nixl'``. Every worker of one hub uses the hub's plane (``HubConfig.plane``,
``planes/one_plane.py``): a client on ``auto`` asks the hub which, and the hub refuses a worker that declares
another (``errors.PlaneMismatch``).
"""

from __future__ import annotations

import importlib
import logging
import os
import uuid
from typing import TYPE_CHECKING

from tensorhub_verl import errors
from tensorhub_verl.ros.planes import host
from tensorhub_verl.ros.planes.base import DataPlane

if TYPE_CHECKING:
    from tensorhub_verl.ros.planes.config import PlaneConfig

logger = logging.getLogger("tensorhub_verl.ros.planes.factory")

_PLANES: dict[str, tuple[str, str]] = {}
"""name -> (module, class) of each registered plane."""


def register_plane(name: str, module: str, class_name: str) -> None:
    """Registers a plane class by name, imported when a plane of that name is first created."""
    if name in _PLANES or name == "auto":
        raise errors.ConfigError(f"a data plane named {name!r} is already registered (or the name is reserved)")
    _PLANES[name] = (module, class_name)


def plane_names() -> tuple[str, ...]:
    return tuple(_PLANES)


register_plane("nixl", "tensorhub_verl.ros.planes.nixl", "NixlPlane")
register_plane("tcp", "tensorhub_verl.ros.planes.tcp", "TcpPlane")

TRANSPORTS = ("auto", *_PLANES)
"""Values of ``PlaneConfig.kind``."""
_TCP_ONLY_TLS = {"tcp", "self"}


def choose(transport: str, hub_url: str) -> tuple[str, str]:
    """(a registered plane name, why)."""
    if transport not in TRANSPORTS:
        raise errors.ConfigError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport != "auto":
        return transport, "configured"
    tls = os.environ.get("UCX_TLS")
    if tls is not None:
        names = {name.strip() for name in tls.split(",")}
        if not tls.startswith("^") and names <= _TCP_ONLY_TLS:
            return "tcp", f"UCX_TLS={tls} limits the wire to TCP"
        return "nixl", f"UCX_TLS={tls}"
    if host.hub_is_loopback(hub_url):
        return "nixl", "every peer is on this host (loopback hub): UCX uses shared memory"
    if host.rdma_present():
        return "nixl", "RDMA devices present"
    if host.cuda_present():
        return "tcp", "no RDMA, peers on other hosts: CUDA memory crosses TCP through pinned bounce buffers"
    return "tcp", "no RDMA, peers on other hosts"


def create(config: PlaneConfig, worker: str, hub_url: str, io_timeout_s: float,
           hub_plane: str | None = None) -> DataPlane:
    """The plane ``config`` asks for, named uniquely for this process. ``auto``: ``hub_plane`` (the plane the hub
    says its workers use, ``planes/one_plane.py``) when given, else ``choose``."""
    if config.kind == "auto" and hub_plane is not None:
        if hub_plane not in _PLANES:
            raise errors.PlaneMismatch(f"the hub's data plane {hub_plane!r} is not one this client has "
                                       f"({', '.join(_PLANES)}): run the hub and its workers at the same "
                                       f"tensorhub_verl version", plane="auto", hub_plane=hub_plane)
        name, why = hub_plane, "the hub's plane"
    else:
        name, why = choose(config.kind, hub_url)
    module, class_name = _PLANES[name]
    plane_class = getattr(importlib.import_module(module), class_name)
    logger.info("%s: %s data plane (%s)", worker, name, why)
    return plane_class.from_config(f"{worker}-{uuid.uuid4().hex[:8]}", config.settings(name), hub_url,
                                   io_timeout_s)
