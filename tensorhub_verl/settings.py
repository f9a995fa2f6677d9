"""Settings that both the verl integration and the vLLM side read, kept below both layers.

``tensorhub_verl.vllm`` must not import ``tensorhub_verl.verl`` (an attached vLLM server runs without
verl), so the few names both sides share live here: the staging choices and the variable that selects verl's
CPU platform.
Nothing here imports verl, vLLM or torch.
"""

from __future__ import annotations

import os

STAGING_CHOICES = ("none", "cpu", "gpu")
"""Where a held version's bytes live: the tensors themselves (none), pinned CPU or GPU buffers. The one list
for the trainer (``staging``), rollout engines (``rollout_staging``, ``HolderConfig``) and ``attach-vllm``."""

SOURCE_LAYOUT_ENV = "TENSORHUB_SOURCE_LAYOUT"
"""``hf``: an engine reads every version in the trainer's layout, never another engine's (``attach-vllm
--source-layout hf``), so only holders of that layout serve it; unset: the engine's own layout where a peer
holds it."""

PLATFORM_NAME = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"
"""``VERL_PLATFORM=cpu`` is verl's own platform override; the CPU harness of the developer tools
(``tensorhub_dev.verl_cpu``, dev/) registers the platform it names. A TensorHub job's runtime environment carries the driver's value to every worker on every
node, vLLM's processes included (``tensorhub_verl.verl.runtime_env``)."""


def cpu_platform_selected() -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``); needs no verl import."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


__all__ = ["PLATFORM_ENV", "PLATFORM_NAME", "SOURCE_LAYOUT_ENV", "STAGING_CHOICES", "cpu_platform_selected"]
