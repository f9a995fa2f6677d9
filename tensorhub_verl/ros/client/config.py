"""A client's settings (``ClientConfig``), nested by what each group governs.

    ClientConfig
      publish:  PublishConfig   what this worker's versions look like (chunking, fingerprint, digests)
      fetch:    FetchConfig     how one fetch reads (window, runs, stragglers, WAN reads, digests required)
      timeouts: Timeouts        every limit of a blocking call (a read, a fetch, an unpublish, a hub call)
      hub:      HubAccess       how this worker reaches the hub and who it is there (TLS, job key, spot)
      plane:    PlaneConfig     the data plane and each plane's own settings (planes/config.py)

``ClientConfig.from_fields`` takes the flat names (``window=4, transport='tcp'``) that ``connect``, verl's
``tensorhub.*`` settings and the engines' ``client_config`` dicts use, and puts each in its group.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorhub_verl import errors
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.manifest import DEFAULT_CHUNK_BYTES
from tensorhub_verl.ros.planes.config import FLAT_FIELDS, PlaneConfig, from_flat


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishConfig:
    """What the versions this client publishes carry."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Transfer unit for versions this client publishes; small tensors are packed together."""
    fingerprint: str = "sample"
    """Content check of published bytes: 'sample', 'full' or 'none' (see manifest.content_fingerprint)."""
    chunk_digests: bool = True
    """Publish a digest of every chunk (integrity.py), which every reader checks as the chunk lands (a reader
    always checks what a manifest carries). Computed with torch ops where the bytes are (a GPU's tensors on the
    GPU); its cost per GiB on CPU is in docs/security-and-reliability.md. A hub refuses versions without them
    unless started with ``HubConfig(require_digests=False)``."""
    block_digests: bool = True
    """With ``chunk_digests``, also publish per-tensor block digests (integrity.py), so that ranged readers (TP
    ranks reading their slices) check the chunks they read in part. Costs about two more passes at publish."""
    preserve_on_unpublish: bool = True
    """Copy a retained version to CPU memory before its last reliable copy is unpublished."""

    def __post_init__(self) -> None:
        if not 4096 <= self.chunk_bytes <= 1 << 31:
            raise errors.ConfigError(f"chunk_bytes must be in [4096, 2**31], got {self.chunk_bytes}")
        if self.fingerprint not in ("sample", "full", "none"):
            raise errors.ConfigError(f"fingerprint must be 'sample', 'full' or 'none', got {self.fingerprint!r}")


