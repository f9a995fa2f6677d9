"""Which data plane a client uses, and the registry that creates it by name.

Planes register by name with the module and class that implement them (``register_plane``, as vLLM's
weight-transfer factory does); the class is looked up when a plane is created, and NIXL's library is imported
only when a NIXL plane is created (a broken NIXL install raises its own ImportError then; a TCP-only host never
imports it). A duplicate name and an unknown name raise.

``auto`` picks NIXL wherever it is faster than TCP streams: a loopback hub (every peer is on this host: UCX's
shared memory and CUDA IPC beat any socket), RDMA devices (GPUDirect RDMA included), or a UCX_TLS that names more
than TCP. Otherwise the wire between hosts is TCP, and TCP streams beat UCX's emulated GET over TCP
(docs/measurements.md), on CUDA hosts too: the TCP plane moves GPU memory through pinned bounce buffers, whose
device copies run far above any TCP link's speed (docs/gpu.md). The price there: peers on the same host also
read over loopback TCP instead of CUDA IPC; a job whose readers mostly share a host with their source can set
``PlaneConfig.kind='nixl'``. Every worker of one hub must use the same plane:
the hub refuses a worker whose plane differs from its other workers' (``errors.PlaneMismatch``), so pick
``PlaneConfig.kind`` explicitly on clusters whose hosts differ.
"""

from __future__ import annotations

import dataclasses
import importlib
import ipaddress
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tensorhub_verl import errors
from tensorhub_verl.ros.planes.base import DataPlane
from tensorhub_verl.ros.planes.nixl import NixlConfig
from tensorhub_verl.ros.planes.tcp import TcpConfig

logger = logging.getLogger("tensorhub_verl.ros.planes.registry")

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
_RDMA_SYSFS = Path("/sys/class/infiniband")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneConfig:
    """The data plane of a client (``ClientConfig.plane``): which one, and each plane's own settings."""

    kind: str = "auto"
    """'nixl' (NIXL/UCX: RDMA, shared memory, GPU memory, or TCP), 'tcp' (TCP streams; CUDA memory through pinned
    bounce buffers; close to a raw TCP flow where the link is the limit, docs/measurements.md), or 'auto' (see this module's docstring).
    Every worker of one hub must use the same plane."""
    nixl: NixlConfig = field(default_factory=NixlConfig)
    tcp: TcpConfig = field(default_factory=TcpConfig)

    def __post_init__(self) -> None:
        if self.kind not in TRANSPORTS:
            raise errors.ConfigError(f"the data plane (PlaneConfig.kind, flat: transport) must be one of "
                                     f"{TRANSPORTS}, got {self.kind!r}")

    def settings(self, name: str) -> Any:
        """The settings of plane ``name``."""
        return getattr(self, name)

    @classmethod
    def of(cls, value: "PlaneConfig | Mapping[str, Any]") -> "PlaneConfig":
        """From a PlaneConfig or plain data ({'kind': 'tcp', 'tcp': {'streams': 4}}, e.g. from a verl config)."""
        if isinstance(value, PlaneConfig):
            return value
        nested = {"nixl": NixlConfig, "tcp": TcpConfig}
        try:
            return cls(**{k: nested[k](**v) if k in nested and isinstance(v, Mapping) else v
                          for k, v in value.items()})
        except TypeError as e:
            raise errors.ConfigError(f"plane settings {dict(value)!r} are invalid: {e}") from e


FLAT_FIELDS = {"transport": ("kind",), "progress": ("nixl", "progress"), "net_devices": ("nixl", "net_devices"),
               "tcp_host": ("tcp", "host"), "tcp_streams": ("tcp", "streams"),
               "preconnect_peers": ("tcp", "preconnect_peers"), "tcp_bounce_bytes": ("tcp", "bounce_bytes")}
"""The flat ``ClientConfig`` keyword of each plane setting (``connect(transport='tcp', tcp_streams=4)``)."""


def from_flat(base: PlaneConfig, flat: Mapping[str, Any]) -> PlaneConfig:
    """``base`` with the flat settings (``FLAT_FIELDS``) applied."""
    top: dict[str, Any] = {}
    per_plane: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        path = FLAT_FIELDS[key]
        if len(path) == 1:
            top[path[0]] = value
        else:
            per_plane.setdefault(path[0], {})[path[1]] = value
    for plane, values in per_plane.items():
        top[plane] = dataclasses.replace(getattr(base, plane), **values)
    return dataclasses.replace(base, **top)


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
    if _is_loopback(_hub_host(hub_url)):
        return "nixl", "every peer is on this host (loopback hub): UCX uses shared memory"
    if rdma_present():
        return "nixl", "RDMA devices present"
    if cuda_present():
        return "tcp", "no RDMA, peers on other hosts: CUDA memory crosses TCP through pinned bounce buffers"
    return "tcp", "no RDMA, peers on other hosts"


def rdma_present() -> bool:
    """Whether the kernel lists RDMA devices (InfiniBand, RoCE)."""
    return _RDMA_SYSFS.is_dir() and any(_RDMA_SYSFS.iterdir())


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def create(config: PlaneConfig, worker: str, hub_url: str, io_timeout_s: float) -> DataPlane:
    """The plane ``config`` asks for (``auto``: ``choose``), named uniquely for this process."""
    name, why = choose(config.kind, hub_url)
    module, class_name = _PLANES[name]
    plane_class = getattr(importlib.import_module(module), class_name)
    logger.info("%s: %s data plane (%s)", worker, name, why)
    return plane_class.from_config(f"{worker}-{uuid.uuid4().hex[:8]}", config.settings(name), hub_url,
                                   io_timeout_s)


def net_devices(configured: str | None, hub_url: str) -> str | None:
    """The explicit setting, else the environment's (None: UCX reads it), else loopback for a loopback hub on a
    host with neither CUDA nor RDMA. With either, UCX chooses (None): on a one-node GPU job its best wires are
    CUDA IPC and the RDMA NIC's own loopback, which a ``lo`` confinement would shut out."""
    if configured is not None or "UCX_NET_DEVICES" in os.environ:
        return configured
    if not _is_loopback(_hub_host(hub_url)) or rdma_present() or cuda_present():
        return None
    return "lo"


def advertised_host(hub_url: str) -> str:
    """The address peers can reach this process on: loopback for a loopback hub, else this host's address on
    the route to the hub (a connected UDP socket sends nothing; it only asks the kernel for the route)."""
    host = _hub_host(hub_url)
    if _is_loopback(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def _hub_host(hub_url: str) -> str:
    return hub_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
