"""Test doubles standing in for GPU-only parts of verl.

The real loop (verl's trainer, vLLM CPU replicas) runs in ``test_verl_trainer_on_cpu.py``; these doubles make
the updater's sequence cheap to test in many variants. ``StubServer`` replaces one node of a vLLM replica (its
engine rank is our real extension and holder over plain tensors), ``FakeReplica`` replaces verl's
``RolloutReplica``, and ``TrainerStub`` replaces the FSDP actor worker (our real engine with ``is_master=True``
fed deterministic HF-named weights, as ``engine.get_per_tensor_param()`` would).
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


STEPPED_FROM = 100
"""Versions from this one on follow one another as optimizer steps do: each moves a few rows of two tensors."""


def stepped_weights(version: int, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Version ``version`` >= ``STEPPED_FROM``: version ``STEPPED_FROM``'s weights, then per later version a few
    rows of two matrices moved (about 1% of the elements), so the delta between neighbours is small."""
    weights = weights_for(STEPPED_FROM, dtype)
    for step in range(STEPPED_FROM + 1, version + 1):
        gen = torch.Generator().manual_seed(step)
        for name in ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"):
            row = int(torch.randint(0, weights[name].shape[0] - 4, (1,), generator=gen))
            weights[name][row:row + 4] += torch.randn(4, weights[name].shape[1], generator=gen).to(dtype)
    return weights


def weights_at(version: int) -> dict[str, torch.Tensor]:
    """What the trainer stub publishes as ``version``."""
    return stepped_weights(version) if version >= STEPPED_FROM else weights_for(version)


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


class StubEngineRank:
    """One engine rank: our real ``TensorHubWorkerExtension`` and ``EngineHolder`` over plain HF-named tensors
    (what vLLM's worker would hold), so the updater drives the real holder through real ROS transfers."""

    def __init__(self, replica_rank: int, recorder, refuse: dict | None = None):
        self.replica_rank = replica_rank
        self._recorder = recorder
        self.params = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in MODEL_SHAPES.items()}
        self.refuse = dict(refuse or {})
        """version -> (the typed error its staged reads raise, as the data plane would; whether every pull of it
        does, else only the next one)."""

    def extension(self):
        from tensorhub_verl.vllm.extension import TensorHubWorkerExtension
        from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
        from tensorhub_verl.vllm.layout import HFViews

        params, rank = self.params, self

        class Extension(TensorHubWorkerExtension):
            def _th_build_holder(self, *, hub_url, model, worker, location, token, staging, client_config,
                                 fetch_timeout_s, delta="auto"):
                import tensorhub_verl as th

                client = th.connect(hub_url, worker=worker, location=location, token=token,
                                    config=th.ClientConfig.from_fields(**(client_config or {})))

                def load_hf(weights):
                    for name, t in weights:
                        params[name].copy_(t)

                holder = EngineHolder(client, HolderConfig(model=model, layout="stub/tp1/rank0", staging=staging,
                                                           fetch_timeout_s=fetch_timeout_s, delta=delta), params,
                                      load_hf, hf_views=HFViews(dict(params), (), ()))
                stage = holder._landing.stage

                def refusing_stage(version, layout):
                    if version in rank.refuse:
                        error, always = rank.refuse[version]
                        if not always and layout == "hf":  # the pull's last layout: the next pull reads
                            del rank.refuse[version]
                        raise error
                    return stage(version, layout)

                holder._landing.stage = refusing_stage
                return holder

            def th_apply(self, timeout: float = 300.0):
                rank._recorder.record.remote(rank.replica_rank, "apply_begin")
                result = super().th_apply(timeout)
                rank._recorder.record.remote(rank.replica_rank, "apply_end",
                                             (result.version, digest(params.items())))
                return result

        return Extension()


