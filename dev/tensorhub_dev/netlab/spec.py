"""Declarative description of an emulated cluster, and the pure plan that builds it.

`plan_lab(spec, prefix)` turns a `LabSpec` into namespaces, links, addresses and shaping
rules without touching the system, so the address plan and the shaping are unit-testable.
`tensorhub_dev.netlab.lab` applies the plan with `ip` and `tc`.

Shape of one datacenter (every box is a network namespace; `=` is a shaped veth):

    host ns "eth0" = "h-<host>" [rack ns br0] "uplink" = "r-<rack>" [dc ns br0] "wan" = "d-<dc>" [router ns]

- host NIC: tbf on both veth ends (eth0 egress = upload, h-<host> egress = download);
- rack uplink: tbf on both ends ("uplink" = leaving the rack, "r-<rack>" = entering it);
- WAN: tbf on both ends ("wan" = leaving the dc, "d-<dc>" = entering it). Only routed (cross-dc)
  traffic reaches the router, so the router's `d-<dc>` tx_bytes count exactly the bytes that crossed
  into <dc> over the WAN.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from tensorhub_verl.errors import ConfigError

# Interface names are at most 15 bytes; "h-" + host name must fit.
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_HOST_OFFSET = 10  # .1 is the dc's router; .10 and up are hosts
_MAX_HOSTS_PER_DC = 254 - _HOST_OFFSET


@dataclass(frozen=True, kw_only=True, slots=True)
class RackSpec:
    name: str
    """Rack label, unique within its datacenter ([a-z][a-z0-9]{0,11})."""
    hosts: tuple[str, ...]
    """Host names, unique in the whole lab ([a-z][a-z0-9]{0,11})."""
    uplink_mbit: float | None = None
    """Overrides LabSpec.rack_uplink_mbit for this rack."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DatacenterSpec:
    name: str
    """Datacenter label, unique in the lab."""
    racks: tuple[RackSpec, ...]
    """Racks of this datacenter; at least one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LabSpec:
    datacenters: tuple[DatacenterSpec, ...]
    """At least one; with two or more, a router namespace joins them over the WAN link."""
    nic_mbit: float | None = None
    """Rate of every host NIC, each direction; None leaves it unshaped."""
    rack_uplink_mbit: float | None = None
    """Rate of every rack uplink, each direction; None leaves it unshaped."""
    wan_mbit: float | None = None
    """Rate of each datacenter's WAN access link, each direction; None leaves it unshaped."""
    subnet: str = "10.77.0.0/16"
    """Private /16 used only inside the lab; datacenter i gets the i-th /24."""
    queue_ms: float = 50.0
    """Depth of each shaped link's queue (tbf's latency: one FIFO), in ms of its rate: a small packet, such as a
    hub exchange, waits behind up to this much bulk data on a busy link."""

    def __post_init__(self) -> None:
        if not self.datacenters:
            raise ConfigError("LabSpec.datacenters: give at least one datacenter")
        if self.queue_ms <= 0:
            raise ConfigError(f"LabSpec.queue_ms={self.queue_ms}: must be > 0")
        net = ipaddress.ip_network(self.subnet)
        if net.prefixlen != 16 or not net.is_private or net.is_loopback or net.version != 4:
            raise ConfigError(f"LabSpec.subnet={self.subnet!r}: must be a private IPv4 /16 (e.g. 10.77.0.0/16)")
        for name, rate in (("nic_mbit", self.nic_mbit), ("rack_uplink_mbit", self.rack_uplink_mbit),
                           ("wan_mbit", self.wan_mbit)):
            if rate is not None and rate <= 0:
                raise ConfigError(f"LabSpec.{name}={rate}: must be > 0 or None (unshaped)")
        seen_dc: set[str] = set()
        seen_host: set[str] = set()
        for dc in self.datacenters:
            _check_name("datacenter", dc.name)
            if dc.name in seen_dc:
                raise ConfigError(f"datacenter {dc.name!r} appears twice")
            seen_dc.add(dc.name)
            if not dc.racks:
                raise ConfigError(f"datacenter {dc.name!r}: give at least one rack")
            seen_rack: set[str] = set()
            n_hosts = 0
            for rack in dc.racks:
                _check_name("rack", rack.name)
                if rack.name in seen_rack:
                    raise ConfigError(f"rack {rack.name!r} appears twice in {dc.name!r}")
                seen_rack.add(rack.name)
                if rack.uplink_mbit is not None and rack.uplink_mbit <= 0:
                    raise ConfigError(f"rack {dc.name}/{rack.name}: uplink_mbit must be > 0 or None")
                for host in rack.hosts:
                    _check_name("host", host)
                    if host in seen_host:
                        raise ConfigError(f"host {host!r} appears twice (host names are lab-wide)")
                    seen_host.add(host)
                n_hosts += len(rack.hosts)
            if n_hosts > _MAX_HOSTS_PER_DC:
                raise ConfigError(f"datacenter {dc.name!r} has {n_hosts} hosts; at most {_MAX_HOSTS_PER_DC}")
        if len(self.datacenters) > 255:
            raise ConfigError("at most 255 datacenters fit the /16")

    @staticmethod
    def uniform(*, dcs: int = 1, racks_per_dc: int = 1, hosts_per_rack: int = 2, nic_mbit: float | None = None,
                rack_uplink_mbit: float | None = None, wan_mbit: float | None = None) -> "LabSpec":
        """dc0..dcN, racks r0.., hosts named h<dc><rack><i> style: d0r0h0 -> "d0r0h0"."""
        return LabSpec(
            datacenters=tuple(
                DatacenterSpec(name=f"dc{d}", racks=tuple(
                    RackSpec(name=f"r{r}", hosts=tuple(f"d{d}r{r}h{h}" for h in range(hosts_per_rack)))
                    for r in range(racks_per_dc)))
                for d in range(dcs)),
            nic_mbit=nic_mbit, rack_uplink_mbit=rack_uplink_mbit, wan_mbit=wan_mbit)


