"""The numbers TensorHub adds to verl's step metrics, computed from per-worker results.

Keys (all floats, one value per weight update):

- ``tensorhub/stall_s``: the longest time any rollout engine was paused for this update (its apply only).
- ``tensorhub/stall_s_mean``: the mean pause over replicas that applied.
- ``tensorhub/pull_s``: the longest pull of one engine rank (inside its pause with ``rollout_staging='none'``).
- ``tensorhub/bytes``: bytes pulled by all rollout workers for this version.
- ``tensorhub/bytes_from_trainer`` / ``tensorhub/bytes_from_peers``: the same bytes by kind of source.
- ``tensorhub/sources_peer_fraction``: share of those bytes read from peer rollouts rather than from
  the trainer (the trainer's NIC is not the bottleneck when this is high).
- ``tensorhub/version``: the version this update published.
- ``tensorhub/version_lag``: newest published version minus the oldest version still served by a replica
  (0 when every replica applied this update).
- ``tensorhub/replicas_updated``: replicas that applied this version.
- ``tensorhub/version_lag/replica_<r>``: newest published version minus the version replica ``r`` serves.
- ``tensorhub/replicas_held`` / ``tensorhub/requests_held_back`` (with ``max_version_lag``): replicas whose
  new requests are held for staleness after this update, and requests that met a held gate since the last one.
- ``tensorhub/flip_committed`` / ``tensorhub/flip_blocked`` / ``tensorhub/flip_replicas`` /
  ``tensorhub/versions_served`` (with ``flip_together``): the fleet's committed version, 1 when a newer staged one
  waits (quorum, a failed check, the two-version bound, or a flip held back after a failed catch-up), replicas
  that flipped, versions served after the flip.
- ``tensorhub/trainer_sources`` / ``tensorhub/trainer_share_max``: trainer workers read from, and the largest
  share of the trainer bytes one of them served (~1/N when N FSDP ranks each serve their shard).
- ``tensorhub/publish_ranks``: trainer ranks that published (N with shards, 1 with gathered tensors).
- ``tensorhub/preserved_bytes``: bytes rollout engines copied to CPU inside their pause, because unpublishing
  the version they stopped serving would have dropped its last reliable copy (0 while the trainer, its complete
  FSDP shard group, or a peer still holds it).
- ``tensorhub/delta_bytes``: bytes of deltas the rollout workers read for this version (part of
  ``tensorhub/bytes``); ``tensorhub/delta_replicas``: replicas whose every rank applied it as a delta.
- ``tensorhub/changed_fraction``: the fraction of the version's elements its delta changed (the largest any
  rank reported; 0 when no delta was read).
- ``tensorhub/delta_fallbacks``: chunks rollout workers read in full after a delta's check failed, or because a
  delta they tried could not be used (0 when every delta applied cleanly).
- ``tensorhub/delta_full_bytes``: bytes rollout workers that tried a delta read in full instead: chunks re-read
  after a failed check, the whole version when the delta could not be used, and chunks a TP rank's delta cannot
  be checked on (its slices cover their digest blocks in part). For those workers ``tensorhub/bytes`` is
  ``tensorhub/delta_bytes`` plus this.
- ``tensorhub/wan_bytes``: bytes rollout workers read from workers of another datacenter (``dc`` labels), and
  ``tensorhub/wan_bytes/<dc>`` the part that crossed into datacenter ``<dc>``.
- ``tensorhub/hub_restarts`` (set by the updater, when the job runs its own hub actor): times Ray restarted the
  hub actor so far; the step where it grows is the one that met the restart (its ``update_s`` shows the cost).
plus the trainer's ``tensorhub/publish_*`` from ``PublishStats`` (bytes summed over ranks, times the slowest).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from tensorhub_verl.verl.identity import is_trainer_worker, peer_bytes
from tensorhub_verl.vllm.results import UpdateResult


def update_metrics(*, version: int, publish: Iterable[Mapping[str, float]], updates: Iterable[UpdateResult],
                   stalls: Mapping[int, float], served: Mapping[int, int | None]) -> dict[str, float]:
    """Aggregates one update.

    Args:
        version: the version just published.
        publish: the trainer ranks' ``send_weights`` results (only the publishing rank has numbers).
        updates: each replica's update (all its engine ranks) to this version.
        stalls: replica rank -> seconds its engine was paused.
        served: replica rank -> the version it serves after this update (None: never got one).
    """
    out: dict[str, float] = {}
    ranks = 0
    for result in publish:  # one per trainer rank that published: bytes add up, times are the slowest rank's
        ranks += bool(result)
        for key, value in result.items():
            out[key] = out.get(key, 0.0) + float(value) if key.endswith("_bytes") else max(out.get(key, 0.0),
                                                                                          float(value))
    out["tensorhub/publish_ranks"] = float(ranks)
    updates = list(updates)
    total = sum(u.bytes for u in updates)
    peer = sum(peer_bytes(u.sources) for u in updates)
    out["tensorhub/version"] = float(version)
    out["tensorhub/bytes"] = float(total)
    out["tensorhub/bytes_from_trainer"] = float(total - peer)
    out["tensorhub/bytes_from_peers"] = float(peer)
    out["tensorhub/pull_s"] = max((u.pull_s for u in updates), default=0.0)
    out["tensorhub/preserved_bytes"] = float(sum(u.preserved_bytes for u in updates))
    out["tensorhub/sources_peer_fraction"] = peer / total if total else 0.0
    out["tensorhub/delta_bytes"] = float(sum(u.delta_bytes for u in updates))
    out["tensorhub/delta_replicas"] = float(sum(1 for u in updates
                                                if u.delta_ranks and u.delta_ranks == len(u.rank_bytes)))
    out["tensorhub/changed_fraction"] = max((u.changed_fraction for u in updates), default=0.0)
    out["tensorhub/delta_fallbacks"] = float(sum(u.delta_fallbacks for u in updates))
    out["tensorhub/delta_full_bytes"] = float(sum(u.delta_fallback_bytes + u.delta_full_bytes for u in updates))
    wan: dict[str, int] = {}
    for u in updates:
        for dc, n in u.wan_bytes.items():
            wan[dc] = wan.get(dc, 0) + n
    out["tensorhub/wan_bytes"] = float(sum(wan.values()))
    for dc, n in sorted(wan.items()):
        out[f"tensorhub/wan_bytes/{dc}"] = float(n)
    by_trainer: dict[str, int] = {}
    for u in updates:
        for worker, n in u.sources.items():
            if is_trainer_worker(worker):
                by_trainer[worker] = by_trainer.get(worker, 0) + n
    # With FSDP shards each trainer rank serves its rows: the largest share is ~1/N when reads are spread.
    out["tensorhub/trainer_sources"] = float(len(by_trainer))
    out["tensorhub/trainer_share_max"] = max(by_trainer.values()) / sum(by_trainer.values()) if by_trainer else 0.0
    out["tensorhub/stall_s"] = max(stalls.values(), default=0.0)
    out["tensorhub/stall_s_mean"] = sum(stalls.values()) / len(stalls) if stalls else 0.0
    oldest = min((v if v is not None else -1 for v in served.values()), default=version)
    # A replica that never got a version counts as lagging by the whole history (version + 1).
    out["tensorhub/version_lag"] = float(version - oldest)
    out["tensorhub/replicas_updated"] = float(sum(1 for v in served.values() if v == version))
    for replica, lag in version_lags(version, served).items():
        out[f"tensorhub/version_lag/replica_{replica}"] = float(lag)
    return out


def version_lags(newest: int, served: Mapping[int, int | None]) -> dict[int, int]:
    """replica -> versions it is behind ``newest`` (one that never got a version: ``newest + 1``)."""
    return {r: newest - (v if v is not None else -1) for r, v in served.items()}


def stale_replicas(newest: int, served: Mapping[int, int | None], max_lag: int | None) -> set[int]:
    """Replicas more than ``max_lag`` versions behind ``newest`` (none when the bound is off)."""
    if max_lag is None:
        return set()
    return {r for r, lag in version_lags(newest, served).items() if lag > max_lag}
