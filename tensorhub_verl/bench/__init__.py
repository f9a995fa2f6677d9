"""Benchmarks on real processes. Each prints its figures and one JSON object as its last line."""
