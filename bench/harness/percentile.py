"""The one percentile of the benchmarks' figures (latency p50 and p99, medians of repeated
timings), so that a p99 means the same in every benchmark."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank percentile: the smallest of the n ``values`` such that at least
    q·n of them are less than or equal to it, i.e. ``sorted(values)[ceil(q·n) - 1]``, for
    ``q`` in (0, 1]. It is always one of the values, never an interpolation between two:
    with fewer than 100 values the p99 is the largest, and with an even count the p50 is
    the lower of the two middle values.

    >>> percentile([0.3, 0.1, 0.4, 0.2], 0.5)
    0.2
    >>> percentile(range(1, 101), 0.99)
    99
    >>> percentile([0.2, 0.1], 0.99)
    0.2
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], not {q}")
    # Rounded first: q·n in floating point may land just above a whole number (0.07 · 100
    # is 7.000000000000001), which ceil would take one rank too far.
    rank = math.ceil(round(q * len(ordered), 9))
    return ordered[max(rank, 1) - 1]
