"""The hub's leases: the reads in flight (``lease_book.LeaseBook``) and the leases each reader must be told are
revoked.

A lease is one read of one chunk (or a run of chunks) from one holding. While a lease is live its source's bytes
must not change, so an unpublish waits for the holding's leases to end. A lease past its deadline is revoked: its
reader is told to read those chunks again, and it no longer holds up the unpublish.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import AbstractSet

from tensorhub_verl.ros.hub.records import Key
from tensorhub_verl.ros.hub.lease_book import Lease, LeaseBook

logger = logging.getLogger("tensorhub_verl.ros.hub")


class Leases:
    def __init__(self) -> None:
        self.book = LeaseBook()
        """The live leases, indexed by reader, source and version (the planner reads it)."""
        self._revoked: dict[str, set[int]] = defaultdict(set)
        """reader holder -> leases revoked since its last exchange."""
        self.revoked_total = 0
        """Leases revoked past their deadline (for /metrics)."""

    def __len__(self) -> int:
        return len(self.book)

    def expire(self, now: float) -> list[Lease]:
        """Revokes the leases past their deadline; returns them."""
        overdue = self.book.overdue(now)
        for lease in overdue:
            self._revoked[lease.reader].add(lease.id)
            self.revoked_total += 1
            logger.warning("lease %d (chunk %d from %s to %s) outlived its deadline; revoked",
                           lease.id, lease.chunk, lease.source, lease.reader)
        return overdue

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease (None: no lease), when a waiter must look at them again."""
        return self.book.next_deadline()

    def reader_done(self, reader: str) -> None:
        """The reader's fetch ended (or began anew): its leases and revocations go."""
        for lease in self.book.of_reader(reader):
            self.book.pop(lease.id)
        self._revoked.pop(reader, None)

    def forget_revoked(self, reader: str) -> None:
        self._revoked.pop(reader, None)

    def holders_gone(self, holders: AbstractSet[str]) -> None:
        """These holdings are gone (their worker died or left): their own reads go; a reader of one of them is
        told at once, so it re-plans the chunk instead of waiting out its read timeout."""
        for holder in holders:
            self._revoked.pop(holder, None)
        for lease in self.book.all():
            if lease.reader in holders:
                self.book.pop(lease.id)
            elif lease.source in holders:
                self.book.pop(lease.id)
                self._revoked[lease.reader].add(lease.id)

    def take_revoked(self, reader: str) -> set[int]:
        """The reader's leases revoked since its last exchange (a live set: the caller discards what it
        answers for and clears it once the reply is built)."""
        return self._revoked.get(reader, set())

    def drains(self, key: Key, holder: str) -> int:
        """Reads in flight from ``holder``'s holding of ``key``."""
        return self.book.reads_from(key, holder)
