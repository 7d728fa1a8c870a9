"""The one error of the benchmarks."""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark cannot go on (a server that would not start), or its results are wrong."""
