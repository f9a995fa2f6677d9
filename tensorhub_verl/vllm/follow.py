"""The follower of an elastic rollout node (``tensorhub attach-vllm``): applies each newer version on its engine.

    HubWatch ── long-polls the hub (GET /v1/wait), never touches the engine while idle
        │ newer version v
        ▼
    Follower ── EngineUpdater.begin(v) (pull while serving) ─► finish() (the stall) ─► FollowerState

The watch talks to the hub directly (no worker registration, no engine RPC), so an idle node costs no engine
round trips: vLLM's workers spin for a while after every collective RPC, which a shared CPU host feels.
Every wait is bounded; ``stop()`` ends the thread within one poll. A hub that stays unreachable for
``hub_lost_s`` is reported once to ``on_hub_lost`` (``attach-vllm`` then shuts the node down, or keeps serving its
last version when told to), so a node whose job has ended does not wait for a hub forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tensorhub_verl import errors
from tensorhub_verl.errors import Cancelled
from tensorhub_verl.ros.wire.manifest import HF_LAYOUT
from tensorhub_verl.vllm.results import UpdateResult

logger = logging.getLogger("tensorhub_verl.vllm.follow")


@dataclass(slots=True)
class FollowerState:
    """What ``GET /tensorhub/status`` reports."""

    worker: str
    model: str
    served: int | None = None
    updates: int = 0
    first: UpdateResult | None = None
    """The initial fetch (its ``sources`` tell whether a peer or the trainer served it)."""
    last: UpdateResult | None = None
    last_error: str | None = None
    hub_lost: bool = False
    """The hub has been unreachable for longer than the follower's ``hub_lost_s``."""
    history: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"worker": self.worker, "model": self.model, "served": self.served, "updates": self.updates,
                "first": None if self.first is None else self.first.as_dict(),
                "last": None if self.last is None else self.last.as_dict(), "last_error": self.last_error, "hub_lost": self.hub_lost,
                "history": self.history[-20:]}


class HubWatch:
    """Newest published version of one model, by long polls on the hub (no worker identity needed: the
    hub's queries that ``Client.versions``/``wait_for_version`` make too, on a bare ``HubClient``)."""

    def __init__(self, hub_url: str, model: str, token: str | None = None, poll_s: float = 2.0,
                 retry_s: float = 10.0, ca_file: str | None = None, allow_plain_http: bool = False):
        from tensorhub_verl.ros.client.hub_client import HubClient

        if poll_s <= 0 or retry_s <= 0:
            raise errors.ConfigError(f"poll_s and retry_s must be > 0, got {poll_s}, {retry_s}")
        self.model = model
        self.poll_s = poll_s
        self._hub = HubClient(hub_url, token, request_timeout_s=15.0, retry_s=retry_s, ca_file=ca_file,
                              allow_plain_http=allow_plain_http)

    def newest(self) -> int | None:
        """Newest version in any layout (versions only peers still hold count too)."""
        return max(self._hub.versions(self.model), default=None)

    def wait_newer(self, newer_than: int | None, timeout: float) -> int | None:
        """A version newer than ``newer_than``, waiting at most ``timeout`` s (None if none appeared)."""
        v = self._hub.wait(self.model, newer_than, HF_LAYOUT, max(0.1, min(timeout, self.poll_s)))
        if v is None:  # no new 'hf' version: a version may still exist only in engine layouts
            v = self.newest()
        return None if v is None or (newer_than is not None and v <= newer_than) else int(v)

    def close(self) -> None:
        self._hub.close()


class Follower:
    """Brings the engine to the newest version, first once (``first_version``), then on a thread."""

    def __init__(self, updater, watch: HubWatch, state: FollowerState, fetch_timeout_s: float, *,
                 hub_lost_s: float | None = None, on_hub_lost: Callable[[], None] | None = None):
        if hub_lost_s is not None and hub_lost_s <= 0:
            raise errors.ConfigError(f"hub_lost_s must be > 0 (or None: wait for the hub forever), got {hub_lost_s}")
        self.updater = updater
        self.watch = watch
        self.state = state
        self.fetch_timeout_s = fetch_timeout_s
        self.hub_lost_s = hub_lost_s
        self._on_hub_lost = on_hub_lost
        self._hub_heard = time.monotonic()
        self._hub_lost_reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def first_version(self, timeout: float) -> UpdateResult:
        """Waits (at most ``timeout`` s) for a published version and applies it. Raises TimeoutError, or
        ``Cancelled`` (errors.py) when ``stop()`` was called meanwhile."""
        deadline = time.monotonic() + timeout
        logger.info("waiting up to %.0f s for a version of %s", timeout, self.state.model)
        while True:
            if self._stop.is_set():
                raise Cancelled("stopped before a first version was applied")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no version of {self.state.model!r} published within {timeout} s")
            v = self.watch.wait_newer(None, min(remaining, 2.0))
            if v is None:
                continue
            try:
                res = self.updater.update(v, self.fetch_timeout_s)
            except errors.VersionNotFound:  # retention dropped it meanwhile: take the next newest
                continue
            self._record(res, first=True)
            return res

    def _record(self, res: UpdateResult, first: bool = False) -> None:
        self.state.served = res.version
        self.state.updates += 1
        self.state.last = res
        self.state.last_error = None
        if first:
            self.state.first = res
        self.state.history.append({"version": res.version, "stall_s": res.stall_s, "pull_s": res.pull_s,
                                   "sources": dict(res.sources), "source_layouts": list(res.source_layouts)})
        logger.info("serving %s v%s (stall %.3f s, pull %.3f s, sources %s)", self.state.model, res.version,
                    res.stall_s, res.pull_s, sorted(res.sources))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tensorhub-follow", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                try:
                    v = self.watch.wait_newer(self.state.served, self.watch.poll_s)
                except errors.HubUnavailable:
                    self._check_hub_lost()
                    raise
                self._hub_heard = time.monotonic()
                self.state.hub_lost = self._hub_lost_reported = False
                if v is None or self._stop.is_set():
                    continue
                self.updater.begin(v)
                self._record(self.updater.finish(self.fetch_timeout_s))
            except Exception as e:  # noqa: BLE001 - the node keeps serving its version and retries
                self.state.last_error = f"{type(e).__name__}: {e}"
                logger.warning("update failed, still serving v%s: %s", self.state.served, e)
                self._stop.wait(2.0)

    def _check_hub_lost(self) -> None:
        """Reports, once, a hub unreachable for longer than ``hub_lost_s`` since it was last heard."""
        silent = time.monotonic() - self._hub_heard
        if self.hub_lost_s is None or self._hub_lost_reported or silent < self.hub_lost_s:
            return
        self.state.hub_lost = self._hub_lost_reported = True
        logger.error("the hub has been unreachable for %.0f s (limit %.0f s); still serving v%s", silent,
                     self.hub_lost_s, self.state.served)
        if self._on_hub_lost is not None:
            self._on_hub_lost()

    def cancel(self) -> None:
        """Asks the follower to stop (safe from a signal handler); waits take at most one poll to notice."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Ends the thread; an update in progress finishes (or fails) first, bounded by ``timeout``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("follower still busy after %.0f s; leaving anyway", timeout)

    def close(self, timeout: float = 30.0) -> None:
        self.stop(timeout)
        self.watch.close()


__all__ = ["Cancelled", "Follower", "FollowerState", "HubWatch"]
