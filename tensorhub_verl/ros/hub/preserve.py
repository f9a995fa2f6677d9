"""The preserve rule: whether a holder that wants to unpublish holds the last reliable copy of a retained version
(then it copies the version somewhere before it lets go).

A row shard is never a copy by itself: its rows alone would keep nothing fetchable once the other ranks go. Row
shards that together hold every rank's rows (an FSDP trainer's ranks), all active, on live workers none of which is
spot, are a reliable copy: while they are, no other holder needs to copy the version in its unpublish.
"""

from __future__ import annotations

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.records import Holding, HoldingState, Key, VersionRecord
from tensorhub_verl.ros.hub.registry import Registry
from tensorhub_verl.ros.hub.versions import VersionStore


def must_preserve(req: msg.PreserveQuery, retained: list[int], versions: VersionStore, registry: Registry,
                  quarantine: Quarantine, now: float, stalled: float) -> msg.PreserveAnswer:
    """The answer for ``req``; ``retained``: the model's versions inside its retention window."""
    if req.version not in retained:
        return msg.PreserveAnswer(must_preserve=False, reason="outside the retention window")
    holding = versions.holding((req.model, req.version, req.layout), req.holder)
    if holding is None or registry.get(holding.worker) is None:
        return msg.PreserveAnswer(must_preserve=False, reason="not a holder")
    if registry.require(holding.worker).spot:
        return msg.PreserveAnswer(must_preserve=False, reason="spot workers are not reliable copies")
    if holding.chunks is not None:
        # A row shard's rows alone are no copy of the version: archiving them would keep nothing fetchable.
        return msg.PreserveAnswer(must_preserve=False, reason="a row shard holds part of the version, not "
                                  "a copy; fetch the version to keep a copy")
    for key, record in versions.records_of(req.model):
        if key[1] != req.version:
            continue
        for other in record.holdings.values():
            worker = registry.get(other.worker)
            if other.holder != req.holder and other.state == HoldingState.ACTIVE and other.chunks is None and worker \
                    and not worker.spot and _reliable(quarantine, key, other, now):
                return msg.PreserveAnswer(must_preserve=False, reason=f"{other.holder} holds a copy")
        group = _reliable_row_shards(record, req.holder, registry, quarantine, now, stalled)
        if group:
            return msg.PreserveAnswer(must_preserve=False, reason=f"row shards {', '.join(group)} together "
                                      f"hold a complete copy")
    return msg.PreserveAnswer(must_preserve=True, reason="last reliable copy of a retained version")


def _reliable_row_shards(record: VersionRecord, asking: str, registry: Registry, quarantine: Quarantine,
                         now: float, stalled: float) -> list[str]:
    """The holders of a complete set of ``record``'s row shards that count as a reliable copy (every rank's
    rows active on a live, non-spot worker), or [] when there is none. Silence is measured as the sweep
    measures it, so a rank that stopped sending heartbeats counts as dead before the sweep drops it."""
    ranks: dict[int, str] = {}
    key = (record.manifest.model, record.manifest.version, record.manifest.layout)
    for other in record.holdings.values():
        worker = registry.get(other.worker)
        if other.shard_rank is None or other.holder == asking or other.state != HoldingState.ACTIVE or worker is None \
                or worker.spot or not _reliable(quarantine, key, other, now):
            continue
        if not registry.alive(worker, now, stalled):
            continue
        ranks.setdefault(other.shard_rank, other.holder)
    if len(ranks) != record.manifest.row_shards:
        return []
    return [ranks[r] for r in sorted(ranks)]


def _reliable(quarantine: Quarantine, key: Key, holding: Holding, now: float) -> bool:
    """A copy the hub may count on: it knows where its bytes came from, and no readers found them bad."""
    return holding.vouched and not quarantine.quarantined(key, holding.holder, now)


def last_vouched_copy(record: VersionRecord, holding: Holding, quarantine: Quarantine, now: float) -> bool:
    """Whether ``holding`` is the last vouched source of some of ``record``'s bytes: it is active and vouched,
    and no other active, vouched, unquarantined holding of the same layout holds what it holds (a complete copy;
    for a row shard, a complete copy or another holding of the same rank). Corruption reports alone never
    quarantine such a copy (``corruption.py``)."""
    if holding.state != HoldingState.ACTIVE or not holding.vouched:
        return False
    key = (record.manifest.model, record.manifest.version, record.manifest.layout)
    for other in record.holdings.values():
        if other.holder == holding.holder or other.state != HoldingState.ACTIVE or not _reliable(quarantine, key,
                                                                                                 other, now):
            continue
        if other.chunks is None or (holding.shard_rank is not None and other.shard_rank == holding.shard_rank):
            return False
    return True