@ray.remote(num_cpus=0)
class StubServer:
    """Stands in for one node of a verl vLLM replica (``vLLMHttpServer``): ``collective_rpc`` runs a ``th_*``
    method on the node's engine rank and returns the results, as the patched server does."""

    def __init__(self, replica_rank: int, recorder, fail_check_of: int | None = None,
                 unavailable_once: int | None = None, corrupt: int | None = None):
        """``fail_check_of``: a version whose staged pull this rank reports as failed its digest check.
        ``corrupt``: a version whose staged reads on this rank raise ``DigestMismatch``, and ``unavailable_once``
        one whose first staged pull here finds no holder (``TransferFailed``), as the fetcher raises them; both go
        through the real holder, which tells the two apart (the pull must stage: ``delta=off``). The data plane's
        check fails only on bytes that differ from the publisher's, which no real source here serves to one
        reader alone."""
        from tensorhub_verl.errors import DigestMismatch, TransferFailed

        refuse = {}
        if corrupt is not None:
            refuse[corrupt] = (DigestMismatch(f"no holder can serve chunk(s) [0] of policy v{corrupt}: 1 read(s) "
                                              f"landed bytes that fail the chunk digests"), True)
        if unavailable_once is not None:
            refuse[unavailable_once] = (TransferFailed(f"no holder can serve chunk(s) [0] of policy "
                                                       f"v{unavailable_once}; every source failed or left"), False)
        self.rank = StubEngineRank(replica_rank, recorder, refuse)
        self.engine = self.rank.extension()
        self.steps: list[int] = []
        self.holds: list[bool] = []
        self.fail_check_of = fail_check_of

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        answer = getattr(self.engine, method)(*args, **(kwargs or {}))
        pull = getattr(answer, "pull", None) if method == "th_status" else None
        if pull is not None and pull.version == self.fail_check_of and pull.state == "ready":
            pull.state, pull.error = "failed", f"DigestMismatch('v{pull.version}: a chunk digest differs')"
            pull.check_failed = True
        return [answer]

    def get_server_address(self):
        return "127.0.0.1", 0

    def clear_kv_cache(self):
        return None

    def set_global_steps(self, global_steps: int):
        self.steps.append(global_steps)

    def th_hold_admission(self, hold: bool) -> dict:
        """The staleness bound's gate (the real one is verl's, patched: test_version_labels_on_cpu)."""
        self.holds.append(bool(hold))
        return {"held": bool(hold), "held_back": 2 if hold else 0}

    def hold_calls(self) -> list[bool]:
        return list(self.holds)

    def served_digest(self):
        return digest(self.rank.params.items())


class FakeReplica:
    """A rollout replica: real holders in stub server actors, a fake generation state."""

    def __init__(self, replica_rank: int, servers: list, recorder, fail_abort: bool = False):
        self.replica_rank = replica_rank
        self.servers = servers
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
        weights = weights_at(global_steps)
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
class GateServer:
    """One rollout server as verl's load balancer and client reach it: verl's real submission gate (a
    ``vLLMHttpServer`` built without an engine, patched: ``th_hold_admission``) in front of a ``generate`` that
    answers after a short while. Each request that reaches it is recorded, whether or not its gate admits it."""

    def __init__(self, replica_rank: int, job_config):
        import asyncio

        import tensorhub_verl.verl.checkpoint_engine  # noqa: F401  registers the patches
        from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

        server = object.__new__(vLLMHttpServer)  # the gate's state, as vLLMHttpServer.__init__ sets it
        server.config, server.replica_rank = job_config.actor_rollout_ref.rollout, replica_rank
        server._submission_paused, server._admitting, server._rejecting = False, 0, False
        server._resume_event = asyncio.Event()
        server._resume_event.set()
        self.server = server
        self.arrived: list[str] = []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        import asyncio

        from verl.workers.rollout.replica import TokenOutput

        self.arrived.append(request_id)
        rejected = await self.server._park_until_admitted(request_id)
        if rejected is not None:
            return rejected
        try:
            await asyncio.sleep(0.05)
        finally:
            self.server._admitting -= 1
        return TokenOutput(token_ids=[1, 2, 3], log_probs=None, stop_reason="completed",
                           extra_fields={"global_steps": 1})

    async def th_hold_admission(self, hold: bool) -> dict:
        return await self.server.th_hold_admission(hold)

    def requests(self) -> int:
        return len(self.arrived)
