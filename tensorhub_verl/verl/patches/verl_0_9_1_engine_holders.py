"""verl 0.9.1: verl's vLLM rollout servers host TensorHub holders, and their ``collective_rpc`` returns results.

Why: with ``tensorhub`` the engines' own parameters are the holders (no copy in a checkpoint-engine worker),
so every vLLM worker needs ``TensorHubVerlWorkerExtension`` (verl's extension plus ours), and the updater
must read what each rank's ``th_*`` call returned (pull state, bytes, sources). verl picks the extension in
``vLLMHttpServer._get_worker_extension_cls`` with no config hook, and its ``collective_rpc`` drops the
engine's results. Guard: both replacements take verl's path unless the server's rollout config selects
``checkpoint_engine.backend == 'tensorhub'``.
"""

from __future__ import annotations

from tensorhub_verl.verl.patches.guards import engine_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.workers.rollout.vllm_rollout.vllm_async_server"


def describe() -> str:
    return ("vLLMHttpServer loads TensorHubVerlWorkerExtension and its collective_rpc returns the results "
            "with backend == 'tensorhub'")


def _uses_tensorhub(server) -> bool:
    return engine_uses_tensorhub(getattr(getattr(server, "config", None), "checkpoint_engine", None))


def apply(module) -> bool:
    cls = module.vLLMHttpServer

    def wrap_extension(original):
        def _get_worker_extension_cls(self) -> str:
            if _uses_tensorhub(self):
                from tensorhub_verl.verl.vllm_worker import EXTENSION_QUALNAME

                return EXTENSION_QUALNAME
            return original(self)

        return _get_worker_extension_cls

    def wrap_rpc(original):
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            """verl's method; with ``tensorhub`` it returns each worker's result (a list, one per rank)."""
            if not _uses_tensorhub(self):
                return await original(self, method, timeout=timeout, args=args, kwargs=kwargs)
            return await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

        collective_rpc.__doc__ = original.__doc__ or collective_rpc.__doc__
        return collective_rpc

    changed = replace_once(cls, "_get_worker_extension_cls", wrap_extension)
    return replace_once(cls, "collective_rpc", wrap_rpc) or changed
