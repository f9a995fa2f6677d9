"""Quarantine: the sources the planner keeps readers off, and the failure counts /metrics shows.

Two kinds: a source whose read failed is *suspect* for ``suspect_s`` (no new reads unless it proves alive by a
heartbeat); a copy whose bytes failed readers' digest checks is kept off by ``corruption.CorruptionEvidence``
(its own job's report: off for all, unless it is the last complete vouched copy of a retained version; another
job's report: off for that job's readers).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from tensorhub_verl.ros.hub.corruption import CorruptionEvidence
from tensorhub_verl.ros.hub.records import Key

logger = logging.getLogger("tensorhub_verl.ros.hub")


class Quarantine:
    def __init__(self, quarantine_s: float, suspect_s: float):
        self.quarantine_s = quarantine_s
        self.suspect_s = suspect_s
        self.evidence = CorruptionEvidence(quarantine_s)
        """Readers' reports of bytes that fail their digest, and the quarantines they lead to."""
        self._suspect_until: dict[str, float] = {}
        self.read_failures: dict[str, int] = defaultdict(int)
        """source worker -> its failed reads."""
        self.corrupt_reads: dict[str, int] = defaultdict(int)
        """source worker -> its reads whose bytes failed the chunk digest."""

    def read_failed(self, worker: str, now: float) -> None:
        """A read from ``worker`` failed: it is suspect for ``suspect_s``."""
        self._suspect_until[worker] = now + self.suspect_s
        self.read_failures[worker] += 1

    def suspect(self, worker: str, now: float) -> bool:
        return self._suspect_until.get(worker, 0) > now

    def listed(self, worker: str) -> bool:
        """Whether ``worker`` has a suspicion on record (ended or not): one dict lookup, safe without the state
        lock, so a heartbeat of a worker with none is answered without it."""
        return worker in self._suspect_until

    def cleared(self, worker: str) -> bool:
        """The worker proved alive (a heartbeat), or left: no longer suspect. True when it was suspect (waiting
        readers may be planned on it now)."""
        return self._suspect_until.pop(worker, None) is not None

    def report_corrupt(self, key: Key, holder: str, worker: str, holder_job: str, reader: str, reader_job: str,
                       protected: bool, now: float) -> bool:
        """A reader found bytes of ``holder`` (on ``worker``, of ``holder_job``) that fail the publisher's digest:
        a holder that changed its tensor after publishing, a reader that claimed chunks it never verified, or a
        reader that lies. ``protected``: the last complete vouched copy of a retained version. Returns whether
        that copy is now quarantined for everyone (``corruption.py``)."""
        self.corrupt_reads[worker] += 1
        return self.evidence.report(key, holder, reader, reader_job, holder_job, protected, now)

    def quarantined(self, key: Key, holder: str, now: float) -> bool:
        return self.evidence.quarantined(key, holder, now)

    def excluded(self, key: Key, holder: str, reader_worker: str, reader_job: str, now: float) -> bool:
        """Whether the planner keeps ``reader_worker`` (of ``reader_job``) off this copy."""
        return self.evidence.excluded(key, holder, reader_worker, reader_job, now)

    def next_end(self, now: float) -> float | None:
        """When the earliest suspicion after ``now`` ends (None: none): a waiting reader may be planned on it then."""
        return min((until for until in self._suspect_until.values() if until > now), default=None)

    def expire(self, now: float) -> bool:
        """Ends the suspicions, quarantines and reports whose time passed; True when any ended."""
        ended = [w for w, until in self._suspect_until.items() if until <= now]
        for worker in ended:
            del self._suspect_until[worker]
        return self.evidence.expire(now) or bool(ended)
