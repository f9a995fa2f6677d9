"""The one setting that selects verl's CPU platform, readable without importing verl (vLLM's processes).

``VERL_PLATFORM=cpu`` is verl's own platform override; ``tensorhub_verl.verl.cpu_platform`` registers the
platform it names. Ray passes the variable on to every worker it starts on the node.
"""

from __future__ import annotations

import os

PLATFORM_NAME = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"


def cpu_platform_selected() -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME
