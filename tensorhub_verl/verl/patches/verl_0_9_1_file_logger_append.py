"""verl 0.9.1: verl's "file" logger appends instead of truncating, so that two processes can share it.

Why: ``utils/tracking.py`` ``FileLogger`` opens its JSONL file with ``"wb"``. In the fully async policy the
rollouter and the trainer are separate processes that each build a logger for the same path
(``VERL_FILE_LOGGER_PATH``): each truncates the file and then writes at its own offset, so their lines
overwrite each other. Opened with ``"ab"`` (O_APPEND) every line lands whole at the end. A file left from an
earlier run is no longer emptied: remove it first (``tensorhub demo`` does).
"""

from __future__ import annotations

import functools
import os

from tensorhub_verl.verl.patches.replace import replace_once

VERL_VERSIONS = ("0.9.1",)
TARGET = "verl.utils.tracking"


def describe() -> str:
    return "FileLogger opens its JSONL file for appending (fully_async's rollouter and trainer share it)"


def apply(module) -> bool:
    def wrap(original):
        @functools.wraps(original)
        def __init__(self, project_name: str, experiment_name: str):
            # verl 0.9.1's own choice of path, then "ab" where it opens with "wb"
            self.project_name, self.experiment_name = project_name, experiment_name
            self.filepath = os.getenv("VERL_FILE_LOGGER_PATH")
            if self.filepath is None:
                directory = os.path.join(os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")), project_name)
                os.makedirs(directory, exist_ok=True)
                self.filepath = os.path.join(directory, f"{experiment_name}.jsonl")
            self.fp = open(self.filepath, "ab", buffering=0)

        return __init__

    return replace_once(module.FileLogger, "__init__", wrap)