BASE_DIGESTS_AHEAD = ("delta", "all", "off")


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig:
    """How one fetch reads."""

    window: int = 8
    """Leases one fetch keeps in flight (each reads one chunk, or a run of them)."""
    run_target_s: float = 0.05
    """A fetch asks for runs of consecutive chunks under one lease, sized from its measured throughput so that
    a run takes about this long: one hub exchange per run instead of one per few chunks (fast links read
    thousands of chunks a second). On slow links runs stay one chunk long, so a swarm spreads chunk by chunk;
    0: a lease per chunk. Only with ``max_run_chunks`` > 1."""
    max_run_chunks: int = 1024
    """Longest run a fetch asks for (1 to messages.MAX_RUN_CHUNKS); 1: a lease per chunk. Runs are sized by
    ``run_target_s``, so this cap matters only on links fast enough to read 1,024 chunks in that time."""
    straggler_factor: float = 4.0
    """A read slower than this many times the median of the fetch's landed reads at the same distance (and
    than 1 s) is abandoned once and re-planned elsewhere, so one slow holder does not set the pace of the
    fetch; 0 turns it off (reads then wait up to ``Timeouts.read_timeout_s``)."""
    poll_interval_s: float = 0.0005
    """How often the fetch loop checks its reads."""
    wan_reads_posted: int = 1
    """On a plane that does not keep reads in order (``DataPlane.in_order_reads``: NIXL), the WAN reads a seed
    keeps posted at once; the hub gives it two more (PlannerConfig.wan_reads_per_seed), queued here and posted
    shortly before the one in flight lands: reads posted together would share the WAN and land together. On an
    RDMA WAN with a long round trip (reads on one queue pair complete in order) raise both to cover the
    bandwidth-delay product. The TCP plane keeps a seed's WAN reads in order on one stream: it posts every WAN
    lease at once, and this setting does not apply."""
    require_digests: bool = True
    """Refuse to fetch a version whose manifest lacks a digest of some chunk (``UnverifiedVersion``): its
    bytes could not be checked. Off only for trusted tests."""
    base_digests_ahead: str = "delta"
    """When a reader digests the bytes it holds as the base of its next delta read (``delta_base.py``):
    ``delta``: from the moment a ``fetch(have=...)`` leaves it holding the version (while the engine generates),
    so that the next delta's apply has no base pass on the pause; ``all``: after every ``fetch(hold=True)`` into
    whole buffers too (a reader whose first version came in full); ``off``: at the start of the next delta's read,
    while the delta is on the wire. Only buffers in CPU memory are digested ahead: on a GPU the pass takes
    milliseconds at the read's start."""
    relay_fanout: int = 0
    """A hub of regions (``regions.py``): the regions of a datacenter, in the order listed, form a tree with this
    many children per region; a region's first copy comes from a reader of its parent region that completed it
    (``regional_client.py``), the first region of each datacenter takes it from the publisher. 0: every region
    takes its first copy from the publisher. The publisher and every reader must use the same value."""
    relay_wait_s: float = 120.0
    """With ``relay_fanout``: how long a reader of a region with a parent waits for that region's first copy
    from its parent before reading from the publisher's standby copy (0: no wait)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise errors.ConfigError(f"window must be >= 1, got {self.window}")
        if not 1 <= self.max_run_chunks <= msg.MAX_RUN_CHUNKS:
            raise errors.ConfigError(f"max_run_chunks must be in [1, {msg.MAX_RUN_CHUNKS}], "
                                     f"got {self.max_run_chunks}")
        if not 0 <= self.run_target_s <= 10:
            raise errors.ConfigError(f"run_target_s must be in [0, 10] (0: a lease per chunk), "
                                     f"got {self.run_target_s}")
        if self.wan_reads_posted < 1:
            raise errors.ConfigError(f"wan_reads_posted must be >= 1, got {self.wan_reads_posted}")
        if self.relay_fanout < 0 or self.relay_wait_s < 0:
            raise errors.ConfigError(f"relay_fanout and relay_wait_s must be >= 0 (0: off), got "
                                     f"{self.relay_fanout} and {self.relay_wait_s}")
        if self.base_digests_ahead not in BASE_DIGESTS_AHEAD:
            raise errors.ConfigError(f"base_digests_ahead must be one of {BASE_DIGESTS_AHEAD}, got "
                                     f"{self.base_digests_ahead!r}")
        if self.straggler_factor < 0:
            raise errors.ConfigError(f"straggler_factor must be >= 0 (0: off), got {self.straggler_factor}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """The limit of every blocking call of a client."""

    read_timeout_s: float = 30.0
    """A chunk read with no answer for this long is abandoned and re-planned on another source."""
    fetch_timeout_s: float = 600.0
    """Default limit of a whole fetch."""
    unpublish_timeout_s: float = 120.0
    """Limit of unpublish's wait for in-flight reads (leases expire before this by default)."""
    request_timeout_s: float = 15.0
    """Limit of one HTTP call to the hub."""
    hub_retry_s: float = 30.0
    """How long calls retry with backoff while the hub is unreachable, then HubUnavailable."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise errors.ConfigError(f"{f.name} must be > 0, got {getattr(self, f.name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class HubAccess:
    """How this worker reaches the hub, and what the hub knows of it."""

    tls_ca_file: str | None = None
    """PEM file of the CA that signed an https hub's certificate (default: the system trust store)."""
    allow_plain_http: bool = False
    """Send the hub token and the job key over ``http://`` to a hub on another host. Off: such a hub URL is
    refused (they would cross the network in clear); a loopback hub, and an open hub reached without a job key,
    need no TLS."""
    job_key: str | None = None
    """The secret of this worker's job: the first job to publish a model owns it, and only its workers create
    versions of it (others may only hold copies of published ones; ``ownership.py``). Give every worker of one
    training job the same key (e.g. a random one per job). None: the hub's default job, shared by every worker
    without a key; a hub with a token refuses it (``JobKeyRequired``) unless started with ``--allow-keyless``.
    Like the token, never sent over ``http://`` to another host unless ``allow_plain_http``."""
    spot: bool = False
    """A spot worker may vanish any time; its copies never count as reliable for retention."""


