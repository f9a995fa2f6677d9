"""Interval sets and coverage counts answer exactly what a plain set or a count per chunk would, through random
adds and removes (pure classes, no processes)."""

import random
from collections import Counter

from tensorhub_verl.ros.hub.intervals import Coverage, IntervalSet, first_held, first_missing


def test_an_interval_set_holds_what_a_set_holds():
    rng = random.Random(5)
    chunks, model = IntervalSet(), set()
    for step in range(3000):
        start = rng.randrange(200)
        end = start + rng.randrange(0, 40)
        if rng.random() < 0.6:
            chunks.update(range(start, end)) if rng.random() < 0.5 else chunks.update(list(range(start, end))[::-1])
            model.update(range(start, end))
        else:
            chunks.remove_range(start, end)
            model.difference_update(range(start, end))
        assert len(chunks) == len(model)
        if step % 25 == 0:
            assert list(chunks) == sorted(model)
            spans = chunks.intervals()
            assert all(e < s2 for (_, e), (s2, _) in zip(spans, spans[1:]))  # disjoint, never touching
            for x in range(0, 245, 7):
                assert (x in chunks) == (x in model)
                end = x + rng.randrange(1, 60)
                assert chunks.first_in(x, end) == first_held(model, x, end)
                assert first_missing(chunks, x, end) == first_missing(model, x, end)
                assert chunks.run_end(x) == (next(c for c in range(x, 300) if c not in model) if x in model else x)
    assert chunks - {1, 2} == model - {1, 2} and isinstance(chunks - {1}, IntervalSet)


def test_a_coverage_counts_overlapping_intervals_as_a_count_per_chunk_would():
    rng = random.Random(9)
    coverage, model, live = Coverage(), Counter(), []
    for step in range(3000):
        if live and rng.random() < 0.45:
            start, end = live.pop(rng.randrange(len(live)))
            coverage.remove(start, end)
            model.subtract(range(start, end))
        else:
            start = rng.randrange(200)
            end = start + rng.randrange(1, 40)
            live.append((start, end))
            coverage.add(start, end)
            model.update(range(start, end))
        if step % 25 == 0:
            covered = {c for c, n in model.items() if n > 0}
            assert coverage.covered() == covered
            for x in range(0, 245, 3):
                assert coverage.count(x) == model[x]
                end = x + rng.randrange(1, 60)
                assert coverage.first_in(x, end) == min((c for c in covered if x <= c < end), default=end)
    for start, end in live:
        coverage.remove(start, end)
    assert not coverage and coverage.covered() == set()
