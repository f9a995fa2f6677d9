"""Processes of `tensorhub bench modes`, each run inside one lab host (`python -m ... <role> ...`).

Roles talk to the hub over the lab network. They report to the orchestrator (outside the lab, no address
in it) with one JSON object per stdout line, and take orders through files in a shared directory:
a role waits for `--go` before it acts and for `--stop` before it lets go of what it holds.

- hub: an embedded hub on the host's lab address.
- trainer: publishes `policy` v1, plus the same tensors (no copy) as `pull-<i>` v1 for each baseline
  reader: a model only the trainer holds, so a baseline fetch reads every chunk from the trainer over the
  same transport, with the same client code.
- reader: allocates buffers, waits for go, fetches, reports FetchStats, holds until stop.
- with deltas (``--delta-lr``): the trainer publishes two versions drawn from the measured delta profile
  (``bench.delta_profile``), v1 and v2, and the delta v1 -> v2 of ``policy`` and of every ``pull-<i>``. A
  reader first fetches ``--base-model`` v1 (untimed; it holds it when that is its own model), then, after go,
  times the update to ``--model`` v2 with ``have=1`` (``--delta auto``: the delta where one is published;
  ``off``: v2 in full).
- bcast: one rank of a torch.distributed (gloo, TCP over the host's shaped NIC) group; rank 0 sits on the
  trainer host and owns the weights (one flat buffer, as a bucketed broadcast sends them). The group is
  formed before go (a fixed job forms it once); after go every rank times one `broadcast` of the version.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tensorhub_dev.netlab.lab import wait_file


def _say(**event) -> None:
    print(json.dumps(event), flush=True)


def _resident(tensors) -> None:
    """Writes every page of ``tensors`` once, before the clock starts. A rollout receives a version into weights
    that are resident (they hold the version before it); fresh ``torch.empty`` buffers would fault each page in
    during the timed receive instead, a kernel cost per byte that the raw-socket probe (one reused buffer) never
    pays. Applied to every receiver the benchmarks compare (TensorHub's readers and the broadcast's ranks)."""
    for t in tensors:
        t.zero_()


def _cpu_s() -> float:
    """CPU seconds this process (all its threads) has used so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def hub(a: argparse.Namespace) -> None:
    import tensorhub_verl as th

    from tensorhub_verl.ros.hub.config import HubConfig
    from tensorhub_verl.ros.hub.planner import PlannerConfig

    config = HubConfig(planner=PlannerConfig(max_inflight_per_source=a.max_inflight_per_source,
                                             seeds_per_dc=a.seeds_per_dc,
                                             first_complete_reads=a.first_complete_reads or None))
    server = th.start_hub(host=a.host, port=a.port, config=config)
    _say(event="ready", url=server.url)
    try:
        wait_file(a.stop, a.timeout)
    finally:
        server.stop()


def trainer(a: argparse.Namespace) -> None:
    import tensorhub_verl as th
    from tensorhub_verl.bench.procs import random_weights

    client = th.connect(a.hub, "trainer", a.location, chunk_bytes=int(a.chunk_mb * (1 << 20)),
                        progress=a.progress)
    if a.delta_lr > 0:
        _trainer_with_delta(a, client)
        return
    weights = random_weights(a.size_mb, seed=1)
    client.publish("policy", 1, weights)
    for i in range(a.private_copies):
        client.publish(f"pull-{i}", 1, weights)
    _say(event="ready", bytes=sum(t.numel() * t.element_size() for t in weights.values()))
    try:
        wait_file(a.stop, a.timeout)
    finally:
        client.close()


