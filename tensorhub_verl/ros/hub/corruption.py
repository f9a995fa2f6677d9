"""Readers' reports that a holding's bytes failed their chunk digest, and the quarantine they lead to.

A report is a job's word, not a fact: any worker with the token can report a lease it was given as corrupt, and
job keys cost nothing to make, so a count of reporters or of reporting jobs is no evidence. What a report does
therefore depends on whose copy it accuses:

- a report by a worker of the holding's own job (the job that vouched for that copy: its publisher's, or the
  reader's that fetched it) quarantines the copy for everyone: a job may lose its own copies to its own word;
- a report by another job keeps only that job's readers off the copy (each reads it elsewhere): a job cannot
  take another job's source away from anyone but itself;
- the reporting reader itself never reads that copy again, whatever its job.

The last complete vouched copy of a retained version (``protected``) is never quarantined by reports alone: a
lying member of its own job could otherwise destroy the only copy of the version for everyone; its reporters
read elsewhere or fail. Everything here expires after ``hold_s``. No I/O; the hub calls it under its lock.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable

Entry = tuple[Hashable, str]  # (version key, holder)


def _worker(name: str) -> str:
    return "worker:" + name


def _job(name: str) -> str:
    return "job:" + name


class CorruptionEvidence:
    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self._excluded: dict[Entry, dict[str, float]] = defaultdict(dict)
        """(key, holder) -> "worker:<id>" or "job:<name>" kept off that copy -> until when."""
        self._quarantined_until: dict[Entry, float] = {}

    def report(self, key: Hashable, holder: str, reader: str, reader_job: str, holder_job: str, protected: bool,
               now: float) -> bool:
        """Books ``reader``'s (of ``reader_job``) report against ``holder``'s copy of ``key`` (a copy of
        ``holder_job``); ``protected``: it is the last complete vouched copy of a retained version. True when the
        copy is quarantined for everyone now."""
        until = now + self.hold_s
        excluded = self._excluded[(key, holder)]
        excluded[_worker(reader)] = until
        if reader_job != holder_job:
            excluded[_job(reader_job)] = until
            return False
        if protected:
            return False
        self._quarantined_until[(key, holder)] = until
        return True

    def quarantined(self, key: Hashable, holder: str, now: float) -> bool:
        until = self._quarantined_until.get((key, holder))
        return until is not None and until > now

    def excluded(self, key: Hashable, holder: str, reader: str, reader_job: str, now: float) -> bool:
        """Whether ``holder``'s copy of ``key`` serves ``reader`` (of ``reader_job``) no reads: quarantined, accused
        by that reader, or accused by that reader's job when it is another job than the copy's."""
        if self.quarantined(key, holder, now):
            return True
        excluded = self._excluded.get((key, holder))
        return excluded is not None and (excluded.get(_worker(reader), 0.0) > now
                                         or excluded.get(_job(reader_job), 0.0) > now)

    def expire(self, now: float) -> bool:
        """Forgets the quarantines and reports that ended; True when any did (a reader may be planned anew)."""
        ended = [e for e, until in self._quarantined_until.items() if until <= now]
        for entry in ended:
            del self._quarantined_until[entry]
        for entry, excluded in list(self._excluded.items()):
            gone = [r for r, until in excluded.items() if until <= now]
            for name in gone:
                del excluded[name]
            ended += gone
            if not excluded:
                del self._excluded[entry]
        return bool(ended)
