"""Who a verl worker is to the hub: its worker id and location labels.

The ids are built from arguments (role, rank, replica, job tag), never from global process-group
state: in a verl process FSDP, TP and the checkpoint engine's own groups coexist, and a rank read from
``torch.distributed`` would be ambiguous. The Ray-facing helpers at the bottom only *collect* those
arguments at the boundary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.client.client import ARCHIVE_SUFFIX

ACTOR_ROLE = "actor"
ROLLOUT_ROLE = "rollout"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerIdentity:
    """One worker as the hub sees it."""

    worker: str
    """Unique id at the hub, e.g. ``job01-actor-0`` or ``job01-rollout-3-1``."""
    role: str
    """``actor`` (publishes the trainer's versions) or ``rollout`` (pulls them)."""
    rank: int
    """Rank inside its worker group (actor) or inside its replica (rollout)."""
    location: dict[str, str] = field(default_factory=dict)
    """Location labels (dc, rack, node, gpu)."""


_TRAINER_ID = re.compile(rf"^[A-Za-z0-9._-]+-{ACTOR_ROLE}-\d+(?:{re.escape(ARCHIVE_SUFFIX)})?$")
"""An actor id as ``make_identity`` builds it (``<tag>-actor-<rank>``), or its CPU archive (``<id>~cpu``)."""


def is_trainer_worker(worker: str) -> bool:
    """Whether a source in ``FetchStats.sources`` is a trainer rank (or its CPU archive ``<id>~cpu``)
    rather than a peer rollout: the split that ``tensorhub/sources_peer_fraction`` reports. The whole id must
    have the actor's form: a rollout of a job whose tag holds ``-actor-`` is still a rollout."""
    return _TRAINER_ID.match(worker) is not None


def peer_bytes(sources: Mapping[str, int]) -> int:
    """Bytes of ``sources`` (worker -> bytes) read from peer rollouts rather than from trainer ranks."""
    return sum(n for worker, n in sources.items() if not is_trainer_worker(worker))


def make_identity(*, role: str, rank: int, job: str, location: Mapping[str, str] | None = None,
                  replica: int | None = None) -> WorkerIdentity:
    """Builds the identity of an actor rank (``replica=None``) or of rank ``rank`` of rollout ``replica``."""
    if role not in (ACTOR_ROLE, ROLLOUT_ROLE):
        raise ConfigError(f"role must be {ACTOR_ROLE!r} or {ROLLOUT_ROLE!r}, got {role!r}")
    if rank < 0:
        raise ConfigError(f"rank must be >= 0, got {rank}")
    if role == ROLLOUT_ROLE and (replica is None or replica < 0):
        raise ConfigError(f"a rollout identity needs replica >= 0, got {replica!r}")
    tag = _SAFE.sub("-", job).strip("-") or "job"
    worker = f"{tag}-{role}-{rank}" if role == ACTOR_ROLE else f"{tag}-{role}-{replica}-{rank}"
    return WorkerIdentity(worker=worker, role=role, rank=rank, location=dict(location or {}))


def with_default_node(location: Mapping[str, str], node: str | None) -> dict[str, str]:
    """Fills the ``node`` label when the config left it out (two workers on one host must share it)."""
    labels = dict(location)
    if "node" not in labels and node:
        labels["node"] = _SAFE.sub("-", node)
    return labels


def ray_boundary_facts() -> tuple[str, str | None]:
    """(job tag, node label) of the calling Ray process: the Ray job id and the node's IP address.

    Outside Ray (unit tests, a plain script) it returns ("local", None)."""
    try:
        import ray
    except ImportError:
        return "local", None
    if not ray.is_initialized():
        return "local", None
    ctx = ray.get_runtime_context()
    job = ctx.get_job_id() or "local"
    try:
        node = ray.util.get_node_ip_address()
    except Exception:  # Ray versions differ in where this lives; the node label is only a hint
        node = None
    return f"j{job}", node
