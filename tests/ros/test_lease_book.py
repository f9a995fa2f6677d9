"""The lease book and the chunk index: the hub's indexes answer exactly what a walk of every lease and every
holder's chunks would, and stay right as leases and chunks come and go (pure classes, no processes)."""

import random
from collections import Counter

from tensorhub_verl.ros.hub.chunk_index import ChunkIndex, NeedCursor
from tensorhub_verl.ros.hub.lease_book import Lease, LeaseBook
from tensorhub_verl.ros.wire.topology import Distance, Location

KEYS = [("m", 1, "hf"), ("m", 2, "hf")]
PLACES = [Location("dc0", "r0", "n0"), Location("dc0", "r1", "n1"), Location("dc1", "r0", "n2")]


def _walk(leases: list[Lease], key, reader: str):
    """What the hub once computed by walking every lease."""
    pulling, wan, sources = {}, {}, Counter()
    for lease in leases:
        if lease.key != key:
            continue
        sources[lease.source] += 1
        for chunk in range(lease.chunk, lease.chunk + lease.count):  # a run lease pulls each of its chunks
            pulling.setdefault(chunk, []).append(lease.reader_location)
            if lease.distance == Distance.WAN:
                wan.setdefault(lease.reader_location.dc, set()).add(chunk)
    mine = sorted(lease.id for lease in leases if lease.reader == reader and lease.key == key)
    return pulling, wan, sources, mine


def test_the_lease_book_answers_what_a_walk_of_every_lease_answers():
    rng = random.Random(3)
    book, live, ids = LeaseBook(), {}, iter(range(1, 10_000))
    for step in range(2000):
        if live and rng.random() < 0.45:
            gone = book.pop(rng.choice(list(live)))
            assert gone is live.pop(gone.id)
        else:
            place = rng.choice(PLACES)
            lease = Lease(next(ids), rng.choice(KEYS), f"r{rng.randrange(5)}", place, f"s{rng.randrange(4)}",
                          rng.randrange(30), 8, rng.choice(list(Distance)), step, rng.choice((1, 1, 2, 5)))
            book.add(lease)
            live[lease.id] = lease
        if step % 50 == 0:
            for key in KEYS:
                pulling, wan, sources, mine = _walk(list(live.values()), key, "r1")
                index = book.pulling(key)
                assert index.chunks() == set(pulling)
                for here in PLACES:
                    for chunk in range(36):
                        counts = [0, 0, 0, 0]
                        for where in pulling.get(chunk, ()):
                            counts[here.distance(where)] += 1
                        assert list(index.distances(here, chunk)) == counts
                    for distance in Distance:  # a run's extension: the first chunk a nearer reader pulls
                        start, end = rng.randrange(30), rng.randrange(30, 40)
                        nearer = [c for c in range(start, end)
                                  if any(here.distance(w) < distance for w in pulling.get(c, ()))]
                        assert index.first_nearer(here, distance, start, end) == min(nearer, default=end)
                assert {dc: c.covered() for dc, c in book.wan_pulling(key).items()} == wan
                assert {s: book.reads_from(key, s) for s in sources} == dict(sources)
                assert sorted(lease.id for lease in book.of_reader("r1", key)) == mine
                assert set(book.chunks_of("r1", key)) == {c for lease in live.values() if lease.reader == "r1"
                                                          and lease.key == key for c in lease.chunks}
                mine_now = book.chunks_of("r1", key)
                assert all((c in mine_now) == (c in set(mine_now)) for c in range(36))
                assert mine_now.first_in(10, 20) == min((c for c in mine_now if 10 <= c < 20), default=20)
    assert len(book) == len(live)


def test_overdue_returns_exactly_the_leases_past_their_deadline_once():
    book = LeaseBook()
    for i, deadline in enumerate([5.0, 1.0, 3.0, 2.0]):
        book.add(Lease(i, KEYS[0], "r", PLACES[0], "s", i, 8, Distance.SAME_NODE, deadline))
    book.pop(3)  # settled before its deadline: never reported overdue
    assert sorted(lease.id for lease in book.overdue(3.5)) == [1, 2]
    assert book.overdue(3.5) == []
    assert [lease.id for lease in book.overdue(10)] == [0] and len(book) == 0


def test_the_chunk_index_tracks_partial_holders_per_chunk():
    index = ChunkIndex(10)
    index.add("a", [1, 2])
    index.add("b", [2])
    assert index.holders_of(2) == {"a", "b"} and index.holders_of(3) == set()
    index.remove("a", [1, 2])
    assert index.holders_of(1) == set() and index.holders_of(2) == {"b"}


def test_the_chunk_index_answers_who_holds_each_chunk_through_runs_long_and_short():
    # Long runs are filed by block and interval, short ones chunk by chunk: the answer is a walk's either way.
    rng = random.Random(4)
    index, model = ChunkIndex(1000), {f"h{i}": set() for i in range(5)}
    for step in range(600):
        holder = rng.choice(list(model))
        if rng.random() < 0.15:
            index.remove(holder, set(model[holder]))
            model[holder] = set()
        else:
            start = rng.randrange(1000)
            chunks = range(start, min(1000, start + rng.choice((1, 3, 64, 200, 1024))))
            index.add(holder, chunks if rng.random() < 0.5 else list(chunks))
            model[holder].update(chunks)
        if step % 20 == 0:
            for chunk in range(0, 1000, 7):
                assert set(index.holders_of(chunk)) == {h for h, held in model.items() if chunk in held}


