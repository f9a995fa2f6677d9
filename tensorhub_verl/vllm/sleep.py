"""vLLM sleep and wake for an engine whose live weights are a holder.

vLLM's sleep (``LLM.sleep``, ``AsyncLLM.sleep``; verl's ``free_cache_engine``) goes through the worker's
``sleep(level)``: the CuMem allocator unmaps the weights' pages (level 1 copies them to host memory first,
level 2 drops them) and ``wake_up(tags)`` maps fresh pages under the same virtual addresses. Memory that the data
plane registered (NIXL/UCX memory registrations, CUDA IPC handles) then names pages that no longer back the
weights, while the hub would still send readers there. So around sleep:

    sleep(level)   ─► before_sleep: every holding of the engine is unpublished (each waits for the reads in
                      flight, bounded by the unpublish timeout), the client disconnects (its data-plane agent and
                      every registration go with it) ─► vLLM frees the memory
    wake_up(tags)  ─► vLLM maps the memory back ─► after_wake (once "weights" are awake): a new client registers
                      the parameters as they are now; the engine holds its version again (level 1: the bytes
                      came back) or pulls the newest (a version published meanwhile, or level 2: bytes gone)

A reader never sees the engine as a holder while it sleeps: the hub plans its reads from other holders (the
trainer, peers), or it waits for one. The hooks wrap the worker instance's own ``sleep``/``wake_up`` (vLLM
reaches them by name through ``collective_rpc``), so every path that sleeps the engine passes through them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from tensorhub_verl import errors

logger = logging.getLogger("tensorhub_verl.vllm.sleep")

WEIGHTS_TAG = "weights"
LEVEL_KEEPS_WEIGHTS = 1
"""vLLM's sleep level 1 copies the weights to host memory and back; level 2 discards them."""


@dataclass(frozen=True, slots=True)
class Asleep:
    """What the engine held when it went to sleep."""

    served: int | None
    """The version its weights held (None: its initial weights, or a broken shard)."""
    level: int

    @property
    def weights_kept(self) -> bool:
        return self.level <= LEVEL_KEEPS_WEIGHTS

    def as_dict(self) -> dict:
        return {"served": self.served, "level": self.level, "weights_kept": self.weights_kept}


def wakes_weights(tags: list[str] | None) -> bool:
    """Whether ``wake_up(tags)`` maps the weights back (None: everything)."""
    return tags is None or WEIGHTS_TAG in tags


def rejoin(holder, asleep: Asleep) -> dict:
    """Makes a freshly built holder (a new client, the parameters as they are after wake) a holder again.

    Weights kept (level 1) and no newer version: it holds ``asleep.served`` again. A newer version exists: it
    holds the kept version while it pulls the newest (peers may read the old one meanwhile). Weights lost
    (level 2): it pulls the newest; if none exists or the pull fails the shard is ``broken`` (it reports no
    version, and the next update pulls one). A rank of a TP>1 engine never pulls here (its ranks move together,
    through the driver's next update): it holds its kept version again, or reports itself broken. Returns what it did; never raises a hub or transfer error (a
    failed pull must not fail vLLM's wake-up: the engine is awake and the next update retries)."""
    out: dict[str, Any] = {"before": asleep.served, "level": asleep.level, "action": "none", "error": None}
    try:
        # A TP>1 engine's ranks must move together (``EngineUpdater`` pulls on all or aborts on all): a rank
        # does not pull on its own here; the driver's next update does, for every rank.
        newest = holder.newest_version() if holder.config.shard_count == 1 else None
        if asleep.weights_kept and asleep.served is not None:
            holder.publish_served(asleep.served)
            out["action"] = "held"
            if newest is None or newest <= asleep.served:
                return out
        elif newest is None:
            if not asleep.weights_kept:
                holder.broken = True
                out["error"] = "no version pulled to restore the weights level-2 sleep discarded"
            return out
        result = holder.update(newest)
        out["action"] = "pulled"
        out["version"] = result.version
    except errors.TensorHubError as e:
        logger.warning("%s: after wake, holding or pulling failed (%s); the next update retries", holder.worker, e)
        out["error"] = repr(e)
        if not asleep.weights_kept and holder.served is None:
            holder.broken = True
    return out


def install_hooks(worker: Any, before: Callable[[int], Any], after: Callable[[list[str] | None], Any]) -> bool:
    """Wraps ``worker.sleep``/``worker.wake_up`` on the instance (once): ``before(level)`` runs before vLLM's
    sleep, ``after(tags)`` after its wake-up. Returns False when they were already wrapped, or when the object
    has no such methods (nothing can put it to sleep)."""
    if getattr(worker, "_tensorhub_sleep_hooked", False):
        return False
    sleep, wake_up = getattr(worker, "sleep", None), getattr(worker, "wake_up", None)
    if not callable(sleep) or not callable(wake_up):
        logger.debug("%s has no sleep/wake_up: no sleep hooks", type(worker).__name__)
        return False

    def hooked_sleep(level: int = 1, *args, **kwargs):
        before(level)
        return sleep(level, *args, **kwargs)

    def hooked_wake_up(tags: list[str] | None = None, *args, **kwargs):
        result = wake_up(tags, *args, **kwargs)
        after(tags)
        return result

    worker.sleep = hooked_sleep
    worker.wake_up = hooked_wake_up
    worker._tensorhub_sleep_hooked = True
    return True


__all__ = ["Asleep", "LEVEL_KEEPS_WEIGHTS", "WEIGHTS_TAG", "install_hooks", "rejoin", "wakes_weights"]
