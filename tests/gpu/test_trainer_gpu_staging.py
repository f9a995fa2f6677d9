"""Trainer staging on the GPU holds one version per rank, whatever ``keep_versions`` says (item 5 of issue 24)."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.verl.publisher import GPU_STAGING_VERSIONS, Publisher
from tests.gpu.conftest import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda, pytest.mark.timeout(300)]


def test_gpu_staging_keeps_one_version_and_cpu_staging_is_pinned(hub):
    with th.connect(hub.url, worker="gpu-trainer") as client:
        gpu = Publisher(client, model="gpu-staged", keep=2, staging="gpu", chunk_bytes=1 << 20,
                        unpublish_timeout_s=30)
        cpu = Publisher(client, model="cpu-staged", keep=2, staging="cpu", chunk_bytes=1 << 20,
                        unpublish_timeout_s=30)
        for version in (1, 2, 3):
            for publisher in (gpu, cpu):
                publisher.begin(version)
                publisher.add("w", torch.full((256, 256), float(version), device="cuda"))
                publisher.finish()
        assert gpu.held_versions == [3] and GPU_STAGING_VERSIONS == 1
        assert cpu.held_versions == [2, 3]
        assert cpu._ring.get(3).buffers["w"].is_pinned()  # device-to-host copies overlap with the next gather
        assert gpu._ring.get(3).buffers["w"].is_cuda
        gpu.close()
        cpu.close()
