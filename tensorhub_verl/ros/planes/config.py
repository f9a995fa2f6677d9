"""Settings of the data planes: which plane a client uses (``PlaneConfig``) and each plane's own settings.

Plain dataclasses, so that a client's configuration imports no plane: a plane's module (and NIXL's library) is
imported only when ``factory.create`` makes that plane.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from tensorhub_verl import errors
from tensorhub_verl.ros.planes.factory import TRANSPORTS

DEFAULT_BOUNCE_BYTES = 4 << 20
"""Bytes of one bounce buffer of the TCP plane (tcp_bounce.py): a few D2H/H2D copies' worth, small against a
chunk, bounded per connection."""

PROGRESS_MODES = ("events", "pump", "thread")


@dataclass(frozen=True, slots=True, kw_only=True)
class NixlConfig:
    """Settings of the NIXL plane (``ClientConfig.plane.nixl``)."""

    progress: str = "events"
    """Who drives UCX to serve peers' reads: 'events' (NIXL's thread, asleep until UCX has work), 'pump'
    (a Python thread polling every 0.5 ms) or 'thread' (NIXL's thread as its binding sets it: spinning).
    See NixlPlane."""
    net_devices: str | None = None
    """Network devices UCX uses and listens on (UCX_NET_DEVICES syntax: 'eth0', 'mlx5_0:1', ...).
    None: $UCX_NET_DEVICES if set, else 'lo' when the hub is on loopback (every peer is on this host) and the
    host has neither CUDA nor RDMA (``host.net_devices``), else UCX's default, which is every device: name
    the cluster interface in production."""

    def __post_init__(self) -> None:
        if self.progress not in PROGRESS_MODES:
            raise errors.ConfigError(f"progress must be one of {PROGRESS_MODES}, got {self.progress!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpConfig:
    """Settings of the TCP plane (``ClientConfig.plane.tcp``)."""

    host: str | None = None
    """Address the plane's server listens on and peers connect to. None: 127.0.0.1 for a loopback hub,
    else this host's address on the route to the hub."""
    streams: int = 2
    """TCP connections a reader keeps to each peer it reads from. Each has the next read's request sent ahead
    of the reply it receives, so one stream keeps the wire busy; more spread a fast link's copies over cores."""
    preconnect_peers: int = 4
    """At registration, connect to this many likely sources (the nearest holders of the newest versions), so a
    joiner's first fetch reads over open connections (the plane's metadata is just an address); 0: off."""

    bounce_bytes: int = DEFAULT_BOUNCE_BYTES
    """Size of each pinned bounce buffer CUDA memory crosses the socket through: one per holder connection and
    one per reader stream, made at its first CUDA read."""

    def __post_init__(self) -> None:
        if not 4096 <= self.bounce_bytes <= 1 << 30:
            raise errors.ConfigError(f"TcpConfig.bounce_bytes must be in [4096, 2**30], got {self.bounce_bytes}")
        if self.streams < 1:
            raise errors.ConfigError(f"TcpConfig.streams must be >= 1, got {self.streams}")
        if not 0 <= self.preconnect_peers <= 16:
            raise errors.ConfigError(f"preconnect_peers must be in [0, 16], got {self.preconnect_peers}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneConfig:
    """The data plane of a client (``ClientConfig.plane``): which one, and each plane's own settings."""

    kind: str = "auto"
    """'nixl' (NIXL/UCX: RDMA, shared memory, GPU memory, or TCP), 'tcp' (TCP streams; CUDA memory through pinned
    bounce buffers; close to a raw TCP flow where the link is the limit, docs/benchmarks.md), or 'auto'
    (factory.py's docstring says how it picks).
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
