"""Versions that differ as optimizer steps make them differ, and the roles of the delta tests."""

from __future__ import annotations

import os

import torch

import tensorhub_verl as th
from tensorhub_verl.bench.procs import content_digest as digest

CHUNK = 256 << 10


def base_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """bf16 matrices spanning chunks, and tiny tensors of other dtypes sharing one: about 3.3 MiB, 14 chunks."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
        "layers.0.mlp.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(1024, generator=g),
        "step": torch.tensor([seed], dtype=torch.int64),
        "lm_head.weight": torch.randn(256, 1024, generator=g).to(torch.bfloat16),
    }


def stepped(weights: dict[str, torch.Tensor], step: int, rows: int = 8) -> dict[str, torch.Tensor]:
    """The next version: a few rows of two matrices move (as an update moves few bf16 elements), the rest not."""
    g = torch.Generator().manual_seed(1000 + step)
    out = {name: t.clone() for name, t in weights.items()}
    w = out["layers.0.mlp.weight"]
    first = torch.randint(0, w.shape[0] - rows, (1,), generator=g).item()
    w[first:first + rows] += 0.01 * torch.randn(rows, w.shape[1], generator=g).to(torch.bfloat16)
    out["layers.0.norm.weight"][:4] += 1.0
    out["step"] += 1
    return out


def versions(count: int, seed: int = 0, rows: int = 8) -> list[dict[str, torch.Tensor]]:
    """Versions 1..count (index 0 is version 1); each step moves ``rows`` rows of a 1024-row matrix."""
    out = [base_weights(seed)]
    while len(out) < count:
        out.append(stepped(out[-1], len(out), rows))
    return out


def count_digested(monkeypatch) -> list[int]:
    """Records the bytes each full chunk digest reads (a chunk's full digest goes through ``lindigest.span``)."""
    from tensorhub_verl.ros.wire import lindigest

    seen = []
    span = lindigest.span

    def counting(data, *args, **kwargs):
        seen.append(data.numel())
        return span(data, *args, **kwargs)

    monkeypatch.setattr(lindigest, "span", counting)
    return seen


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Whether every tensor of ``b`` equals ``a``'s tensor of that name."""
    return all(torch.equal(a[name], b[name]) for name in b)


def delta_trainer(results, control, hub_url, worker, count, location="dc=dc0,rack=r0,node=t"):
    """Publishes versions 1..count, each with its delta from the one before, and serves them until stopped."""
    client = th.connect(hub_url, worker, location, chunk_bytes=CHUNK, hub_retry_s=60.0)
    held = versions(count)
    for version, weights in enumerate(held, start=1):
        client.publish("policy", version, weights)
        if version > 1:
            client.publish_delta("policy", version, version - 1)
    results.put(("ok", {"pid": os.getpid(), "digests": [digest(w) for w in held]}))
    command = control.get(timeout=600)
    assert command == "stop", command
    client.close()


def delta_reader(results, control, hub_url, worker, location, count=2):
    """Reads v1 in full, then each later version as the delta from the one before; holds both forms."""
    client = th.connect(hub_url, worker, location, hub_retry_s=60.0, max_run_chunks=1)
    into = client.manifest("policy", 1).allocate()
    client.fetch("policy", 1, into=into)
    used = [client.fetch("policy", v, into=into, have=v - 1).delta.used for v in range(2, count + 1)]
    results.put(("ok", {"pid": os.getpid(), "digest": digest(into), "used": used}))
    command = control.get(timeout=600)
    assert command == "stop", command
    client.close()
