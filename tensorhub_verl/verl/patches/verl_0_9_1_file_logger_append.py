"""verl 0.9.1: verl's "file" logger appends instead of truncating, so that two processes can share it.

Why: ``utils/tracking.py`` ``FileLogger`` opens its JSONL file with ``"wb"``. In the fully async policy the
rollouter and the trainer are separate processes that each build a logger for the same path
(``VERL_FILE_LOGGER_PATH``): each truncates the file and then writes at its own offset, so their lines
overwrite each other. Opened with ``"ab"`` (O_APPEND) every line lands whole at the end. A file left from an
earlier run is no longer emptied: remove it first (``tensorhub demo`` does).

Guard: ``FileLogger`` sees no config, but verl builds it inside ``Tracking.__init__``, which receives the
job's config. A ``Tracking`` whose config selects ``tensorhub`` builds its file logger in append mode; every
other ``FileLogger`` (other jobs, direct construction) opens with verl's ``"wb"``.
"""

from __future__ import annotations

import functools
import os
import threading

from tensorhub_verl.verl.patches.guards import job_uses_tensorhub
from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.utils.tracking"

_building = threading.local()
"""``appending`` is True on a thread while it builds the loggers of a tensorhub job's ``Tracking``."""


def describe() -> str:
    return "FileLogger appends to its JSONL file in tensorhub jobs (fully_async's processes share it)"


def apply(module) -> bool:
    def wrap_file_logger(original):
        @functools.wraps(original)
        def __init__(self, project_name: str, experiment_name: str):
            if not getattr(_building, "appending", False):
                return original(self, project_name, experiment_name)
            # verl 0.9.1's own choice of path, then "ab" where it opens with "wb"
            self.project_name, self.experiment_name = project_name, experiment_name
            self.filepath = os.getenv("VERL_FILE_LOGGER_PATH")
            if self.filepath is None:
                directory = os.path.join(os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")), project_name)
                os.makedirs(directory, exist_ok=True)
                self.filepath = os.path.join(directory, f"{experiment_name}.jsonl")
            self.fp = open(self.filepath, "ab", buffering=0)

        return __init__

    def wrap_tracking(original):
        @functools.wraps(original)
        def __init__(self, project_name, experiment_name, default_backend="console", config=None):
            outer = getattr(_building, "appending", False)
            _building.appending = job_uses_tensorhub(config)
            try:
                return original(self, project_name, experiment_name, default_backend, config)
            finally:
                _building.appending = outer

        return __init__

    changed = replace_once(module.FileLogger, "__init__", wrap_file_logger)
    return replace_once(module.Tracking, "__init__", wrap_tracking) or changed
