"""Where a worker sits in the network, and how far apart two workers are.

Distance orders sources for the planner: a reader prefers a holder on its own node, then its rack,
then its datacenter, and crosses the WAN only as a datacenter's seed.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Mapping

from tensorhub_verl.errors import ConfigError

LABEL_KEYS = ("dc", "rack", "node", "gpu")
"""The location labels a worker may carry, outermost first."""
LINK_KEYS = ("nic_gbps", "rack_uplink_gbps", "wan_gbps")
"""The link rates (Gbit/s) LinkCapacities takes."""


class Distance(enum.IntEnum):
    SAME_NODE = 0
    SAME_RACK = 1
    SAME_DC = 2
    WAN = 3


@dataclass(frozen=True, slots=True)
class Location:
    """A worker's location labels. Labels are hierarchical: a rack name is only meaningful inside its dc."""

    dc: str = "dc0"
    rack: str = "r0"
    node: str = "n0"
    gpu: str | None = None

    def distance(self, other: "Location") -> Distance:
        if self.dc != other.dc:
            return Distance.WAN
        if self.rack != other.rack:
            return Distance.SAME_DC
        if self.node != other.node:
            return Distance.SAME_RACK
        return Distance.SAME_NODE

    def as_dict(self) -> dict[str, str]:
        labels = {"dc": self.dc, "rack": self.rack, "node": self.node}
        if self.gpu is not None:
            labels["gpu"] = self.gpu
        return labels

    @classmethod
    def parse(cls, value: "Location | Mapping[str, str] | str | None") -> "Location":
        """Accepts a Location, a mapping of labels, or the CLI form ``dc=dc0,rack=r1,node=n3``."""
        if value is None:
            return cls()
        if isinstance(value, Location):
            return value
        if isinstance(value, str):
            pairs: dict[str, str] = {}
            for item in filter(None, (part.strip() for part in value.split(","))):
                key, sep, label = item.partition("=")
                if not sep or not label:
                    raise ConfigError(f"location item {item!r} is not key=value; use e.g. dc=dc0,rack=r0,node=n0")
                pairs[key.strip()] = label.strip()
            value = pairs
        unknown = set(value) - set(LABEL_KEYS)
        if unknown:
            raise ConfigError(f"unknown location label(s) {sorted(unknown)}; accepted: {list(LABEL_KEYS)}")
        for key, label in value.items():
            if not isinstance(label, str) or not label or len(label) > 128:
                raise ConfigError(f"location label {key}={label!r} must be a non-empty string of at most 128 chars")
        return cls(**{k: str(v) for k, v in value.items()})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Location":
        """Labels from TENSORHUB_DC / TENSORHUB_RACK / TENSORHUB_NODE / TENSORHUB_GPU (used by launch scripts)."""
        return cls.parse(env_labels(environ))


def env_labels(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels set in an environment (TENSORHUB_DC / _RACK / _NODE / _GPU), only those set."""
    env = os.environ if environ is None else environ
    return {key: env[f"TENSORHUB_{key.upper()}"] for key in LABEL_KEYS if env.get(f"TENSORHUB_{key.upper()}")}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCapacities:
    """Link rates in Gbit/s, used to size seeds and by the simulator."""

    nic_gbps: float = 200.0
    """Each worker's NIC, per direction."""
    rack_uplink_gbps: float = 1600.0
    """A rack's uplink to the datacenter fabric."""
    wan_gbps: float = 100.0
    """The link between two datacenters."""

    def __post_init__(self) -> None:
        for name in LINK_KEYS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"LinkCapacities.{name} must be > 0, got {getattr(self, name)}")

    def seeds_for_wan(self) -> int:
        """How many readers per datacenter should cross the WAN so that the WAN, not one NIC, is the limit."""
        return max(1, int(-(-self.wan_gbps // self.nic_gbps)))


def wan_seeds(seeds_per_dc: int | None, link_capacities: Mapping[str, float]) -> int:
    """Readers per datacenter that cross the WAN: `seeds_per_dc` when set, else sized from the link rates
    given (LinkCapacities.seeds_for_wan), else 1."""
    if seeds_per_dc is not None:
        return seeds_per_dc
    return LinkCapacities(**link_capacities).seeds_for_wan() if link_capacities else 1
