"""The settings of a verl job that must reach every node: through Ray's runtime environment, not the shell.

A worker on another host inherits the environment of that host's raylet (``ray start``), not the driver's. So the
driver's ``TENSORHUB_*`` settings (token, hub file, log level; what ``${oc.env:TENSORHUB_*}`` in the presets reads,
wherever verl's task runner lands) and the few verl variables this package relies on (``VERL_FILE_LOGGER_PATH``,
``VERL_PLATFORM``) go into the job's runtime environment (``patches/verl_0_9_1_runtime_env_settings``), which
Ray applies to every worker of the job on every node.

Not forwarded: what describes where a process runs rather than the job, so that each node keeps its own:
the location labels (``TENSORHUB_DC`` / ``_RACK`` / ``_NODE`` / ``_GPU``, see ``node_location``) and the
launcher pid of ``process_group.EXIT_WITH_PARENT_ENV``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tensorhub_verl.process_group import EXIT_WITH_PARENT_ENV
from tensorhub_verl.ros.wire.topology import LABEL_KEYS
from tensorhub_verl.settings import PLATFORM_ENV

PREFIX = "TENSORHUB_"
PER_NODE = frozenset({*(f"TENSORHUB_{key.upper()}" for key in LABEL_KEYS), EXIT_WITH_PARENT_ENV})
"""Variables that describe one node or one process: never copied from the driver to other nodes."""
VERL_NAMES = ("VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", PLATFORM_ENV, "VERL_USE_EXTERNAL_MODULES")
"""verl's own variables that a TensorHub job's workers read (the per-step metrics file, the platform, the modules
``import verl`` imports first)."""


def job_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's variables that every worker of the job gets, on every node."""
    env = os.environ if environ is None else environ
    return {name: value for name, value in env.items()
            if (name.startswith(PREFIX) and name not in PER_NODE) or name in VERL_NAMES}


def with_job_settings(runtime_env: dict, environ: Mapping[str, str] | None = None) -> dict:
    """``runtime_env`` with ``job_settings`` added to its ``env_vars`` (a value already there wins)."""
    env_vars = dict(runtime_env.get("env_vars") or {})
    for name, value in job_settings(environ).items():
        env_vars.setdefault(name, value)
    return {**runtime_env, "env_vars": env_vars}


__all__ = ["PER_NODE", "VERL_NAMES", "job_settings", "with_job_settings"]
