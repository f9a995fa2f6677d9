"""VRAM registration and reads between two processes through NIXL: a holder publishes CUDA tensors, this process
reads them into CUDA buffers (UCX's CUDA transports: cuda_ipc on one GPU, cuda_copy otherwise), digests checked
as the chunks land."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tests.gpu.conftest import SIZES, cuda_holder, cuda_tensors, needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda, pytest.mark.timeout(300)]


def test_cuda_tensors_read_from_another_process(hub):
    with cuda_holder(hub.url, "vram-holder", "vram", 0, location={"node": "n0"}):
        with th.connect(hub.url, worker="vram-reader", location={"node": "n0"}) as reader:
            into = reader.manifest("vram", 1).allocate("cuda")
            stats = reader.fetch("vram", 1, into=into, hold=False, timeout=120)
            assert set(stats.sources) == {"vram-holder"}
            assert all(t.is_cuda for t in into.values())
            expected = cuda_tensors(0)
            assert all(torch.equal(into[n].cpu(), expected[n]) for n in SIZES)
            assert stats.corrupt_reads == 0
