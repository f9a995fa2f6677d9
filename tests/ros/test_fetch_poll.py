"""How often a fetch polls a transport that does not wake it (NIXL): at ``poll_interval_s`` while its reads land,
backing off while nothing does, so that a slow phase of a read costs few polls."""

from tensorhub_verl.ros.client.fetcher import next_poll_s

BASE = 0.0005


def test_polls_back_off_while_nothing_lands_and_return_at_once_after_progress():
    current, seen = BASE, []
    for _ in range(6):
        current = next_poll_s(current, BASE, progressed=False)
        seen.append(current)
    assert seen == [2 * BASE, 4 * BASE, 8 * BASE, 8 * BASE, 8 * BASE, 8 * BASE]
    assert next_poll_s(current, BASE, progressed=True) == BASE


def test_a_fetch_that_keeps_landing_polls_at_its_interval():
    current = BASE
    for _ in range(100):
        current = next_poll_s(current, BASE, progressed=True)
    assert current == BASE
