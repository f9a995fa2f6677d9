"""The simulated cluster: nodes with NICs, racks with uplinks, datacenters joined by a WAN.

A flow from node a to node b crosses, in order:

    nic_out(a) -> [rack_up(a's rack) -> [wan_out(a's dc) -> wan_in(b's dc)] -> rack_down(b's rack)] -> nic_in(b)

(bracketed links only when the endpoints sit in different racks / datacenters). A transfer inside
one node uses its `local` link (NVLink / PCIe), so every path has at least one link. Capacities are
in bytes per second; builders take Gbit/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.wire.topology import Location

GBIT = 1e9 / 8  # bytes per second in one Gbit/s

Link = tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    nodes: dict[str, Location]
    """Node id -> location (node label = id)."""
    nic_Bps: dict[str, float]
    """Node id -> NIC rate per direction, bytes/s."""
    rack_uplink_Bps: float | None = None
    """Each rack's uplink rate per direction; None = non-blocking fabric."""
    wan_Bps: float | None = None
    """Each datacenter's WAN access rate per direction; None = no WAN limit."""
    local_Bps: float = 900 * 8 * GBIT
    """Same-node copies (NVLink-class)."""
    capacity: dict[Link, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.nodes) != set(self.nic_Bps):
            raise ConfigError("Cluster: every node needs a NIC rate and vice versa")
        cap = self.capacity
        for node, loc in self.nodes.items():
            nic = self.nic_Bps[node]
            if nic <= 0:
                raise ConfigError(f"node {node}: NIC rate must be > 0")
            cap[("nic_out", node)] = cap[("nic_in", node)] = nic
            cap[("local", node)] = self.local_Bps
            if self.rack_uplink_Bps is not None:
                cap[("rack_up", loc.dc, loc.rack)] = cap[("rack_down", loc.dc, loc.rack)] = self.rack_uplink_Bps
            if self.wan_Bps is not None:
                cap[("wan_out", loc.dc)] = cap[("wan_in", loc.dc)] = self.wan_Bps

    def path(self, src: str, dst: str) -> tuple[Link, ...]:
        a, b = self.nodes[src], self.nodes[dst]
        if src == dst:
            return (("local", src),)
        hops: list[Link] = [("nic_out", src)]
        cross_rack = a.dc != b.dc or a.rack != b.rack
        if cross_rack and self.rack_uplink_Bps is not None:
            hops.append(("rack_up", a.dc, a.rack))
        if a.dc != b.dc and self.wan_Bps is not None:
            hops += [("wan_out", a.dc), ("wan_in", b.dc)]
        if cross_rack and self.rack_uplink_Bps is not None:
            hops.append(("rack_down", b.dc, b.rack))
        hops.append(("nic_in", dst))
        return tuple(hops)


def build_cluster(*, dcs: int = 1, racks_per_dc: int = 1, nodes_per_rack: int = 8, nic_gbps: float = 400.0,
                  rack_uplink_gbps: float | None = None, wan_gbps: float | None = None) -> Cluster:
    """Uniform cluster; node ids are `d<dc>r<rack>n<i>` and locations use dc<d>/r<r>/<id>."""
    if min(dcs, racks_per_dc, nodes_per_rack) < 1:
        raise ConfigError("build_cluster: dcs, racks_per_dc and nodes_per_rack must be >= 1")
    nodes = {f"d{d}r{r}n{i}": Location(dc=f"dc{d}", rack=f"r{r}", node=f"d{d}r{r}n{i}")
             for d in range(dcs) for r in range(racks_per_dc) for i in range(nodes_per_rack)}
    return Cluster(nodes=nodes, nic_Bps={n: nic_gbps * GBIT for n in nodes},
                   rack_uplink_Bps=None if rack_uplink_gbps is None else rack_uplink_gbps * GBIT,
                   wan_Bps=None if wan_gbps is None else wan_gbps * GBIT)
