"""The rollout updater for the ``tensorhub`` backend: replaces verl's per-step weight-sync sequence.

verl 0.9.1's ``CheckpointEngineManager.update_weights`` aborts generation on every replica, drops the
KV cache, builds a process group over trainer + all rollout workers, transfers, and only then resumes
everyone. With ROS none of that is needed:

```
 trainer (master rank)            hub               replica 0          replica 1   ...
   publish v ─────────────────────>│                    │                  │
   (returns once held)             │<── pull v ─────────┤ (generating)     │
                                   │<── pull v ─────────┼──────────────────┤ (generating)
                                   │   chunks from trainer AND from peers that already have them
                                   │                 pause ─ apply ─ resume│
                                   │                    │     pause ─ apply ─ resume
```

Each engine rank's live parameters are the holder of the version it serves (``TensorHubWorkerExtension``
inside verl's vLLM workers): a replica reads raw from peers that serve the version in its own layout, else
the trainer's ``hf`` tensors, and no copy of the model exists outside the engines. Each replica is paused
only for its own apply (abort_all_requests keeps partial rollouts, as verl's partial-rollout path does;
resume_generation continues them), and replicas do not wait for each other. With
``rollout_staging='none'`` the apply includes the pull (into the parameters); with 'cpu'/'gpu' the pull
runs before the pause, into a staging buffer.
The replica list is read at every update, so replicas added or removed between steps (elastic
rollouts) need no group rebuild: a new replica simply pulls, mostly from its peers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tensorhub_verl.errors import ConfigError, DigestMismatch, TransferFailed
from tensorhub_verl.verl import BACKEND_NAME
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.digest import DIGEST_KEY, differing
from tensorhub_verl.verl.engines import ReplicaEngines
from tensorhub_verl.verl.fleet_flip import flip_fleet
from tensorhub_verl.verl.lora import LORA_KEY, adapter_update_result
from tensorhub_verl.verl.identity import ray_boundary_facts
from tensorhub_verl.verl.metrics import stale_replicas, update_metrics
from tensorhub_verl.vllm.results import UpdateResult

logger = logging.getLogger("tensorhub_verl.verl.updater")


@dataclass(slots=True)
class ReplicaOutcome:
    replica: int
    update: UpdateResult | None = None
    """What the replica's ranks pulled and applied (None: it already served the version, or it failed)."""
    stall_s: float = 0.0
    digests_checked: int = 0
    error: BaseException | None = None
    version: int | None = None
    """The version the replica serves after this update (None: unchanged, or it failed)."""


@dataclass(slots=True)
class Staged:
    """A replica whose ranks finished pulling ``version`` (``statuses`` None: they already served it)."""

    engines: ReplicaEngines
    updater: Any
    version: int
    statuses: list | None


def config_from_engine_config(engine_config: Any) -> TensorHubVerlConfig:
    """The ``tensorhub`` block out of verl's ``CheckpointEngineConfig`` (``engine_kwargs['tensorhub']``)."""
    backend = getattr(engine_config, "backend", None)
    if backend != BACKEND_NAME:
        raise ConfigError(f"checkpoint_engine.backend is {backend!r}; the TensorHub updater needs {BACKEND_NAME!r}")
    kwargs = getattr(engine_config, "engine_kwargs", None) or {}
    return TensorHubVerlConfig.from_mapping(kwargs.get(BACKEND_NAME))


def _hub_restarts(config: TensorHubVerlConfig) -> int | None:
    """``hub_actor.hub_restarts``, imported when first needed (it imports Ray)."""
    from tensorhub_verl.verl.hub_actor import hub_restarts

    return hub_restarts(config)