def _check_name(kind: str, name: str) -> None:
    if not _NAME_RE.match(name):
        raise ConfigError(f"{kind} name {name!r}: use [a-z][a-z0-9]{{0,11}} (it becomes part of an interface name)")


# ---- the plan: plain data, no side effects --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostPlan:
    name: str
    dc: str
    rack: str
    netns: str
    ip: str
    """Address of the host's `eth0`, inside the lab subnet."""
    gateway: str | None
    """The dc router's address, when the lab has a router."""


@dataclass(frozen=True, slots=True)
class VethPlan:
    a_ns: str
    a_if: str
    b_ns: str
    b_if: str
    a_mbit: float | None
    """tbf rate on a_if's egress (traffic a -> b)."""
    b_mbit: float | None
    """tbf rate on b_if's egress (traffic b -> a)."""


@dataclass(frozen=True, slots=True)
class LabPlan:
    prefix: str
    hosts: tuple[HostPlan, ...]
    bridges: tuple[tuple[str, str], ...]
    """(netns, bridge name) pairs; every non-host, non-router namespace has one bridge `br0`."""
    veths: tuple[VethPlan, ...]
    ports: tuple[tuple[str, str, str], ...]
    """(netns, interface, bridge): interfaces enslaved to a bridge."""
    router_ns: str | None
    router_ifs: tuple[tuple[str, str], ...]
    """(dc name, router interface) with the dc router address on it; tx_bytes = bytes into the dc over the WAN."""
    router_addrs: tuple[tuple[str, str], ...]
    """(router interface, cidr)."""
    lab_subnet: str
    namespaces: tuple[str, ...] = field(default=())
    """Every namespace, in creation order; teardown deletes these."""


def plan_lab(spec: LabSpec, prefix: str) -> LabPlan:
    """Pure: the namespaces, veths, addresses and shaping that realize `spec` under `prefix`."""
    net = ipaddress.ip_network(spec.subnet)
    base = int(net.network_address)
    multi_dc = len(spec.datacenters) > 1
    router_ns = f"{prefix}-wan" if multi_dc else None
    hosts: list[HostPlan] = []
    bridges: list[tuple[str, str]] = []
    veths: list[VethPlan] = []
    ports: list[tuple[str, str, str]] = []
    router_ifs: list[tuple[str, str]] = []
    router_addrs: list[tuple[str, str]] = []
    namespaces: list[str] = [router_ns] if router_ns else []
    for d, dc in enumerate(spec.datacenters):
        dc_base = base + d * 256
        gw = str(ipaddress.IPv4Address(dc_base + 1))
        dc_ns = f"{prefix}-d-{dc.name}"
        namespaces.append(dc_ns)
        bridges.append((dc_ns, "br0"))
        if router_ns:
            rif = f"d-{dc.name}"
            veths.append(VethPlan(dc_ns, "wan", router_ns, rif, spec.wan_mbit, spec.wan_mbit))
            ports.append((dc_ns, "wan", "br0"))
            router_ifs.append((dc.name, rif))
            router_addrs.append((rif, f"{gw}/24"))
        i = 0
        for rack in dc.racks:
            rack_ns = f"{prefix}-r-{dc.name}-{rack.name}"
            namespaces.append(rack_ns)
            bridges.append((rack_ns, "br0"))
            up = rack.uplink_mbit if rack.uplink_mbit is not None else spec.rack_uplink_mbit
            veths.append(VethPlan(rack_ns, "uplink", dc_ns, f"r-{rack.name}", up, up))
            ports.append((rack_ns, "uplink", "br0"))
            ports.append((dc_ns, f"r-{rack.name}", "br0"))
            for host in rack.hosts:
                host_ns = f"{prefix}-h-{host}"
                namespaces.append(host_ns)
                ip = str(ipaddress.IPv4Address(dc_base + _HOST_OFFSET + i))
                i += 1
                hosts.append(HostPlan(host, dc.name, rack.name, host_ns, ip, gw if router_ns else None))
                veths.append(VethPlan(host_ns, "eth0", rack_ns, f"h-{host}", spec.nic_mbit, spec.nic_mbit))
                ports.append((rack_ns, f"h-{host}", "br0"))
    return LabPlan(prefix=prefix, hosts=tuple(hosts), bridges=tuple(bridges), veths=tuple(veths),
                   ports=tuple(ports), router_ns=router_ns, router_ifs=tuple(router_ifs),
                   router_addrs=tuple(router_addrs), lab_subnet=spec.subnet, namespaces=tuple(namespaces))


def tbf_args(mbit: float, queue_ms: float = 50.0) -> list[str]:
    """`tc ... tbf` arguments for `mbit`. Why this burst: tbf needs at least rate/HZ bytes of burst
    to reach its rate (HZ may be 100 here); 64 KiB covers one GSO super-packet at low rates."""
    rate_bytes = mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes / 100))
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", f"{queue_ms:g}ms"]
