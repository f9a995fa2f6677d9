"""The GPU tier (``bash scripts/test.sh -m gpu``): every test here needs CUDA and skips, saying so, without it.
Fixtures shared with tests/vllm (tiny models built offline, a hub in this process).

Two parts: the core's tests (hub, client, both data planes, publisher: they need torch and the core's
dependencies only) and the engine tests (marked ``engine``: a vLLM engine or verl's trainer on the GPU). A GPU host
may have neither engine (``scripts/gpu_check.sh`` runs ``-m "not engine"``), so an engine module calls
``needs_engines`` before it imports anything that imports one: without them it is skipped, never a collection
error (``tests/test_gpu_tier_collects.py`` collects this folder with them hidden)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Iterator

import pytest
import torch

import tensorhub_verl as th
from tests.vllm.conftest import hub, shape, tiny_models  # noqa: F401  (fixtures)

NO_CUDA = "needs a CUDA GPU: the GPU tier runs with `bash scripts/test.sh -m gpu` on a machine with one"

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
"""Every GPU-tier module's ``pytestmark`` carries this and ``pytest.mark.gpu``."""


def needs_engines(*modules: str) -> None:
    """Skips the calling module (at collection) unless every one of ``modules`` imports."""
    for name in modules:
        pytest.importorskip(name, reason=f"an engine test: needs {name}, which is not installed here")


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


SIZES = {"a": (1024, 1024), "b": (4096, 513), "c": (7,)}
"""The CUDA holder's tensors: one of an odd row count, one tiny."""


def cuda_tensors(seed: int) -> dict[str, torch.Tensor]:
    """bf16 tensors of ``SIZES``, made on the CPU (the holder moves them to its GPU)."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SIZES.items()}


def _hold(hub_url: str, worker: str, model: str, seed: int, connect: dict, ready, done) -> None:
    c = th.connect(hub_url, worker=worker, **connect)
    try:
        c.publish(model, 1, {n: t.cuda() for n, t in cuda_tensors(seed).items()})
        ready.set()
        done.wait(240)
    finally:
        c.close()


@contextlib.contextmanager
def cuda_holder(hub_url: str, worker: str, model: str, seed: int, **connect) -> Iterator[None]:
    """Another process that publishes ``cuda_tensors(seed)`` from its GPU as ``model`` v1 and holds them until
    the block ends (``connect``: its ``th.connect`` arguments); stopped, and killed if it hangs, at the end."""
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(hub_url, worker, model, seed, connect, ready, done))
    proc.start()
    try:
        assert ready.wait(120), f"the CUDA holder {worker} did not publish"
        yield
    finally:
        done.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
