"""What a publish must pass before the hub records it: the model owner's rule for other jobs' copies, and the
budget of pending shards per worker, job and hub (``HubLimits``). Pure checks over the parts' public reads: they
change nothing.
"""

from __future__ import annotations

from typing import Callable

from tensorhub_verl.errors import ManifestMismatch, OverBudget
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.records import Holding, Key, VersionRecord
from tensorhub_verl.ros.hub.versions import VersionStore
from tensorhub_verl.ros.hub.limits import HubLimits
from tensorhub_verl.ros.hub.ownership import Owners


def check_pending_budget(req: msg.Publish, limits: HubLimits, versions: VersionStore,
                         job_of_worker: Callable[[str], str | None], job: str) -> None:
    """Pending shards (in shard groups not yet complete) each keep a chunk map on the hub until their group
    completes: their number is capped per worker, their pieces (tensors x row shards) per worker, per job and
    over the hub (worker ids and job keys cost a caller nothing to make). ``job_of_worker``: a worker's job
    (None: gone); ``job``: the publisher's."""
    m = req.manifest
    key = (m.model, m.version, m.layout)
    mine = (key, req.holder)
    pending = [(k, h) for k, h in versions.pending() if (k, h.holder) != mine]
    own = [(k, h) for k, h in pending if h.worker == req.worker]
    if len(own) >= limits.max_pending_shards_per_worker:
        raise OverBudget(f"worker {req.worker!r} already has {len(own)} shards pending in shard groups that "
                         f"are not complete, the hub's limit per worker (HubLimits.max_pending_shards_per_worker"
                         f"={limits.max_pending_shards_per_worker}); publish the other shards of those groups "
                         f"(or unpublish them) first")
    incoming = len(m.tensors) * m.row_shards
    pieces = incoming + sum(_pieces(versions, k) for k, _ in own)
    if pieces > limits.max_pending_pieces_per_worker:
        raise OverBudget(f"worker {req.worker!r}'s pending shards would describe {pieces} pieces (tensors x row "
                         f"shards), over the hub's limit per worker (HubLimits.max_pending_pieces_per_worker="
                         f"{limits.max_pending_pieces_per_worker}); complete or unpublish pending shard groups, "
                         f"or publish fewer, larger tensors")
    # A version's chunk map is kept once however many of its shards are pending: count each version once.
    job_keys = {k for k, h in pending if job_of_worker(h.worker) == job}
    all_keys = {k for k, _ in pending}
    job_pieces = sum(_pieces(versions, k) for k in job_keys) + (0 if key in job_keys else incoming)
    if job_pieces > limits.max_pending_pieces_per_job:
        raise OverBudget(f"job {job!r}'s pending shard groups would describe {job_pieces} pieces (tensors x row "
                         f"shards), over the hub's limit per job (HubLimits.max_pending_pieces_per_job="
                         f"{limits.max_pending_pieces_per_job}); complete or unpublish the job's pending shard "
                         f"groups first")
    hub_pieces = sum(_pieces(versions, k) for k in all_keys) + (0 if key in all_keys else incoming)
    if hub_pieces > limits.max_pending_pieces:
        raise OverBudget(f"the hub's pending shard groups would describe {hub_pieces} pieces, over its limit "
                         f"(HubLimits.max_pending_pieces={limits.max_pending_pieces}); retry once pending groups "
                         f"complete")


def _pieces(versions: VersionStore, key: Key) -> int:
    record = versions.get(key)
    return 0 if record is None else len(record.manifest.tensors) * record.manifest.row_shards


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