def test_a_stretch_of_the_chunk_index_has_the_same_holders_throughout():
    # A plan looks a candidate's holders up once per stretch (ChunkIndex.stretch): every chunk of a stretch must
    # have exactly the holders of its first, through runs long and short, added and removed.
    rng = random.Random(5)
    index, model = ChunkIndex(1000), {f"h{i}": set() for i in range(6)}
    lengths = []
    for step in range(400):
        holder = rng.choice(list(model))
        if rng.random() < 0.1:
            index.remove(holder, set(model[holder]))
            model[holder] = set()
        else:
            start = rng.randrange(1000)
            chunks = range(start, min(1000, start + rng.choice((1, 3, 64, 200, 1024))))
            index.add(holder, chunks)
            model[holder].update(chunks)
        if step % 25 == 0:
            chunk = 0
            while chunk < 1000:
                names, end = index.stretch(chunk)
                assert chunk < end <= 1000 and set(names) == set(index.holders_of(chunk))
                for c in range(chunk, end):
                    assert {h for h, held in model.items() if c in held} == set(names), (chunk, end, c)
                lengths.append(end - chunk)
                chunk = end
    assert sum(lengths) > 8 * len(lengths)  # a stretch spans many chunks, not one


def test_a_cursor_hands_out_each_missing_chunk_and_never_a_landed_or_busy_one():
    cursor = NeedCursor("reader", range(100))
    have: set[int] = set()
    seen: set[int] = set()
    for _ in range(200):
        batch = cursor.candidates(have, busy={0, 1}, limit=7)
        assert len(batch) <= 7 and not (set(batch) & (have | {0, 1}))
        seen.update(batch)
        have.update(batch[:3])  # some land; the rest were busy elsewhere
        cursor.move_on()
        if have >= set(range(2, 100)):
            break
    assert seen == set(range(2, 100))
    assert cursor.candidates(have, {0, 1}, 7) == []


def test_a_cursor_over_landed_runs_offers_what_it_offers_over_a_plain_set():
    # The hub's holdings are interval sets: the cursor skips (and compacts away) a landed run in one step.
    from tensorhub_verl.ros.hub.intervals import IntervalSet

    rng = random.Random(2)
    for wanted in (range(500), sorted(rng.sample(range(500), 300))):
        plain, runs = NeedCursor("reader", wanted), NeedCursor("reader", wanted)
        have_set, have_runs = set(), IntervalSet()
        for _ in range(60):
            got = plain.candidates(have_set, {7}, 16)
            assert runs.candidates(have_runs, {7}, 16) == got
            for chunk in got[:2]:  # some land as runs after them
                landed = range(chunk, min(500, chunk + rng.choice((1, 40, 120))))
                have_set.update(landed)
                have_runs.update(landed)
            plain.move_on()
            runs.move_on()


def test_a_cursor_without_moving_on_offers_the_same_chunks_again():
    cursor = NeedCursor("reader", range(50))
    first = cursor.candidates(set(), set(), 5)
    assert cursor.candidates(set(), set(), 5) == first
    cursor.move_on()
    assert not set(cursor.candidates(set(), set(), 5)) & set(first)


def test_readers_start_their_cursors_at_different_chunks():
    firsts = {NeedCursor(f"reader{i}", range(1000)).candidates(set(), set(), 1)[0] for i in range(8)}
    assert len(firsts) > 4


def test_a_reader_whose_fetch_ended_has_nothing_left_to_read():
    index = ChunkIndex(10)
    index.start_reader("r", None)
    assert len(index.cursor("r").candidates(set(), set(), 4)) == 4 and index.filling() == 1
    index.end_reader("r")
    assert index.cursor("r").candidates(set(), set(), 4) == [] and index.filling() == 0


def test_compacting_a_rotated_cursor_steps_once_per_stretch_not_per_chunk():
    # A reader's order is its chunks rotated to its own offset (then compacted): the landed runs and the kept
    # stretches each cost one step, also across the rotation, and the result is the plain filter's.
    from tensorhub_verl.ros.hub.chunk_index import _consecutive, _without
    from tensorhub_verl.ros.hub.intervals import IntervalSet

    class Counted(IntervalSet):
        __slots__ = ("asked",)

        def holds(self, x):
            self.asked += 1
            return super().holds(x)

    rng = random.Random(5)
    for _ in range(30):
        start = rng.randrange(1, 12_800)
        order = list(range(start, 12_800)) + list(range(start))
        have = Counted()
        have.asked = 0
        for _ in range(rng.randrange(1, 12)):
            a = rng.randrange(12_800)
            have.add_range(a, min(12_800, a + rng.randrange(1, 2_000)))
        kept = _without(order, have)
        assert kept == [c for c in order if c not in have]
        assert have.asked <= 2 * len(have.intervals()) + 4  # a step per stretch (plus the rotation's)
        again = _without(kept, have)  # a compacted order (gaps where runs landed) compacts the same way
        assert again == kept
    assert _consecutive([5, 6, 7, 9, 0, 1], 0, 6) == 3
    assert _consecutive([11, 12, 0, 1, 2], 0, 5) == 2
    assert _consecutive([3, 4], 1, 1) == 1
