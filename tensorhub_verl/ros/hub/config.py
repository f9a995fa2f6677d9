"""The hub's settings: one frozen dataclass the facade hands each part the fields it needs from."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.ros.planes.one_plane import AUTO, known_planes
from tensorhub_verl.ros.hub.ownership import OwnerRule
from tensorhub_verl.ros.hub.planner import PlannerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class HubConfig:
    worker_timeout_s: float = 10.0
    """A worker that sends no heartbeat for this long is dropped with its holdings."""
    heartbeat_s: float = 1.0
    """How often clients are asked to send heartbeats."""
    lease_ttl_s: float = 30.0
    """A read of one chunk that takes longer than this is revoked and must be redone."""
    suspect_s: float = 3.0
    """After a failed read, its source gets no new reads for this long (unless it proves alive)."""
    quarantine_s: float = 300.0
    """A holding whose bytes failed the digest checks of two readers (``corruption.py``) serves no reads for
    this long; one reader's report keeps only that reader off it, for as long."""
    keep_versions: int = 2
    """Retention: the newest N versions of each model are kept; holders are asked to drop older ones."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    limits: HubLimits = field(default_factory=HubLimits)
    """What one version may cost the hub (tensors, bytes, chunks)."""
    owners: tuple[OwnerRule | str, ...] = ()
    """Models that only the named workers may create (``ownership.py``; an ``OwnerRule`` or
    "MODEL_GLOB=WORKER_GLOB"); other models belong to the job of their first publisher."""
    nixl_within_job: bool = True
    """Plan a reader on a holder whose data plane checks no grant (NIXL: its metadata lets a peer READ and WRITE
    the registered memory) only when both are workers of one job (``ownership.py``); readers of other jobs read
    from holders on a granted plane (TCP). False: any registered reader, as before."""
    plane: str = "auto"
    """The data plane of every worker of this hub ('nixl' or 'tcp'; ``planes/one_plane.py``): a worker that
    declares another is refused. 'auto': chosen when the hub starts, by the rule a client's 'auto' follows for
    the hub's URL (``planes/factory.choose``); clients left on 'auto' take the hub's plane."""
    allow_keyless: bool = False
    """With a token: admit workers that register without a job key (``ClientConfig.job_key``); they all share
    one default job, so each may read the others' NIXL memory, take their shard ranks and publish their models.
    Off (the default): a hub with a token refuses a registration without a job key (``JobKeyRequired``). A hub
    without a token is open to everyone on its network and admits everyone."""
    require_digests: bool = True
    """Refuse a publish without a digest for every chunk it holds. Off only for trusted tests: a version
    without digests is served unchecked."""

    def __post_init__(self) -> None:
        rules = tuple(r if isinstance(r, OwnerRule) else OwnerRule.parse(r) for r in self.owners)
        object.__setattr__(self, "owners", rules)
        if self.plane != AUTO and self.plane not in known_planes():
            raise ConfigError(f"HubConfig.plane must be 'auto' or one of {known_planes()}, got {self.plane!r}")
