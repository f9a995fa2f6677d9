"""Benchmarks on real processes. Each prints its figures and one JSON object as its last line."""

import argparse


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse ``type`` for comma lists of positive integers (``--tp 1,2``, ``--readers 1,4``)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers separated by commas, e.g. 1,2")
    return values
