"""verl 0.9.1 on the CPU platform: FSDP training engines are found for device ``cpu``.

Why: ``verl/workers/engine/fsdp/transformer_impl.py`` registers its engines for ``cuda`` and ``npu``
only, so ``EngineRegistry.get_engine_cls`` raises "No engine registered for device='cpu'". The engines
themselves are device-neutral (FSDP2 over gloo runs on CPU), so the same classes are registered for
``cpu``. Registered only when ``VERL_PLATFORM=cpu`` (``tensorhub_dev.verl_cpu.plugin``).
"""

from __future__ import annotations

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.workers.engine.fsdp.transformer_impl"


def describe() -> str:
    return "FSDP/FSDP2 engines registered for device 'cpu' (the same classes as for 'cuda')"


def apply(module) -> bool:
    from verl.workers.engine.base import EngineRegistry

    added = False
    for backends in EngineRegistry._engines.values():
        for registry in backends.values():
            engine = registry.get("cuda")
            if engine is not None and engine.__module__ == module.__name__ and "cpu" not in registry:
                registry["cpu"] = engine
                added = True
    return added
