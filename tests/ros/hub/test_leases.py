"""The hub's leases alone: expiry revokes, a gone source revokes its readers' leases, a reader's end clears it."""

from tensorhub_verl.ros.hub.leases import Leases
from tensorhub_verl.ros.hub.lease_book import Lease
from tensorhub_verl.ros.wire.topology import Distance, Location

KEY = ("m", 1, "hf")


def _lease(lease_id, reader="r", source="s", deadline=10.0, chunk=0):
    return Lease(lease_id, KEY, reader, Location(), source, chunk, 4096, Distance.SAME_NODE, deadline)


def test_an_overdue_lease_is_revoked_once_and_counted():
    leases = Leases()
    leases.book.add(_lease(1, deadline=10.0))
    leases.book.add(_lease(2, deadline=20.0, chunk=1))
    assert leases.next_deadline() == 10.0
    assert [lease.id for lease in leases.expire(15.0)] == [1]
    assert leases.take_revoked("r") == {1} and leases.revoked_total == 1
    assert leases.expire(15.0) == [] and len(leases) == 1 and leases.drains(KEY, "s") == 1


def test_holders_gone_drop_their_reads_and_revoke_reads_from_them():
    leases = Leases()
    leases.book.add(_lease(1, reader="r", source="s"))
    leases.book.add(_lease(2, reader="s", source="t", chunk=1))
    leases.holders_gone({"s"})
    assert len(leases) == 0
    assert leases.take_revoked("r") == {1}, "the reader of the gone source is told at once"
    assert leases.take_revoked("s") == set()


def test_a_reader_done_forgets_its_leases_and_revocations():
    leases = Leases()
    leases.book.add(_lease(1, deadline=1.0))
    leases.expire(2.0)
    leases.book.add(_lease(2, chunk=1))
    leases.reader_done("r")
    assert len(leases) == 0 and leases.take_revoked("r") == set()


def test_the_next_deadline_is_a_live_leases():
    leases = Leases()
    leases.book.add(_lease(1, deadline=10.0))
    leases.book.add(_lease(2, deadline=20.0, chunk=1))
    leases.book.pop(1)  # read and reported: gone before its deadline
    assert leases.next_deadline() == 20.0
    leases.book.pop(2)
    assert leases.next_deadline() is None
