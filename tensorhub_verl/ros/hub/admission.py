"""What a publish must pass before the hub records it: the model owner's rule for other jobs' copies, and each
worker's budget of pending shards (``HubLimits``). Pure checks over the parts' public reads: they change nothing.
"""

from __future__ import annotations

from tensorhub_verl.errors import ManifestMismatch, OverBudget
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.records import Holding, Key, VersionRecord
from tensorhub_verl.ros.hub.versions import VersionStore
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.ros.hub.ownership import Owners


def check_pending_budget(req: msg.Publish, limits: HubLimits, versions: VersionStore) -> None:
    """A worker's pending shards (in shard groups not yet complete) each keep a chunk map on the hub until
    their group completes: their number and pieces are capped per worker."""
    m = req.manifest
    key = (m.model, m.version, m.layout)
    pending: list[tuple[Key, Holding]] = [(k, h) for k, h in versions.pending_of(req.worker)
                                          if (k, h.holder) != (key, req.holder)]
    if len(pending) >= limits.max_pending_shards_per_worker:
        raise OverBudget(f"worker {req.worker!r} already has {len(pending)} shards pending in shard groups that "
                         f"are not complete, the hub's limit per worker (HubLimits.max_pending_shards_per_worker"
                         f"={limits.max_pending_shards_per_worker}); publish the other shards of those groups "
                         f"(or unpublish them) first")
    pieces = len(m.tensors) * m.row_shards + sum(
        len(r.manifest.tensors) * r.manifest.row_shards for k, _ in pending if (r := versions.get(k)) is not None)
    if pieces > limits.max_pending_pieces_per_worker:
        raise OverBudget(f"worker {req.worker!r}'s pending shards would describe {pieces} pieces (tensors x row "
                         f"shards), over the hub's limit per worker (HubLimits.max_pending_pieces_per_worker="
                         f"{limits.max_pending_pieces_per_worker}); complete or unpublish pending shard groups, "
                         f"or publish fewer, larger tensors")


def check_non_owner_creates_nothing(req: msg.Publish, record: VersionRecord | None, job: str, owners: Owners) -> None:
    """A worker outside the model's owner publishes no shard and no version the hub does not show yet."""
    m = req.manifest
    if req.shard_count > 1:
        owners.check_create(m.model, req.worker, job, f"shards of group {req.shard_group!r}")
    if record is None or not VersionStore.visible(record):
        owners.check_create(m.model, req.worker, job, f"version {m.version} ({m.layout})")


def check_copy(req: msg.Publish, record: VersionRecord | None, job: str, owners: Owners) -> None:
    """A publish by a worker that does not own the model: only a copy of a version already visible, whole
    and with the version's digests, is accepted (a reader re-registering what it fetched, after a hub
    restart)."""
    m = req.manifest
    check_non_owner_creates_nothing(req, record, job, owners)
    if tuple(m.chunk_digests) != record.manifest.chunk_digests:
        raise ManifestMismatch(f"{m.model} v{m.version} ({m.layout}) is published with other chunk "
                               f"digests; a copy by a worker outside the model's owner job must carry "
                               f"the version's own")
