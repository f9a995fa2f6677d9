"""Network lab: an emulated multi-rack, multi-datacenter cluster on one Linux machine.

Hosts are network namespaces; racks and datacenters are Linux bridges joined by veth pairs; `tc tbf`
shapes host NICs, rack uplinks and the WAN (rate only: this kernel has no netem, so no delay or loss).
Needs root and iproute2; see `tensorhub_dev.netlab.lab` for the invariants.
"""

from tensorhub_dev.netlab.errors import NetlabError, NetlabUnavailable
from tensorhub_dev.netlab.iproute import check_available
from tensorhub_dev.netlab.iproute import list_netns as ip_netns_names
from tensorhub_dev.netlab.lab import Host, Lab, cleanup_stale, ucx_env
from tensorhub_dev.netlab.spec import DatacenterSpec, LabSpec, RackSpec, plan_lab

__all__ = [
    "DatacenterSpec",
    "Host",
    "Lab",
    "LabSpec",
    "NetlabError",
    "NetlabUnavailable",
    "RackSpec",
    "check_available",
    "ip_netns_names",
    "cleanup_stale",
    "plan_lab",
    "ucx_env",
]
