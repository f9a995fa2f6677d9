"""The GPU tier (``bash scripts/test.sh -m gpu``): every test here needs CUDA and skips, saying so, without it.
Fixtures shared with tests/vllm (tiny models built offline, a hub in this process)."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import hub, tiny_models  # noqa: F401  (fixtures)

NO_CUDA = "needs a CUDA GPU: the GPU tier runs with `bash scripts/test.sh -m gpu` on a machine with one"

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
"""Every GPU-tier module's ``pytestmark`` carries this and ``pytest.mark.gpu``."""


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
