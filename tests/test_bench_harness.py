"""The benchmarks' harness (bench.harness): the one percentile every figure uses, and the
examples of its docstrings."""

from __future__ import annotations

import doctest
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import peer_flink
from bench.harness import data, flink, lateness, nexmark, nexmark_flink, nexmark_queries
from bench.harness import percentile as percentile_module
from bench.harness.data import HOUR_MS, day_timestamp
from bench.harness.errors import BenchError
from bench.harness.lateness import HOURS_LATE
from bench.harness.percentile import percentile
from bench.sustained import check_disk


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


def test_flink_reads_the_runs_in_arrival_order(tmp_path: Path) -> None:
    """bench.harness.flink: the runs as one CSV file for Flink's filesystem source, in their
    order, without headers, instants as Flink's CSV format reads a TIMESTAMP(3)."""
    bodies = [
        b"campaign,user_id,price,t\nc1,1,0.5000,2024-01-01T00:10:00.004Z\n",
        b"campaign,user_id,price,t\nc2,2,1.2500,2024-01-01T00:00:59Z\n",
    ]
    flink.flink_csv(bodies, tmp_path / "in.csv")
    assert (tmp_path / "in.csv").read_bytes() == (
        b"c1,1,0.5000,2024-01-01 00:10:00.004\nc2,2,1.2500,2024-01-01 00:00:59\n"
    )
    sink = tmp_path / "out"
    (sink / "sub").mkdir(parents=True)
    (sink / "part-0").write_bytes(b"a\n")
    (sink / "sub" / "part-1").write_bytes(b"b\n")
    (sink / ".part-2.inprogress").write_bytes(b"unfinished\n")
    assert flink.read_output(sink) == b"a\nb\n"
    assert any(r.startswith("apache-flink==") for r in flink.requirements())


def test_the_flink_peers_workloads(tmp_path: Path) -> None:
    """bench/peer_flink.py's issue-29 workload: a fifth of the runs, each 1.5-2.8 hours late;
    every workload's Flink job reads its source once and writes each output."""
    size = peer_flink.SCALES["full"]
    (impressions,) = peer_flink.workloads(size, ("impressions",))
    runs = impressions.data
    assert runs.rows == 600_000 and len(runs.bodies) == 30 and len(runs.late_runs) == 6
    assert sum(runs.rows_per_body[i] for i in runs.late_runs) == 120_000
    # Each late run arrives after the runs of up to its delay later (a run is 12 minutes).
    behind = [
        _newest(runs.bodies[:index]) - _newest(runs.bodies[index : index + 1])
        for index in runs.late_runs
    ]
    assert all(1.5 * HOUR_MS - 12 * 60_000 <= ms <= 2.8 * HOUR_MS for ms in behind), behind
    (small,) = peer_flink.workloads(peer_flink.SCALES["smoke"], ("impressions",))
    assert len(small.data.bodies) == 30 and len(small.data.late_runs) == 6
    smoke = peer_flink.workloads(peer_flink.SCALES["smoke"], peer_flink.WORKLOADS)
    assert [w.name for w in smoke] == list(peer_flink.WORKLOADS[:-1])  # all but Nexmark's
    job = peer_flink.flink_job(smoke[1], tmp_path)
    assert len(job.inserts) == len(job.outputs) == 3 and job.runs == 2
    assert "WATERMARK FOR t AS t - INTERVAL '240' MINUTE(3)" in job.statements[0]


def _newest(bodies: list[bytes]) -> int:
    """The latest event time of the impressions in ``bodies``, in ms of the day."""
    newest = max(line.split(b",")[3] for body in bodies for line in body.splitlines()[1:])
    hours, minutes, seconds = newest.decode()[11:-1].split(":")
    return round((int(hours) * 3600 + int(minutes) * 60 + float(seconds)) * 1000)


def test_the_nexmark_queries_flink_runs() -> None:
    """bench.harness.nexmark_flink: Nexmark queries of the harness, their sources with the
    1-hour watermark of bench/nexmark.py's Spark peer, q13's side input as Strata's."""
    names = {q.name for q in nexmark_queries.QUERIES}
    assert set(nexmark_flink.FLINK_QUERIES) <= names and set(nexmark_flink.NOTES) <= names
    assert len(nexmark_flink.FLINK_QUERIES) == 15
    bid = nexmark_flink.source_columns("bid")
    assert bid.startswith("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING")
    assert bid.endswith("WATERMARK FOR date_time AS date_time - INTERVAL '1' HOUR")
    side = nexmark_flink.side_input_csv().decode().splitlines()
    assert len(side) == nexmark_queries.SIDE_INPUT_KEYS and side[7] == "7,value-7"


def test_the_sustained_benchmark_refuses_to_start_without_the_disk_it_needs(
    tmp_path: Path,
) -> None:
    """A disk that fills stops PostgreSQL half-way through the ten minutes; the benchmark
    says so before it starts, with what it wants and what is free."""
    with pytest.raises(BenchError, match=r"may write 25\.0 GB .* has 20\.0 GB free"):
        check_disk(tmp_path, 10, free=20e9)
    check_disk(tmp_path, 10, free=26e9)
    check_disk(tmp_path, 0.25)  # the smoke scale's quarter of a minute fits anywhere here