def delta_versions(size_mb: float, lr: float, tensors: int = 8, seed: int = 1) -> list[dict[str, "torch.Tensor"]]:
    """v1 and v2 of a bf16 version of ``size_mb`` MiB in ``tensors`` tensors, v2 drawn from v1 as the measured
    profile at ``lr`` says (``bench.delta_profile.delta_sequence``)."""
    import torch

    from tensorhub_verl.bench.delta_profile import default_profile, delta_sequence

    per = max(1 << 20, int(size_mb * (1 << 20)) // tensors // (1 << 20) * (1 << 20))  # whole MiB per tensor
    out = []
    for flat in delta_sequence(per * tensors, 2, profile=default_profile(lr), seed=seed):
        words = flat.view(torch.bfloat16)
        n = per // 2
        out.append({f"layers.{i}.weight": words[i * n:(i + 1) * n].clone() for i in range(tensors)})
    return out


def _trainer_with_delta(a: argparse.Namespace, client) -> None:
    """Publishes v1 and v2 of ``policy`` and of each ``pull-<i>`` (the same tensors, no copy), and each model's
    delta v1 -> v2 (encoded once per model: a baseline reader's delta is held by the trainer alone)."""
    v1, v2 = delta_versions(a.size_mb, a.delta_lr)
    models = ["policy", *(f"pull-{i}" for i in range(a.private_copies))]
    published = None
    encode_s = []
    for model in models:
        client.publish(model, 1, v1)
        client.publish(model, 2, v2)
        published = client.publish_delta(model, 2, base_version=1, mode="on")
        encode_s.append(published.seconds)
    _say(event="ready", bytes=sum(t.numel() * t.element_size() for t in v2.values()), delta_bytes=published.bytes,
         changed_fraction=published.changed_fraction, encodings=published.encodings,
         encode_s=round(statistics.median(encode_s), 3), lr=a.delta_lr)
    try:
        wait_file(a.stop, a.timeout)
    finally:
        client.close()


def reader(a: argparse.Namespace) -> None:
    if a.delta is not None:
        _delta_reader(a)
        return
    import tensorhub_verl as th

    client = th.connect(a.hub, a.worker, a.location, window=a.window, preserve_on_unpublish=False,
                        progress=a.progress)
    try:
        buffers = client.manifest(a.model, 1).allocate()
        _resident(buffers.values())
        # A rollout registers its weight buffers once, at startup, not once per version: publishing them
        # (under a private name) registers them with the transport and the hub; the fetch then reuses that.
        warm = f"warmup-{a.worker}"
        client.publish(warm, 0, buffers)
        client.unpublish(warm, 0)
        _say(event="ready")
        wait_file(a.go, a.timeout)
        started, t0 = time.time(), time.monotonic()
        cpu0 = _cpu_s()
        stats = client.fetch(a.model, 1, into=buffers, hold=a.hold, timeout=a.timeout)
        timeline = [(round(posted - t0, 3), round(landed - t0, 3), chunk, source)
                    for posted, landed, chunk, source in stats.timeline]
        exchanges = [(round(sent - t0, 3), round(answered - t0, 3), asked, got)
                     for sent, answered, asked, got in stats.exchange_log]
        _say(event="fetched", worker=a.worker, model=a.model, started=started, seconds=stats.seconds,
             bytes=stats.bytes, sources=stats.sources, partial_source_bytes=stats.partial_source_bytes,
             cpu_s=_cpu_s() - cpu0, timeline=timeline, exchanges=exchanges, t0=t0,
             location=a.location, window=a.window)
        if a.hold:
            wait_file(a.stop, a.timeout)
    finally:
        client.close()


def _delta_reader(a: argparse.Namespace) -> None:
    """Holds v1 (fetched untimed), then times the update to ``--model`` v2 with ``have=1``."""
    import tensorhub_verl as th

    # base_digests_ahead="all": the v1 it holds is digested from its fetch on, as a rollout that read v1 as a
    # delta digests it (its first version came in full here).
    client = th.connect(a.hub, a.worker, a.location, window=a.window, preserve_on_unpublish=False,
                        progress=a.progress, base_digests_ahead="all")
    try:
        base = a.base_model or a.model
        buffers = client.manifest(base, 1).allocate()
        warm = f"warmup-{a.worker}"
        client.publish(warm, 0, buffers)
        client.unpublish(warm, 0)
        # v1 in these buffers before the clock starts: held (and served) when it is this reader's own model; a
        # baseline reader's model is only the trainer's, so it keeps v1's bytes (the same tensors) unheld.
        client.fetch(base, 1, into=buffers, hold=base == a.model, timeout=a.timeout)
        # A rollout that has updated before has the delta path (and its codec) loaded: the timed update, in every
        # variant alike, does not include importing it.
        import tensorhub_verl.ros.client.delta  # noqa: F401
        _say(event="ready")
        wait_file(a.go, a.timeout)
        started, t0 = time.time(), time.monotonic()
        cpu0 = _cpu_s()
        stats = client.fetch(a.model, 2, into=buffers, hold=a.hold, timeout=a.timeout, have=1, delta=a.delta)
        d = stats.delta
        timeline = [(round(posted - t0, 3), round(landed - t0, 3), chunk, source)
                    for posted, landed, chunk, source in stats.timeline]
        exchanges = [(round(sent - t0, 3), round(answered - t0, 3), asked, got)
                     for sent, answered, asked, got in stats.exchange_log]
        _say(event="fetched", worker=a.worker, model=a.model, started=started, seconds=stats.seconds,
             bytes=stats.bytes, sources=stats.sources, partial_source_bytes=stats.partial_source_bytes,
             cpu_s=_cpu_s() - cpu0, timeline=timeline, exchanges=exchanges, t0=t0, location=a.location,
             window=a.window,
             delta={"used": d.used, "delta_bytes": d.delta_bytes, "changed_fraction": d.changed_fraction,
                    "fallback_chunks": d.fallback_chunks, "apply_s": round(d.apply_seconds, 3),
                    "apply_after_wire_s": round(d.apply_after_wire_seconds, 3),
                    "base_ahead": d.base_digests_ahead, "base_pass_ahead": d.base_pass_ahead,
                    "landed_digests": d.landed_digests,
                    "reasons": d.reasons[:3]})
        if a.hold:
            wait_file(a.stop, a.timeout)
    finally:
        client.close()


def bcast(a: argparse.Namespace) -> None:
    import datetime
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the shaped lab NIC, never loopback
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    try:
        numel = int(a.size_mb * (1 << 20)) // 4
        if a.rank == 0:
            flat = torch.randn(numel, generator=torch.Generator().manual_seed(1))
        else:
            flat = torch.empty(numel)
            _resident([flat])
        dist.barrier()  # the group is up: every rank is ready to receive
        _say(event="ready", rank=a.rank)
        wait_file(a.go, a.timeout)
        started = time.time()
        t0, cpu0 = time.monotonic(), _cpu_s()
        dist.broadcast(flat, src=0)
        seconds = time.monotonic() - t0
        _say(event="fetched", worker=f"bcast-{a.rank}", model="bcast", started=started, seconds=seconds,
             bytes=flat.numel() * 4, sources={"trainer": flat.numel() * 4} if a.rank else {},
             partial_source_bytes=0, cpu_s=_cpu_s() - cpu0)
        wait_file(a.stop, a.timeout)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.modes_roles")
    ap.add_argument("role", choices=["hub", "trainer", "reader", "bcast"])
    ap.add_argument("--stop", type=Path, required=True)
    ap.add_argument("--go", type=Path)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--host")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--hub")
    ap.add_argument("--location", default="dc=dc0,rack=r0,node=n0")
    ap.add_argument("--size-mb", type=float, default=32)
    ap.add_argument("--chunk-mb", type=float, default=1)
    ap.add_argument("--private-copies", type=int, default=0)
    ap.add_argument("--worker")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--max-inflight-per-source", type=int, default=8)
    ap.add_argument("--seeds-per-dc", type=int, default=1)
    ap.add_argument("--first-complete-reads", type=int, default=0, help="PlannerConfig.first_complete_reads (0: None)")
    ap.add_argument("--master", help="bcast: host:port of rank 0's rendezvous")
    ap.add_argument("--progress", default="events", help="NixlConfig.progress of trainer and readers")
    ap.add_argument("--delta-lr", type=float, default=0.0,
                    help="trainer: publish v1, v2 and the delta, drawn from the profile measured at this lr (0: v1 only)")
    ap.add_argument("--delta", choices=("auto", "off"), help="reader: hold v1, time fetch(v2, have=1, delta=...)")
    ap.add_argument("--base-model", help="reader with --delta: the model whose v1 it fetches first (default --model)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        {"hub": hub, "trainer": trainer, "reader": reader, "bcast": bcast}[a.role](a)
    except Exception as e:  # report, so the orchestrator fails with the reason instead of a timeout
        _say(event="error", role=a.role, error=f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
