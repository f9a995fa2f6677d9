"""What this host offers the data planes, and where its peers reach it: RDMA devices, CUDA, the network
devices UCX should use, the address to advertise. Probes of the host and the hub URL only; no plane imported."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

_RDMA_SYSFS = Path("/sys/class/infiniband")


def hub_is_loopback(hub_url: str) -> bool:
    """Whether the hub is on loopback, so every peer is on this host."""
    return _is_loopback(_hub_host(hub_url))


def rdma_present() -> bool:
    """Whether the kernel lists RDMA devices (InfiniBand, RoCE)."""
    return _RDMA_SYSFS.is_dir() and any(_RDMA_SYSFS.iterdir())


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def net_devices(configured: str | None, hub_url: str) -> str | None:
    """The explicit setting, else the environment's (None: UCX reads it), else loopback for a loopback hub on a
    host with neither CUDA nor RDMA. With either, UCX chooses (None): on a one-node GPU job its best wires are
    CUDA IPC and the RDMA NIC's own loopback, which a ``lo`` confinement would shut out."""
    if configured is not None or "UCX_NET_DEVICES" in os.environ:
        return configured
    if not hub_is_loopback(hub_url) or rdma_present() or cuda_present():
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