class TensorHubUpdater:
    """Publishes a version from the trainer and rolls it out replica by replica, without a global pause.

    Args:
        config: the job's TensorHub config.
        actor_wg: verl's trainer worker group (its ``update_weights(mode='tensorhub')`` publishes).
        replicas: a callable returning the current replica list (read at every update: elastic).
        engines: reaches one replica's engine ranks (its vLLM server actors by default).
        hub_url: resolves the hub URL once, before the first publish (starts the hub actor if needed).
        job: tag of the rollout workers' ids at the hub; default: the Ray job id.
    """

    def __init__(self, *, config: TensorHubVerlConfig, actor_wg: Any, replicas: Callable[[], Sequence[Any]],
                 engines: Callable[[Any], ReplicaEngines] = ReplicaEngines,
                 hub_url: Callable[[TensorHubVerlConfig], str] | None = None, job: str | None = None) -> None:
        self.config = config
        self.actor_wg = actor_wg
        self._replicas = replicas
        self._hub_url = hub_url
        self.hub: str | None = None
        self.served: dict[int, int | None] = {}
        """replica rank -> the version it serves (None until its first apply)."""
        self.last_metrics: dict[str, float] = {}
        self._engines = engines
        self._set_up: dict[int, tuple] = {}
        """replica rank -> the ``ReplicaEngines.key`` its engines were set up with."""
        self._job = job
        self._held: set[int] = set()
        """Replicas whose new requests are held for staleness (``max_version_lag``)."""
        self.flip_committed: int | None = None
        """The fleet flip's commit, as the hub last answered (``flip_together``)."""
        self._base_served: dict[tuple, int] = {}
        """LoRA: ``ReplicaEngines.key`` -> the base version those engines serve (a restarted replica has none)."""

    async def update_weights(self, global_steps: int | None = None) -> dict[str, float]:
        if self.hub is None:
            if self._hub_url is None:
                from tensorhub_verl.verl.hub_actor import ensure_hub

                self._hub_url = ensure_hub
            # Resolve (and maybe create) the hub here, once, so that trainer and rollouts find the same one.
            self.hub = await asyncio.to_thread(self._hub_url, self.config)
        version = global_steps if global_steps is not None else max(
            (v for v in self.served.values() if v is not None), default=-1) + 1

        started = time.monotonic()
        publish = await self._await_all(self.actor_wg.update_weights(global_steps=version, mode=BACKEND_NAME),
                                        self.config.fetch_timeout_s, "trainer publish")
        published_s = time.monotonic() - started

        publish = [p for p in publish if isinstance(p, dict)]
        published_digest = next((p.pop(DIGEST_KEY) for p in publish if DIGEST_KEY in p), None)
        lora = next((p.pop(LORA_KEY) for p in publish if LORA_KEY in p), None)
        self._job = self._job or ray_boundary_facts()[0]
        replicas = list(self._replicas())
        live = {r.replica_rank for r in replicas}
        self.served = {k: v for k, v in self.served.items() if k in live}  # removed replicas are forgotten
        for r in replicas:
            self.served.setdefault(r.replica_rank, None)
        flip_metrics: dict[str, float] = {}
        if lora is not None:
            outcomes = await asyncio.gather(*(self._update_replica_lora(r, version, lora["base_version"])
                                              for r in replicas))
        elif self.config.flip_together:
            outcomes, flip_metrics = await flip_fleet(self, replicas, version, published_digest)
        else:
            outcomes = await asyncio.gather(*(self._update_replica(r, version, published_digest) for r in replicas))

        failed = [o for o in outcomes if o.error is not None]
        for o in outcomes:
            if o.error is None and o.version is not None:
                self.served[o.replica] = o.version
        metrics = update_metrics(version=version, publish=publish,
                                 updates=[o.update for o in outcomes if o.update is not None],
                                 stalls={o.replica: o.stall_s for o in outcomes if o.error is None},
                                 served=self.served)
        metrics.update(flip_metrics)
        if self.config.max_version_lag is not None:
            metrics.update(await self._bound_staleness(replicas, version))
        metrics["tensorhub/update_s"] = time.monotonic() - started
        if published_digest is not None:
            metrics["tensorhub/digest_mismatches"] = float(sum(isinstance(o.error, DigestMismatch) for o in outcomes))
            metrics["tensorhub/digests_checked"] = float(sum(o.digests_checked for o in outcomes))
        metrics["tensorhub/trainer_publish_wait_s"] = published_s
        restarts = await asyncio.to_thread(_hub_restarts, self.config)
        if restarts is not None:  # the job's own hub actor: a restart of it shows in the step that met it
            metrics["tensorhub/hub_restarts"] = float(restarts)
        self.last_metrics = metrics
        if failed:
            ok = len(outcomes) - len(failed)
            for o in failed:
                logger.error("replica %d did not apply v%d and keeps serving v%s: %s", o.replica, version,
                             self.served.get(o.replica), o.error)
            if ok < self.config.min_replica_fraction * len(outcomes):
                raise TransferFailed(f"only {ok}/{len(outcomes)} replicas applied version {version} "
                                     f"(min_replica_fraction={self.config.min_replica_fraction}); "
                                     f"first error: {failed[0].error!r}") from failed[0].error
        logger.info("v%d applied on %d/%d replicas in %.2fs (max stall %.3fs, peer fraction %.2f)", version,
                    len(outcomes) - len(failed), len(outcomes), metrics["tensorhub/update_s"],
                    metrics["tensorhub/stall_s"], metrics["tensorhub/sources_peer_fraction"])
        return metrics

    async def _bound_staleness(self, replicas: Sequence[Any], version: int) -> dict[str, float]:
        """``max_version_lag``: holds new requests at every replica more than that many versions behind
        ``version`` (its requests in flight finish) and releases the others; a held replica is released by
        the first update it applies. Replicas serving the newest version any replica serves are never held.
        Runs after every replica's update, so verl's own resume cannot undo it."""
        self._held &= {r.replica_rank for r in replicas}  # removed replicas are forgotten
        stale = stale_replicas(version, self.served, self.config.max_version_lag)
        # Never the replicas serving the fleet's newest version: while a version waits (a fleet flip held back),
        # holding them too would stop all generation, and with it the trainer that makes the next version.
        front = max((v for v in self.served.values() if v is not None), default=None)
        stale = {r for r in stale if self.served.get(r) is None or self.served.get(r) != front}
        timeout = self.config.apply_timeout_s
        held_back = 0
        for replica in replicas:
            hold = replica.replica_rank in stale
            if not hold and replica.replica_rank not in self._held:
                continue  # never held: nothing to release
            try:
                held_back += await self._engines(replica).hold_admission(hold, timeout)
            except Exception as e:  # a replica that cannot be reached is reported; the step goes on
                logger.error("replica %d: could not %s its new requests: %s", replica.replica_rank,
                             "hold" if hold else "release", e)
                continue
            if hold:
                if replica.replica_rank not in self._held:
                    logger.warning("replica %d serves v%s, more than %d versions behind v%d: it admits no new "
                                   "request until it applies a newer one", replica.replica_rank,
                                   self.served.get(replica.replica_rank), self.config.max_version_lag, version)
                self._held.add(replica.replica_rank)
            else:
                self._held.discard(replica.replica_rank)
        return {"tensorhub/replicas_held": float(len(self._held)),
                "tensorhub/requests_held_back": float(held_back)}

    async def _update_replica(self, replica: Any, version: int, published_digests: dict | None = None
                              ) -> ReplicaOutcome:
        outcome = ReplicaOutcome(replica=replica.replica_rank)
        try:
            staged = await self._stage(replica, version)
            if staged.statuses is None:
                outcome.version = version
                return outcome  # already serving this version
            await self._apply_staged(replica, staged, outcome, published_digests)
        except Exception as e:  # one replica's failure (Ray, hub, timeout) is reported; the caller decides
            outcome.error = e
        return outcome

    async def _stage(self, replica: Any, version: int) -> Staged:
        """Sets the replica up if needed and starts its pull of ``version``; with staging it runs while the engine
        keeps generating. Returns once no rank is pulling (``statuses`` None: every rank serves ``version``)."""
        engines = self._engines(replica)
        if self._set_up.get(engines.replica_rank) != engines.key:
            await engines.setup(self.config, self.hub, self._job)
            self._set_up[engines.replica_rank] = engines.key
        updater = engines.updater(self.config.apply_timeout_s)
        await asyncio.to_thread(updater.begin, version)
        statuses = await asyncio.to_thread(updater.wait_pulled, self.config.fetch_timeout_s)
        if all(s.pull is None for s in statuses):
            return Staged(engines, updater, version, None)
        return Staged(engines, updater, version, statuses)

    async def _apply_staged(self, replica: Any, staged: Staged, outcome: ReplicaOutcome,
                            published_digests: dict | None) -> None:
        """Pauses the replica only for the apply of what it staged (every rank, or an abort on every rank); resumes
        it even if the apply fails. Raises what failed."""
        engines, updater, version = staged.engines, staged.updater, staged.version
        if any(s.pull is not None and s.pull.state == "failed" for s in staged.statuses):
            # Refused before anything moved (e.g. another dtype): abort on every rank, no pause; raises.
            await asyncio.to_thread(updater.finish, self.config.apply_timeout_s)
        paused = time.monotonic()
        try:
            await asyncio.wait_for(replica.abort_all_requests(), self.config.apply_timeout_s)
            outcome.update = await asyncio.to_thread(updater.finish, self.config.apply_timeout_s)
            await engines.after_apply(version, self.config.apply_timeout_s)
        finally:
            await asyncio.wait_for(replica.resume_generation(), self.config.apply_timeout_s)
            outcome.stall_s = time.monotonic() - paused
        if published_digests is not None:
            outcome.digests_checked = await self._check_digests(engines, version, published_digests)
        outcome.version = version

    async def _update_replica_lora(self, replica: Any, version: int, base_version: int) -> ReplicaOutcome:
        """LoRA: the replica's base reaches ``base_version`` once (the usual update); then, paused, every engine
        rank fetches adapter ``version`` (from the trainer or a peer) and serves it as verl's adapter id."""
        from verl.workers.rollout.vllm_rollout.utils import VLLM_LORA_INT_ID

        outcome = ReplicaOutcome(replica=replica.replica_rank)
        try:
            engines = self._engines(replica)
            base = None
            if self._base_served.get(engines.key) != base_version:
                base = await self._update_replica(replica, base_version)
                if base.error is not None:
                    raise base.error
                self._base_served[engines.key] = base_version
            timeout = self.config.apply_timeout_s
            await asyncio.to_thread(engines.rpc, "th_lora_setup", {"lora_int_id": VLLM_LORA_INT_ID,
                                                                   "fetch_timeout_s": self.config.fetch_timeout_s},
                                    timeout)
            paused = time.monotonic()
            try:
                await asyncio.wait_for(replica.abort_all_requests(), timeout)
                results = await asyncio.to_thread(engines.rpc, "th_lora_update",
                                                  {"version": version, "timeout_s": self.config.fetch_timeout_s},
                                                  self.config.fetch_timeout_s + timeout)
                await engines.after_apply(version, timeout)
            finally:
                await asyncio.wait_for(replica.resume_generation(), timeout)
                outcome.stall_s = time.monotonic() - paused + (base.stall_s if base is not None else 0.0)
            outcome.update = adapter_update_result(version, results, base.update if base is not None else None)
            outcome.version = version
        except Exception as e:  # one replica's failure is reported; the caller decides
            outcome.error = e
        return outcome

    async def _check_digests(self, engines: ReplicaEngines, version: int, published: dict[str, str]) -> int:
        """Every rank's served weights, read back as HF tensors, equal what the trainer published; returns the
        number of ranks checked."""
        answers = await asyncio.to_thread(engines.rpc, "th_hf_digests", {}, self.config.apply_timeout_s)
        for answer in answers:
            bad = differing(published, answer["digests"], answer["unused"])
            if answer["version"] != version or bad:
                raise DigestMismatch(f"replica {engines.replica_rank} serves v{answer['version']} whose tensors "
                                     f"{bad[:3]} differ from the trainer's v{version}")
        return len(answers)

    @staticmethod
    async def _await_all(refs: Any, timeout: float, what: str) -> list:
        """Awaits a worker group's results (ObjectRefs, or plain values from in-process fakes)."""
        refs = refs if isinstance(refs, list) else [refs]

        async def one(ref):
            return await ref if hasattr(ref, "__await__") else ref

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(r) for r in refs)), timeout)
        except asyncio.TimeoutError as e:
            raise TransferFailed(f"{what} did not finish within {timeout} s") from e
