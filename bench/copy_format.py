"""Benchmark of how archives are written: the same Arrow rows COPYed into a table like a
raw archive in PostgreSQL's binary format (pgpq, server/ingest/archive.py) and as CSV
text (the previous path, still taken where a column has no binary form), in turns.

    python -m bench.copy_format [--rows 1000000] [--repeat 3]

The rows are the ingest benchmark's impressions (campaign text, user id bigint, price
numeric(12,4), event time timestamptz) with their run, built in Arrow as a batch of runs
reaches the commit; each COPY runs in a transaction of its own into an empty table,
committed, the way a commit writes an archive. A turn's clock covers encoding and
PostgreSQL's COPY; the better of ``--repeat`` turns of each counts.
"""

from __future__ import annotations

import argparse
import time
from decimal import Decimal

import numpy as np
import psycopg
import pyarrow as pa

from bench.harness.database import scratch_database
from bench.harness.results import Result, check_scale
from rewriter.naming import INTERNAL_SCHEMA
from server.ingest.archive import copy_in

TABLE = "copy_format_bench"
COLUMNS = "campaign text, user_id bigint, price numeric(12,4), t timestamptz, strata_run bigint"
SIZES = {"smoke": (20_000, 1), "full": (1_000_000, 3)}


def impressions(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    start = 1_767_225_600_000_000  # 2026-01-01 in µs
    cents = rng.integers(1, 50_000, rows)
    return pa.table(
        {
            "campaign": pa.array([f"campaign_{i:03d}" for i in rng.integers(0, 100, rows)]),
            "user_id": pa.array(rng.integers(1, 10_000_000, rows)),
            "price": pa.array([Decimal(int(c)).scaleb(-4) for c in cents], pa.decimal128(12, 4)),
            "t": pa.array(start + rng.integers(0, 86_400_000_000, rows)).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "strata_run": pa.array(rng.integers(1, 50, rows)),
        }
    )


def one_copy(url: str, data: pa.Table, binary: bool) -> float:
    with psycopg.connect(url) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {INTERNAL_SCHEMA}.{TABLE}")
        connection.execute(f"CREATE TABLE {INTERNAL_SCHEMA}.{TABLE} ({COLUMNS})")
        connection.commit()
        started = time.perf_counter()
        with connection.cursor() as cursor:
            copy_in(cursor, TABLE, data, binary=binary)
        connection.commit()
        seconds = time.perf_counter() - started
        held = connection.execute(
            f"SELECT count(*), sum(price), sum(user_id) FROM {INTERNAL_SCHEMA}.{TABLE}"
        ).fetchone()
    assert held is not None and held[0] == data.num_rows, held
    return seconds


def benchmark(scale: str) -> list[Result]:
    rows, repeat = SIZES[check_scale(scale)]
    return measure(rows, repeat)


def measure(rows: int, repeat: int) -> list[Result]:
    data = impressions(rows)
    best: dict[bool, float] = {True: float("inf"), False: float("inf")}
    with scratch_database("strata-bench-copy-") as database:
        with psycopg.connect(database.url, autocommit=True) as connection:
            connection.execute(f"CREATE SCHEMA IF NOT EXISTS {INTERNAL_SCHEMA}")
        sums = set()
        for turn in range(repeat):
            for binary in (turn % 2 == 0, turn % 2 != 0):  # each goes first in turn
                best[binary] = min(best[binary], one_copy(database.url, data, binary))
            with psycopg.connect(database.url) as connection:
                sums.add(
                    connection.execute(
                        f"SELECT sum(price), min(t), max(campaign) FROM {INTERNAL_SCHEMA}.{TABLE}"
                    ).fetchone()
                )
        assert len(sums) == 1, sums  # both formats wrote the same values
    for binary, seconds in best.items():
        name = "binary (pgpq)" if binary else "CSV text"
        print(f"{name}: {rows / seconds:,.0f} rows/s ({seconds:.2f} s for {rows:,} rows)")
    return [
        Result(
            "COPY of raw rows into an archive, binary from Arrow (pgpq)",
            rows / best[True],
            rows / best[False],
            "the same rows as CSV text",
            "rows/s",
            "higher",
            context={
                "rows": rows,
                "binary_s": round(best[True], 3),
                "csv_s": round(best[False], 3),
            },
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=SIZES["full"][0])
    parser.add_argument("--repeat", type=int, default=SIZES["full"][1])
    args = parser.parse_args()
    for result in measure(args.rows, args.repeat):
        print(result.to_dict())


if __name__ == "__main__":
    main()