_GROUPS: dict[str, type] = {"publish": PublishConfig, "fetch": FetchConfig, "timeouts": Timeouts, "hub": HubAccess}
FLAT_NAMES: dict[str, str] = {f.name: group for group, kind in _GROUPS.items() for f in dataclasses.fields(kind)}
"""Each flat name ``from_fields`` accepts (besides the plane's, ``planes.config.FLAT_FIELDS``) -> its group."""


def _group_of(name: str) -> str:
    """Where flat name ``name`` lives now, as a reader would write it."""
    if name in FLAT_NAMES:
        return f"ClientConfig.{FLAT_NAMES[name]}.{name}"
    return f"ClientConfig.plane.{'.'.join(FLAT_FIELDS[name])}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """A client's settings; see the module docstring for the groups. ``ClientConfig.from_fields(window=4)``
    takes flat names."""

    publish: PublishConfig = field(default_factory=PublishConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    hub: HubAccess = field(default_factory=HubAccess)
    plane: PlaneConfig = field(default_factory=PlaneConfig)
    """The data plane (NIXL or TCP streams) and each plane's own settings (planes/config.py)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "ClientConfig":
        # A flat name (``ClientConfig(window=4)``) fails naming its group, not with a bare TypeError.
        flat = [k for k in kwargs if k in FLAT_NAMES or k in FLAT_FIELDS]
        if flat:
            name = flat[0]
            raise errors.ConfigError(f"{name} is {_group_of(name)}: write ClientConfig.from_fields({name}=...) "
                                     f"or nest it (ClientConfig({_group_of(name).split('.')[1]}=...))")
        return object.__new__(cls)

    @classmethod
    def from_fields(cls, **fields: Any) -> "ClientConfig":
        """A ClientConfig from flat names (``window=4``, ``fetch_timeout_s=60``, ``job_key='k'``), each put in its
        group, where each plane setting may also be flat as ``planes.config.FLAT_FIELDS`` names them
        (``transport='tcp', tcp_streams=4``), and a whole group given as its dataclass or as plain data
        (``plane={'kind': 'tcp'}``, ``fetch={'window': 4}``). An unknown name fails naming the accepted ones."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        whole: dict[str, Any] = {}
        plane_flat: dict[str, Any] = {}
        for key, value in fields.items():
            if key in FLAT_NAMES:
                groups[FLAT_NAMES[key]][key] = value
            elif key in FLAT_FIELDS:
                plane_flat[key] = value
            elif key in _GROUPS or key == "plane":
                whole[key] = value
            else:
                known = sorted([*FLAT_NAMES, *FLAT_FIELDS, *_GROUPS, "plane"])
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}, {_group_of(close[0])}?)" if close and close[0] in \
                    {**FLAT_NAMES, **FLAT_FIELDS} else ""
                raise errors.ConfigError(f"unknown client setting {key!r}{hint}; accepted: {', '.join(known)}")
        built: dict[str, Any] = {}
        for name, kind in _GROUPS.items():
            base = _as_group(kind, name, whole.get(name, kind()))
            try:
                built[name] = dataclasses.replace(base, **groups[name]) if groups[name] else base
            except TypeError as e:
                raise errors.ConfigError(f"invalid client setting in {name}: {e}") from e
        plane = PlaneConfig.of(whole.get("plane", PlaneConfig()))
        return cls(plane=from_flat(plane, plane_flat), **built)

    def __post_init__(self) -> None:
        for name, kind in {**_GROUPS, "plane": PlaneConfig}.items():
            if not isinstance(getattr(self, name), kind):
                raise errors.ConfigError(f"{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}; "
                                         f"use ClientConfig.from_fields for plain data")


def _as_group(kind: type, name: str, value: Any) -> Any:
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise errors.ConfigError(f"{name} must be a {kind.__name__} or a mapping, got {type(value).__name__}")
    try:
        return kind(**value)
    except TypeError as e:
        raise errors.ConfigError(f"{name} settings {dict(value)!r} are invalid: {e}") from e


__all__ = ["ClientConfig", "FetchConfig", "FLAT_NAMES", "HubAccess", "PublishConfig", "Timeouts"]
