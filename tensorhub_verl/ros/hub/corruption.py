"""Readers' reports that a holding's bytes failed their chunk digest, and the quarantine they lead to.

One report is one reader's word: it may be a liar (a worker with the token can report any lease it was given
as corrupt) or have a fault of its own. So one report only keeps that reader off that holding; the holding is
quarantined (planned for nobody) on independent evidence: reports from ``reports_needed`` distinct reader
workers. A holding the hub never saw filled through its own leases (``Holding.vouched`` False: a copy from a
non-owner, or chunks a reader only announced) has no word of its own to set against a report, so one is
enough for it. Everything here expires after ``hold_s``. No I/O; the hub calls it under its lock.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable

Entry = tuple[Hashable, str]  # (version key, holder)


class CorruptionEvidence:
    def __init__(self, hold_s: float, reports_needed: int = 2):
        self.hold_s = hold_s
        self.reports_needed = reports_needed
        self._accusers: dict[Entry, dict[str, float]] = defaultdict(dict)
        """(key, holder) -> reader worker -> until when its report counts."""
        self._quarantined_until: dict[Entry, float] = {}

    def report(self, key: Hashable, holder: str, reader: str, vouched: bool, now: float) -> bool:
        """Books ``reader``'s report against ``holder``'s copy of ``key``; True when it is quarantined now."""
        accusers = self._accusers[(key, holder)]
        accusers[reader] = now + self.hold_s
        live = sum(1 for until in accusers.values() if until > now)
        if live >= self.reports_needed or not vouched:
            self._quarantined_until[(key, holder)] = now + self.hold_s
            return True
        return False

    def quarantined(self, key: Hashable, holder: str, now: float) -> bool:
        until = self._quarantined_until.get((key, holder))
        return until is not None and until > now

    def excluded(self, key: Hashable, holder: str, reader: str, now: float) -> bool:
        """Whether ``holder``'s copy of ``key`` serves ``reader`` no reads: quarantined, or accused by it."""
        if self.quarantined(key, holder, now):
            return True
        accusers = self._accusers.get((key, holder))
        return accusers is not None and accusers.get(reader, 0.0) > now

    def expire(self, now: float) -> bool:
        """Forgets the quarantines and reports that ended; True when any did (a reader may be planned anew)."""
        ended = [e for e, until in self._quarantined_until.items() if until <= now]
        for entry in ended:
            del self._quarantined_until[entry]
        for entry, accusers in list(self._accusers.items()):
            gone = [r for r, until in accusers.items() if until <= now]
            for reader in gone:
                del accusers[reader]
            ended += gone
            if not accusers:
                del self._accusers[entry]
        return bool(ended)
