"""Driver side: moves every TP rank of one vLLM engine to a new version together, all-or-nothing.

    driver                                   rank 0 .. k-1 (worker extension)
    th_newest_version ───────────────────►   (rank 0's answer fixes the version for all ranks)
    th_begin_pull(v) ────────────────────►   pull threads start; the engine keeps generating
    th_status (polled, cheap) ───────────►   until no rank is "pulling"
    any rank failed?  th_abort ──────────►   every rank drops its pull; the engine keeps serving the old v
    else              th_apply ──────────►   the stall: unpublish old, copy in, publish v

The engine is a holder of v only once every rank applied it; each rank pulls its own layout
(``vllm/<arch>/tp<k>/rank<r>``), so a k-shard reader always gets every shard at the same version.
``rpc(method, kwargs, timeout)`` is the engine's collective RPC (``LLM.collective_rpc`` or a wrapper around
``AsyncLLM.collective_rpc``); it returns one answer per rank (``results.ApplyResult.from_wire`` reads them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tensorhub_verl import errors
from tensorhub_verl.vllm.results import ApplyResult, HolderStatus, UpdateResult

logger = logging.getLogger("tensorhub_verl.vllm.engine_updater")

Rpc = Callable[[str, dict, float], list]


def llm_rpc(llm) -> Rpc:
    """An ``Rpc`` over a synchronous ``vllm.LLM``."""
    def rpc(method: str, kwargs: dict, timeout: float) -> list:
        return llm.collective_rpc(method, timeout=timeout, kwargs=kwargs)
    return rpc


class EngineUpdater:
    """Drives ``TensorHubWorkerExtension`` on all ranks of one engine."""

    def __init__(self, rpc: Rpc, *, rpc_timeout_s: float = 60.0, poll_s: float = 0.02):
        if rpc_timeout_s <= 0 or poll_s <= 0:
            raise errors.ConfigError("rpc_timeout_s and poll_s must be > 0")
        self._rpc = rpc
        self.rpc_timeout_s = rpc_timeout_s
        self.poll_s = poll_s

    def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> list:
        return self._rpc(method, kwargs, timeout or self.rpc_timeout_s)

    def setup(self, hub_url: str, model: str, worker: str, location: Any = None, token: str | None = None,
              staging: str = "cpu", client_config: dict | None = None, fetch_timeout_s: float = 300.0,
              bucket_bytes: int | None = None, delta: str = "auto") -> list[HolderStatus]:
        """Connects every rank (see ``TensorHubWorkerExtension.th_setup``); returns their statuses."""
        extra = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        answers = self.call("th_setup", hub_url=hub_url, model=model, worker=worker, location=location, token=token,
                            staging=staging, client_config=client_config, fetch_timeout_s=fetch_timeout_s,
                            delta=delta, **extra)
        return [HolderStatus.from_wire(s) for s in answers]

    def status(self) -> list[HolderStatus]:
        """Every rank's ``th_status``, typed whichever way it crossed the RPC."""
        return [HolderStatus.from_wire(s) for s in self.call("th_status")]

    def served_version(self) -> int | None:
        """The version every rank serves, or None if they differ or one is broken or empty."""
        st = self.status()
        versions = {s.served for s in st}
        if len(versions) != 1 or any(s.broken for s in st):
            return None
        return versions.pop()

    def resolve(self, version: int | str) -> int:
        if version != "latest":
            return int(version)
        newest = self.call("th_newest_version")[0]
        if newest is None:
            raise errors.VersionNotFound("no version is published")
        return int(newest)

    def begin(self, version: int | str = "latest") -> int:
        """Starts the pull on every rank; returns the version (same for all ranks)."""
        v = self.resolve(version)
        self.call("th_begin_pull", version=v)
        return v

    def wait_pulled(self, timeout: float) -> list[HolderStatus]:
        """Polls until no rank is pulling; raises TimeoutError after ``timeout``. Never blocks the engine."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if not any(s.pulling for s in st):
                return st
            if time.monotonic() >= deadline:
                raise TimeoutError(f"pull still running after {timeout} s")
            time.sleep(self.poll_s)

    def finish(self, timeout: float = 300.0) -> UpdateResult:
        """Waits for the pulls, then applies on every rank, or aborts on every rank if any pull failed."""
        t0 = time.monotonic()
        st = self.wait_pulled(timeout)
        pulls = [s.pull for s in st]
        if all(p is None for p in pulls):
            v = st[0].served
            return UpdateResult(version=-1 if v is None else v, applied=False)
        failed = [(i, p) for i, p in enumerate(pulls) if p is None or p.state == "failed"]
        if failed:
            self.call("th_abort")
            rank, p = failed[0]
            raise errors.TransferFailed(f"rank {rank} could not pull v{None if p is None else p.version}: "
                                        f"{None if p is None else p.error}; every rank keeps its old version")
        ranks = [ApplyResult.from_wire(r) for r in self.call("th_apply", timeout=timeout + self.rpc_timeout_s)]
        return UpdateResult.of_ranks(ranks, seconds=time.monotonic() - t0)

    def update(self, version: int | str = "latest", timeout: float = 300.0) -> UpdateResult:
        """``begin`` + ``finish``, then waits until every rank holds the version in its layout (``finish`` alone
        returns before that: the ranks publish after the stall). Returns ``applied=False`` when every rank already
        serves the version."""
        t0 = time.monotonic()
        v = self.begin(version)
        res = self.finish(timeout)
        if not res.applied:
            res.version = v
        else:
            self.call("th_wait_published", timeout=timeout + self.rpc_timeout_s, timeout_s=timeout)
        res.seconds = time.monotonic() - t0
        return res

    def shutdown(self) -> None:
        self.call("th_shutdown")


__all__ = ["EngineUpdater", "Rpc", "UpdateResult", "llm_rpc"]
