"""Test doubles standing in for GPU-only parts of verl.

Real verl training (FSDP actor) and real vLLM engines need GPUs, so the tests use fake *engines*:
``RecordingServerAdapter`` replaces verl's vLLM server adapter inside verl's real ``CheckpointEngineWorker``,
``FakeReplica`` replaces a vLLM ``RolloutReplica`` (it owns real ``CheckpointEngineWorker`` actors), and
``TrainerStub`` replaces the FSDP actor worker (it runs our real engine with ``is_master=True`` and yields
deterministic HF-named weights, as ``engine.get_per_tensor_param()`` would).
"""

from __future__ import annotations

import hashlib
import time

import ray
import torch

MODEL_SHAPES = {
    "model.embed_tokens.weight": (512, 256),
    "model.layers.0.self_attn.q_proj.weight": (256, 256),
    "model.layers.0.self_attn.q_proj.bias": (256,),
    "model.layers.0.mlp.up_proj.weight": (1024, 256),
    "model.norm.weight": (256,),
}


def weights_for(version: int, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Deterministic weights of a version: every version differs from every other in every tensor."""
    gen = torch.Generator().manual_seed(1000 + version)
    return {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in MODEL_SHAPES.items()}


def digest(named) -> str:
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda x: x[0]):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@ray.remote(num_cpus=0)
class Recorder:
    """Collects (time, who, what, detail) events from every process."""

    def __init__(self):
        self.events = []

    def record(self, who, what, detail=None):
        self.events.append((time.monotonic(), who, what, detail))

    def get(self):
        return list(self.events)


class RecordingServerAdapter:
    """Stands in for verl's vLLM ServerAdapter: 'applies' by hashing what it receives."""

    def __init__(self, replica_rank: int, recorder, apply_s: float = 0.05):
        self.replica_rank = replica_rank
        self.is_leader_rank = True
        self._recorder = recorder
        self._apply_s = apply_s

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        from verl.workers.rollout.utils import ensure_async_iterator

        self._recorder.record.remote(self.replica_rank, "apply_begin", global_steps)
        received = [(n, t.clone()) async for n, t in ensure_async_iterator(weights)]
        time.sleep(self._apply_s)  # the engine's load_weights
        self._recorder.record.remote(self.replica_rank, "apply_end", (global_steps, digest(received)))


class FakeReplica:
    """A rollout replica: verl's real CheckpointEngineWorker actors, a fake generation state."""

    def __init__(self, replica_rank: int, workers: list, recorder, fail_abort: bool = False):
        self.replica_rank = replica_rank
        self.workers = workers
        self._recorder = recorder
        self.fail_abort = fail_abort
        self.calls: list[str] = []

    def _note(self, what):
        self.calls.append(what)
        ray.get(self._recorder.record.remote(self.replica_rank, what))

    async def abort_all_requests(self, reject_request: bool = False):
        self._note("abort")
        if self.fail_abort:
            raise RuntimeError(f"replica {self.replica_rank} is gone")

    async def resume_generation(self):
        self._note("resume")

    # verl's default sequence calls these; the TensorHub updater must not.
    async def release_kv_cache(self):
        self._note("release_kv_cache")

    async def resume_kv_cache(self):
        self._note("resume_kv_cache")


@ray.remote(num_cpus=0)
class TrainerStub:
    """The trainer rank: our real engine (is_master=True) fed by a deterministic per-tensor generator."""

    def __init__(self, tensorhub: dict, job: str):
        from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

        self.engine = TensorHubCheckpointEngine(bucket_size=1 << 20, is_master=True, job=job, node="n0",
                                                **tensorhub)

    async def update_weights(self, global_steps=None, mode="auto"):
        weights = weights_for(global_steps)
        return await self.engine.send_weights(iter(weights.items()), global_steps=global_steps)

    def held_versions(self):
        return self.engine.held_versions()

    def close(self):
        self.engine.close()


class StubActorGroup:
    """What the updater needs of verl's actor RayWorkerGroup: update_weights returning ObjectRefs."""

    def __init__(self, trainers):
        self.trainers = trainers
        self.world_size = len(trainers)

    def update_weights(self, global_steps=None, mode="auto"):
        return [t.update_weights.remote(global_steps=global_steps, mode=mode) for t in self.trainers]


@ray.remote(num_cpus=0)
class RolloutStub:
    """A rollout worker process running our real engine (no is_master: the rollout side)."""

    def __init__(self, tensorhub: dict, job: str):
        from tensorhub_verl.verl.checkpoint_engine import TensorHubCheckpointEngine

        self.engine = TensorHubCheckpointEngine(bucket_size=1 << 20, job=job, node="n0", **tensorhub)

    async def receive_digest(self, version):
        got = [(n, t.clone()) async for n, t in self.engine.receive_weights(global_steps=version)]
        return digest(got)

    def pull(self, version, replica, rank):
        return self.engine.pull(version, replica=replica, rank=rank)

    def held_versions(self):
        return self.engine.held_versions()

    def close(self):
        self.engine.close()
