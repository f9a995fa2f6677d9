"""CUDA tensors over the TCP plane between two processes: a holder publishes CUDA tensors (served through its
pinned bounce buffers), this process reads them into CUDA buffers and into CPU buffers, digests checked as the
chunks land. The CPU suite runs the same bounce code on CPU memory (tests/ros/test_tcp_bounce.py)."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tests.gpu.conftest import SIZES, cuda_holder, cuda_tensors, needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda, pytest.mark.timeout(300)]

CHUNK = 1 << 20
BOUNCE = 256 << 10  # smaller than a chunk: every chunk takes several pieces through each buffer


@pytest.fixture(scope="module")
def tcp_hub():
    h = th.start_hub(host="127.0.0.1", port=0, plane="tcp")
    yield h
    h.stop()


@pytest.mark.parametrize("into_device", ["cuda", "cpu"])
def test_cuda_tensors_cross_tcp_through_bounce_buffers(tcp_hub, into_device):
    hub = tcp_hub
    with cuda_holder(hub.url, "tcp-vram-holder", "tcp-vram", 1, transport="tcp", chunk_bytes=CHUNK,
                     tcp_bounce_bytes=BOUNCE):
        with th.connect(hub.url, worker=f"tcp-vram-reader-{into_device}", transport="tcp",
                        tcp_bounce_bytes=BOUNCE) as reader:
            into = reader.manifest("tcp-vram", 1).allocate(into_device)
            stats = reader.fetch("tcp-vram", 1, into=into, hold=False, timeout=120)
            assert set(stats.sources) == {"tcp-vram-holder"}
            assert all(t.device.type == into_device for t in into.values())
            expected = cuda_tensors(1)
            assert all(torch.equal(into[n].cpu(), expected[n]) for n in SIZES)
            assert stats.corrupt_reads == 0 and stats.failed_reads == 0
