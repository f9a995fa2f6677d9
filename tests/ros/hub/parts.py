"""Small builders the hub part tests share: records and manifests without a hub."""

from __future__ import annotations

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.records import Holding, VersionRecord, WorkerRecord
from tensorhub_verl.ros.hub.intervals import IntervalSet
from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.wire.topology import Location

CHUNK = 4096


def manifest(model: str = "policy", version: int = 1, chunks: int = 4, layout: str = "hf",
             row_shards: int = 1) -> Manifest:
    return Manifest(model, version, layout, (TensorSpec("w", (chunks * CHUNK,), "uint8", chunks * CHUNK),), CHUNK,
                    row_shards=row_shards)


def record_of(m: Manifest) -> VersionRecord:
    return VersionRecord(m, m.chunks())


def holding(holder: str, worker: str | None = None, state: str = "active", chunks=None,
            shard_rank: int | None = None) -> Holding:
    chunks = IntervalSet(chunks) if chunks is not None and shard_rank is None else chunks
    return Holding(holder, worker or holder, [msg.RegionMsg(addr=4096)], chunks, state, 1, shard_rank=shard_rank)


def worker(name: str, last_seen: float = 0.0, spot: bool = False, job: str = "default") -> WorkerRecord:
    return WorkerRecord(worker=name, location=Location(), spot=spot, agent_name=f"{name}-agent",
                        agent_metadata_b64="AAAA", last_seen=last_seen, job=job)
