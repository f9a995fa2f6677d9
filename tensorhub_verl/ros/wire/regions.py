"""Regions: a hub process per region of the cluster (a datacenter, a rack or a node), each serving its readers.

One hub process serves every reader of a version, and each reader costs it a begin, an end and its exchanges:
the hub's critical path grows with the readers it serves (docs/control-plane.md, "Regions"). A hub of regions
splits the *readers*: each region's hub serves the whole version to the readers of its region only, so a
region's hub does the work of its readers, whatever the size of the cluster.

A region is named by a place, ``dc``, ``dc/rack`` or ``dc/rack/node``; a worker belongs to the most specific
region that contains its ``Location`` (its node's, else its rack's, else its datacenter's). Clients connect with
the list ``"dc0/r0=http://hub-a:7777,dc0/r1=http://hub-b:7777"`` (``tensorhub hub --regions`` prints it).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.messages import HOLDER_SEPARATOR
from tensorhub_verl.ros.wire.topology import Location

MAX_REGIONS = 256
RELAYS_PER_REGION = 2
"""The completed readers of a region that pass its copy on to its children: the first of them by holder name."""


def parse_regions(spec: str) -> dict[str, str]:
    """``"dc0/r0=http://a:1,dc0/r1=http://b:2"`` -> {region: hub URL}, in the order given."""
    regions: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip()
        parts = name.split("/")
        if not sep or not url or not 1 <= len(parts) <= 3 or not all(parts):
            raise errors.ConfigError(f"region item {item!r} is not REGION=URL with REGION one of dc, dc/rack or "
                                     f"dc/rack/node; e.g. dc0/r0=http://hub-a:7777")
        if name in regions:
            raise errors.ConfigError(f"region {name!r} is given twice in {spec!r}; give each region one hub URL")
        regions[name] = url
    if not 1 <= len(regions) <= MAX_REGIONS:
        raise errors.ConfigError(f"a hub of regions needs 1 to {MAX_REGIONS} regions, got {len(regions)}")
    if len(set(regions.values())) != len(regions):
        raise errors.ConfigError(f"two regions share one hub URL in {spec!r}; each region has a hub process of its own")
    return regions


def region_names(regions: str | int) -> list[str]:
    """``tensorhub hub --regions``: a comma-separated list of region names, or a count N for regions
    ``dc0/r0`` .. ``dc0/r{N-1}`` (one per rack of the default datacenter)."""
    if isinstance(regions, int) or str(regions).isdigit():
        return [f"dc0/r{i}" for i in range(int(regions))]
    return list(parse_regions(",".join(f"{name.strip()}=x{i}" for i, name in enumerate(str(regions).split(",")))))


def region_of(location: Location, regions: Mapping[str, str]) -> str | None:
    """The most specific region containing ``location`` (its node's, rack's, then datacenter's); None: none does
    (such a worker may publish to every region, but reads from none)."""
    for name in (f"{location.dc}/{location.rack}/{location.node}", f"{location.dc}/{location.rack}", location.dc):
        if name in regions:
            return name
    return None


def commit_layout(layout: str) -> str:
    """The layout of a version's commit marker in each region (``RegionalClient.publish``)."""
    return f"{layout}@regions"


def relay_layout(layout: str) -> str:
    """The layout of a version's relay marker in a region fed by another: visible once a reader of the parent
    region has passed its copy on there; the region's readers long-poll for it (``RegionalClient._await_relay``)."""
    return f"{layout}@relay"


def relay_parents(names: Sequence[str], fanout: int) -> dict[str, str | None]:
    """Each region's parent, the region its first copy comes from (None: from the publisher). The regions of one
    datacenter, in the order listed, form a tree of ``fanout`` children per region (the i-th region of a
    datacenter has the ((i - 1) // fanout)-th as parent): the first region of each datacenter takes the only copy
    that crosses into it. ``fanout`` 0: no region has a parent."""
    parents: dict[str, str | None] = {}
    by_dc: dict[str, list[str]] = {}
    for name in names:
        dc = by_dc.setdefault(name.split("/")[0], [])
        parents[name] = dc[(len(dc) - 1) // fanout] if fanout and dc else None
        dc.append(name)
    return parents


def relay_children(names: Sequence[str], fanout: int) -> dict[str, list[str]]:
    """Each region's children in the tree of ``relay_parents``: the regions it passes its first copy on to."""
    children: dict[str, list[str]] = {name: [] for name in names}
    for name, parent in relay_parents(names, fanout).items():
        if parent is not None:
            children[parent].append(name)
    return children


def relays_from_here(worker: str, holders: Sequence[str]) -> bool:
    """Whether ``worker``, one of the complete holders of a version in its region's hub, passes the version on to
    its region's children: it is among the ``RELAYS_PER_REGION`` first by name of the region's own complete copies
    (no standby, relay or archive holder); readers that complete at once agree on them."""
    own = sorted(h for h in holders if HOLDER_SEPARATOR not in h)
    return worker in own[:RELAYS_PER_REGION]


def complete_holders(status: Mapping, model: str, version: int, layout: str) -> list[str]:
    """The active, complete holders of a version in a hub's status (``StatusReply`` as a dict): the holders among
    which ``relays_from_here`` picks a region's relays."""
    return [h["holder"] for v in status["models"].get(model, ()) if (v["version"], v["layout"]) == (version, layout)
            for h in v["holders"] if h["state"] == "active" and h["chunks"] == v["chunks"]]


def relay_wanted(version: int, visible: Mapping[int, object], relayed: Mapping[int, object]) -> bool:
    """Whether a relay passes ``version`` on to a child region whose hub lists ``visible`` versions of the layout
    and ``relayed`` versions of its relay marker: only where the version is visible (committed there) and no
    other reader has passed it on yet."""
    return version in visible and version not in relayed
