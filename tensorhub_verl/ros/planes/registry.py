"""Which data plane a client uses: NIXL/UCX or plain TCP streams, by configuration or picked from the host.

``auto`` picks NIXL wherever it is faster than TCP streams or TCP cannot serve: a loopback hub (every peer is on
this host, and UCX's shared memory beats any socket: 1.2-1.5x a raw socket copy here), RDMA devices, CUDA
(GPUDirect, CUDA IPC; the TCP plane serves CPU memory only) or a UCX_TLS that names more than TCP. Otherwise the
wire between hosts is TCP, and TCP streams beat UCX's emulated GET over TCP (bench transport: ~0.9-1.0 of a raw
socket vs 0.6-0.7). A reader and a holder must use the same plane: one that gets metadata of the other kind
treats that peer as unusable (a re-plan), so pick ``transport`` explicitly on clusters whose hosts differ.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import uuid
from pathlib import Path

from tensorhub_verl import errors
from tensorhub_verl.ros.planes.base import Transport

logger = logging.getLogger("tensorhub_verl.ros.planes.registry")

TRANSPORTS = ("auto", "nixl", "tcp")
_TCP_ONLY_TLS = {"tcp", "self"}
_RDMA_SYSFS = Path("/sys/class/infiniband")


def choose(transport: str, hub_url: str) -> tuple[str, str]:
    """(``"nixl"`` or ``"tcp"``, why)."""
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
        return "nixl", "CUDA present"
    return "tcp", "no RDMA, no CUDA, peers on other hosts"


def rdma_present() -> bool:
    """Whether the kernel lists RDMA devices (InfiniBand, RoCE)."""
    return _RDMA_SYSFS.is_dir() and any(_RDMA_SYSFS.iterdir())


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def create(config, worker: str, hub_url: str) -> Transport:
    """The transport ``config`` (a ClientConfig) asks for, named uniquely for this process."""
    kind, why = choose(config.transport, hub_url)
    agent_name = f"{worker}-{uuid.uuid4().hex[:8]}"
    logger.info("%s: %s data plane (%s)", worker, kind, why)
    if kind == "tcp":
        from tensorhub_verl.ros.planes.tcp import TcpTransport

        return TcpTransport(agent_name, config.tcp_host or advertised_host(hub_url), streams=config.tcp_streams,
                            io_timeout_s=config.read_timeout_s)
    from tensorhub_verl.ros.planes.nixl import NixlTransport

    return NixlTransport(agent_name, progress=config.progress, net_devices=net_devices(config.net_devices, hub_url))


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
