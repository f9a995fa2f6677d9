"""Helpers to run benchmark and demo roles in separate processes.

Each role is forked from a fork server: one clean process, started at the first role, that has imported torch and
the package and nothing else (no thread, no NIXL agent, no CUDA context: NIXL and vLLM dislike a fork of a process
that has them). A role so starts in a fraction of the seconds a spawned interpreter takes to import torch. It runs
with the path, working directory and environment of the process that started it, as a spawned one would.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
from typing import Any, Callable

import torch

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "tensorhub_verl", "tensorhub_verl.bench.procs"])


class Role:
    """A function running in its own process; ``result()`` waits for what it put on its queue."""

    def __init__(self, target: Callable[..., Any], *args: Any):
        self.queue: mp.Queue = _CTX.Queue()
        self.control: mp.Queue = _CTX.Queue()
        self.process = _CTX.Process(target=_run, args=(target, self.queue, self.control, args, dict(os.environ)),
                                    daemon=True)
        self.process.start()

    def result(self, timeout: float = 300.0) -> Any:
        try:
            kind, value = self.queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.process.name} gave no result within {timeout} s") from None
        if kind == "error":
            raise RuntimeError(f"{self.process.name} failed: {value}")
        return value

    def send(self, value: Any) -> None:
        self.control.put(value)

    def stop(self, timeout: float = 10.0) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


def _run(target, results, control, args, environ: dict[str, str]) -> None:
    import logging
    import traceback

    # multiprocessing hands over the starter's path and directory; the environment is the fork server's, of when
    # it started: the starter's, now.
    os.environ.clear()
    os.environ.update(environ)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        target(results, control, *args)
    except BaseException as e:  # report, don't hang the parent
        results.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def random_weights(size_mb: float, seed: int = 0, tensors: int = 8) -> dict[str, torch.Tensor]:
    """``tensors`` float32 tensors of about size_mb MiB in total, plus a few tiny ones (biases, norms)."""
    generator = torch.Generator().manual_seed(seed)
    per = max(1, int(size_mb * (1 << 20) / 4 / tensors))
    weights = {f"layers.{i}.weight": torch.randn(per, generator=generator) for i in range(tensors)}
    weights.update({f"layers.{i}.norm": torch.randn(64, generator=generator) for i in range(4)})
    return weights


def checksum(tensors: dict[str, torch.Tensor]) -> float:
    return float(sum(t.double().sum() for t in tensors.values()))


def content_digest(tensors: dict[str, torch.Tensor]) -> str:
    """Every byte of every tensor, with its name: equal digests mean equal contents."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
