"""VRAM registration and reads between two processes through NIXL: a holder publishes CUDA tensors, this process
reads them into CUDA buffers (UCX's CUDA transports: cuda_ipc on one GPU, cuda_copy otherwise), digests checked
as the chunks land."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

import tensorhub_verl as th
from tests.gpu.conftest import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda, pytest.mark.timeout(300)]

SIZES = {"a": (1024, 1024), "b": (4096, 513), "c": (7,)}


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SIZES.items()}


def _holder(hub_url: str, ready, done) -> None:
    c = th.connect(hub_url, worker="vram-holder", location={"node": "n0"})
    try:
        c.publish("vram", 1, {n: t.cuda() for n, t in _tensors().items()})
        ready.set()
        done.wait(240)
    finally:
        c.close()


def test_cuda_tensors_read_from_another_process(hub):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_holder, args=(hub.url, ready, done))
    proc.start()
    try:
        assert ready.wait(120), "the holder did not publish"
        with th.connect(hub.url, worker="vram-reader", location={"node": "n0"}) as reader:
            into = reader.manifest("vram", 1).allocate("cuda")
            stats = reader.fetch("vram", 1, into=into, hold=False, timeout=120)
            assert set(stats.sources) == {"vram-holder"}
            assert all(t.is_cuda for t in into.values())
            expected = _tensors()
            assert all(torch.equal(into[n].cpu(), expected[n]) for n in SIZES)
            assert stats.corrupt_reads == 0
    finally:
        done.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
