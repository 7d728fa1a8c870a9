"""The benchmarks' harness (bench.harness): the one percentile every figure uses, and the
examples of its docstrings."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.harness import data, lateness, nexmark
from bench.harness import percentile as percentile_module
from bench.harness.data import HOUR_MS, day_timestamp
from bench.harness.lateness import HOURS_LATE
from bench.harness.percentile import percentile


@pytest.mark.parametrize("module", [percentile_module, data, lateness], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    failures, tried = doctest.testmod(module)
    assert tried and not failures


@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=300), st.integers(1, 100))
def test_percentile_is_the_nearest_rank(values: list[int], percent: int) -> None:
    """The smallest value such that at least q·n of the n values are at most it (q = percent
    / 100, compared in whole numbers: no rounding)."""
    found = percentile(values, percent / 100)
    n = len(values)
    assert found in values
    assert 100 * sum(v <= found for v in values) >= percent * n
    assert all(100 * sum(w <= v for w in values) < percent * n for v in values if v < found)


def test_percentile_of_few_samples() -> None:
    latencies = [0.3, 0.1, 0.2]
    assert percentile(latencies, 0.99) == 0.3  # the largest: fewer than 100 samples
    assert percentile(latencies, 0.5) == 0.2
    assert percentile([0.2, 0.1], 0.5) == 0.1  # the lower middle value, never their mean
    assert percentile(range(1, 101), 0.07) == 7  # 0.07 * 100 is 7.000000000000001
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_the_auction_workload() -> None:
    """bench.harness.nexmark: seeded, every event in one run of its stream, the profile's
    share of each stream's runs late, bids on auctions that exist and have opened."""
    workload = nexmark.generate(3_000, 500, 7, HOURS_LATE, 2 * HOUR_MS)
    again = nexmark.generate(3_000, 500, 7, HOURS_LATE, 2 * HOUR_MS)
    assert workload == again
    runs = workload.runs
    assert runs.rows == 3_000 and len(runs.bodies) == len(workload.streams) == 12
    for stream in (nexmark.AUCTION, nexmark.BID):
        mine = workload.of(stream)
        assert len(mine.bodies) == 6 and len(mine.late_runs) == round(0.2 * 6)
        assert all(b.startswith(nexmark.HEADERS[stream].encode()) for b in mine.bodies)
    opened = workload.auctions.opened_ms
    assert opened == sorted(opened) and len(opened) == workload.of(nexmark.AUCTION).rows
    for body in workload.of(nexmark.BID).bodies:
        for line in body.decode().splitlines()[1:]:
            auction, _, _, at = line.split(",")
            assert day_timestamp(opened[int(auction)]) <= at
