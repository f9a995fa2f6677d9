"""verl 0.9.1 on the CPU platform: the trainer's process group gets a valid backend string.

Why: ``verl/utils/distributed.py:89`` builds ``f"cpu:gloo,{device}:{backend}"``, which on the CPU
platform is ``cpu:gloo,cpu:gloo``, and torch refuses a device named twice. On CPU the group is plain
``cpu:gloo``. The engine workers bound the function by name at import, so their reference is replaced.
Registered only when ``VERL_PLATFORM=cpu`` (``tensorhub_dev.verl_cpu.plugin``).
"""

from __future__ import annotations

import functools

from tensorhub_dev.verl_cpu.patches import CPU_MARK
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.workers.engine_workers"


def describe() -> str:
    return "initialize_global_process_group_ray uses backend 'cpu:gloo' on the CPU platform"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

        return initialize_global_process_group_ray

    return replace_once(module, "initialize_global_process_group_ray", wrap, mark=CPU_MARK)
