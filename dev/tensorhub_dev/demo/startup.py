"""What the main job is doing while it starts, read from verl's log as it grows.

verl's job writes one log (``TinyJob.log_file``): Ray's driver lines, then each Ray actor's lines prefixed with
``(ActorClass pid=N)``. ``StartupWatch`` turns the lines that mark a part starting or becoming ready into short
events: Ray, verl's task runner, the trainer's workers, the hub, each rollout replica, the first training step.
It is pure (text in, events out); ``LogTail`` reads the new complete lines of the growing file.
"""

from __future__ import annotations

import re
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ACTOR = re.compile(r"^\((?P<cls>[A-Za-z_][A-Za-z0-9_]*) pid=(?P<pid>\d+)\)")
_SERVERS = re.compile(r"LLMServerManager: \[(?P<addrs>[^\]]*)\]")
_TASK_RUNNERS = ("TaskRunnerV1", "TaskRunner", "FullyAsyncTaskRunner")
_TRAINER_WORKERS = ("WorkerDict",)
_REPLICA_SERVERS = ("vLLMHttpServer",)


class StartupWatch:
    """Events of the job's start-up, each once, in the order the log shows them."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._replica_pids: list[str] = []
        self.training = False
        """True once the first training step has begun: start-up is over."""

    def _once(self, key: str, text: str) -> list[str]:
        if key in self._seen:
            return []
        self._seen.add(key)
        return [text]

    def hub_ready(self, url: str) -> list[str]:
        """The hub actor wrote its URL (``TinyJob.hub_url_file``)."""
        return self._once("hub", f"hub ready at {url}")

    def feed(self, line: str) -> list[str]:
        """The events one log line marks (most lines mark none)."""
        line = _ANSI.sub("", line).strip()
        if "Started a local Ray instance" in line:
            return self._once("ray", "Ray is up")
        if "Training Progress:" in line and not self.training:
            self.training = True
            return self._once("training", "training starts: first step under way")
        actor = _ACTOR.match(line)
        if actor is None:
            return []
        cls, pid = actor["cls"], actor["pid"]
        events: list[str] = []
        if cls in _TASK_RUNNERS:
            events += self._once("task_runner", "verl's task runner started (reads the data, builds the workers)")
        elif cls in _TRAINER_WORKERS:
            events += self._once("trainer", "trainer workers starting (FSDP2, loading the model)")
        elif cls in _REPLICA_SERVERS and pid not in self._replica_pids:
            self._replica_pids.append(pid)
            events.append(f"rollout replica {len(self._replica_pids)}: vLLM engine starting")
        servers = _SERVERS.search(line)
        if servers:
            count = len([a for a in servers["addrs"].split(",") if a.strip()])
            events += self._once("replicas", f"rollout replicas ready: {count} vLLM servers up")
        return events


class LogTail:
    """The complete lines appended to a file since the last read (a line being written waits)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0

    def new_lines(self) -> list[str]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode("utf-8", errors="replace").splitlines()


__all__ = ["LogTail", "StartupWatch"]
