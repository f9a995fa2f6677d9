"""`bench.reader_cpu.profile_shares` (pure): py-spy's collapsed stacks grouped by part of a reader, waits left out."""

import pytest

from tensorhub_dev.bench.reader_cpu import profile_shares


def test_samples_go_to_the_first_part_their_stack_names_and_waiting_leaves_are_left_out(tmp_path):
    (tmp_path / "reader-0.txt").write_text(
        "run (fetcher.py:1);ChunkFetcher._poll (fetcher.py:2);span (lindigest.py:3);_host_words (lindigest.py:4) 6\n"
        "run (tcp.py:1);_Peer._receive (tcp.py:2);recv_into_exact (tcp_wire.py:3) 3\n"
        "run (fetcher.py:1);ChunkFetcher._sleep (fetcher.py:5);Event.wait (threading.py:6);Condition.wait (threading.py:7) 50\n"
        "\n")
    (tmp_path / "reader-1.txt").write_text("main (x.py:1);ChunkFetcher._run (fetcher.py:9) 1\n")
    shares = profile_shares(sorted(tmp_path.glob("reader-*.txt")))
    assert shares == pytest.approx({"the digest": 0.6, "TCP plane: receiving reads": 0.3,
                                    "the fetch loop's bookkeeping": 0.1})
    assert list(shares) == ["the digest", "TCP plane: receiving reads", "the fetch loop's bookkeeping"]
