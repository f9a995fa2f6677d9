"""The processes of `tensorhub bench soak` (run with ``procs.Role``), and the bad peers it injects.

Every role answers on its result queue with ``("ok", {"event": ..., ...})`` and takes commands from its
control queue. The content of version v is a pure function of (seed, v), so a reader checks every byte
it fetched against what that version must hold, independently of the hub, the planner and the digests.
"""

from __future__ import annotations

import base64
import os
import time

import httpx
import torch

from tensorhub_verl.bench.procs import content_digest, random_weights
from tensorhub_verl.errors import InvalidRequest, TensorHubError
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER

MODEL = "policy"
_COMMAND_TIMEOUT_S = 3600.0
"""A role waits this long for its next command, then gives up (the orchestrator died)."""


def version_weights(seed: int, version: int, size_mb: float) -> dict[str, torch.Tensor]:
    return random_weights(size_mb, seed=seed * 100_003 + version)


def trainer(results, control, hub_url: str, seed: int, size_mb: float, chunk_bytes: int) -> None:
    """Publishes each version it is told to; the hub's retention tells it when to let old ones go."""
    import tensorhub_verl as th

    client = th.connect(hub_url, "trainer", chunk_bytes=chunk_bytes, hub_retry_s=120.0,
                        preserve_on_unpublish=False)
    results.put(("ok", {"event": "ready", "pid": os.getpid()}))
    while (command := control.get(timeout=_COMMAND_TIMEOUT_S)) != "stop":
        _, version = command
        client.publish(MODEL, version, version_weights(seed, version, size_mb))
        results.put(("ok", {"event": "published", "version": version}))
    client.close()


def reader(results, control, hub_url: str, worker: str, seed: int, size_mb: float, fetch_timeout_s: float) -> None:
    """Fetches (and then holds, serving peers) each version it is told to, and checks every byte."""
    import tensorhub_verl as th

    client = th.connect(hub_url, worker, window=4, read_timeout_s=5.0, hub_retry_s=120.0,
                        preserve_on_unpublish=False)
    results.put(("ok", {"event": "ready", "pid": os.getpid()}))
    while (command := control.get(timeout=_COMMAND_TIMEOUT_S)) != "stop":
        _, version = command
        results.put(("ok", {"event": "started", "version": version}))
        started = time.monotonic()
        report = {"event": "fetched", "version": version, "ok": False, "torn": False}
        try:
            stats = client.fetch(MODEL, version, timeout=fetch_timeout_s)
        except TensorHubError as e:
            report["error"] = f"{type(e).__name__}: {e}"[:300]
        else:
            expected = content_digest(version_weights(seed, version, size_mb))
            report["torn"] = content_digest(stats.buffers) != expected
            report.update(ok=not report["torn"], sources=stats.sources, failed_reads=stats.failed_reads)
        report["seconds"] = round(time.monotonic() - started, 3)
        results.put(("ok", report))
    client.close()


def tamperer(results, control, hub_url: str, seed: int, size_mb: float, chunk_bytes: int) -> None:
    """A bad peer: publishes the right bytes of a version, then changes them (breaks a holder's promise)."""
    import tensorhub_verl as th

    client = th.connect(hub_url, "tamperer", chunk_bytes=chunk_bytes, hub_retry_s=120.0, preserve_on_unpublish=False)
    results.put(("ok", {"event": "ready", "pid": os.getpid()}))
    while (command := control.get(timeout=_COMMAND_TIMEOUT_S)) != "stop":
        _, version = command
        for _, old, _ in client.holdings():
            client.unpublish(MODEL, old)
        weights = version_weights(seed, version, size_mb)
        client.publish(MODEL, version, weights)
        for t in weights.values():  # every chunk changes: each read from here fails its digest
            t.view(-1)[::max(1, t.numel() // 512)] += 1
        results.put(("ok", {"event": "tampered", "version": version}))
    client.close()


def impostor(url: str, worker: str, metadata: bytes, version: int = 1, timeout: float = 10.0) -> None:
    """A bad peer: registers data-plane metadata nobody can use and claims to hold ``version`` of policy.
    It never heartbeats, so the hub drops it at the worker timeout."""
    manifest = httpx.get(f"{url}/v1/manifest", params={"model": MODEL, "version": str(version)}, timeout=timeout)
    registered = httpx.post(f"{url}/v1/workers/register", timeout=timeout, json={
        "worker": worker, "location": {}, "agent_name": f"{worker}-agent",
        "agent_metadata_b64": base64.b64encode(metadata).decode()})
    if manifest.status_code != 200 or registered.status_code != 200:
        raise InvalidRequest(f"impostor {worker}: manifest {manifest.status_code}, register {registered.text[:200]}")
    regions = [{"addr": 4096 * (i + 1)} for i in range(len(manifest.json()["tensors"]))]
    published = httpx.post(f"{url}/v1/publish", timeout=timeout, json={
        "worker": worker, "holder": worker, "manifest": manifest.json(), "regions": regions},
        headers={CREDENTIAL_HEADER: registered.json()["credential"]})
    if published.status_code != 200:
        raise InvalidRequest(f"impostor {worker}: publish refused: {published.text[:200]}")
