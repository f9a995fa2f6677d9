"""CUDA tensors over the TCP plane between two processes: a holder publishes CUDA tensors (served through its
pinned bounce buffers), this process reads them into CUDA buffers and into CPU buffers, digests checked as the
chunks land. The CPU suite runs the same bounce code on CPU memory (tests/ros/test_tcp_bounce.py)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

import tensorhub_verl as th
from tests.gpu.conftest import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda, pytest.mark.timeout(300)]

SIZES = {"a": (1024, 1024), "b": (4096, 513), "c": (7,)}
CHUNK = 1 << 20
BOUNCE = 256 << 10  # smaller than a chunk: every chunk takes several pieces through each buffer


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SIZES.items()}


def _holder(hub_url: str, ready, done) -> None:
    c = th.connect(hub_url, worker="tcp-vram-holder", transport="tcp", chunk_bytes=CHUNK, tcp_bounce_bytes=BOUNCE)
    try:
        c.publish("tcp-vram", 1, {n: t.cuda() for n, t in _tensors().items()})
        ready.set()
        done.wait(240)
    finally:
        c.close()


@pytest.mark.parametrize("into_device", ["cuda", "cpu"])
def test_cuda_tensors_cross_tcp_through_bounce_buffers(hub, into_device):
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_holder, args=(hub.url, ready, done))
    proc.start()
    try:
        assert ready.wait(120), "the holder did not publish"
        with th.connect(hub.url, worker=f"tcp-vram-reader-{into_device}", transport="tcp",
                        tcp_bounce_bytes=BOUNCE) as reader:
            into = reader.manifest("tcp-vram", 1).allocate(into_device)
            stats = reader.fetch("tcp-vram", 1, into=into, hold=False, timeout=120)
            assert set(stats.sources) == {"tcp-vram-holder"}
            assert all(t.device.type == into_device for t in into.values())
            expected = _tensors()
            assert all(torch.equal(into[n].cpu(), expected[n]) for n in SIZES)
            assert stats.corrupt_reads == 0 and stats.failed_reads == 0
    finally:
        done.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
