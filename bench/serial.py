"""Benchmark of serial streams: query time of a serial (SP) view before and after its
windows are materialized, against a plain table of its results.

    python -m bench.serial [--groups 1000] [--repeat 5]

What it does, in one process:

1. starts an embedded PostgreSQL in a temporary dir (or uses ``STRATA_DATABASE_URL``) and
   applies the migrations (bench.harness.database);
2. registers three streams in the catalog as `POST /streams` would (their SQL, their
   PostgreSQL objects): the raw stream ``ev``, ``per_minute`` (count per campaign and
   minute, parallel) and ``top_per_5`` (the largest per-campaign count of each 5 minutes:
   MAX over COUNT, a gather point, so serial);
3. fills ``per_minute``'s partial archive with one day of 1-minute windows x ``--groups``
   campaigns, as Spark would have written them, and sets ``ev``'s watermark to the day's
   end, so that every window of ``top_per_5`` is closed;
4. baseline: ``CREATE TABLE`` of the view's rows (one row per window), indexed on ``t``;
5. times two queries (median of ``--repeat`` after one untimed run): the whole day, and one
   hour; on the view with every window computed on read (nothing materialized), then after
   Strata's reducer has folded ``per_minute`` and its materializer (server/workers/serial.py)
   has archived every closed window, and on the plain table;
6. checks that the three give identical rows; exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import logging
from datetime import UTC, datetime

import psycopg

from bench.harness.catalog import register
from bench.harness.database import measure, scratch_database
from bench.harness.errors import BenchError
from bench.harness.results import Result, check_scale, timed
from server.catalog import PlanCache, create_catalog_engine
from server.workers.reducer import Reducer
from server.workers.serial import Materializer

DAY = datetime(2024, 6, 1, tzinfo=UTC)
STREAMS = {
    "ev": "CREATE STREAM ev (campaign text, user_id bigint, t timestamptz) WITH (event_time = 't')",
    "per_minute": "CREATE STREAM per_minute AS SELECT campaign, count(*) AS n, window_end AS t "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "top_per_5": "CREATE STREAM top_per_5 AS SELECT max(n) AS top, count(*) AS campaigns, "
    "window_end AS t FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') GROUP BY window_end",
}
QUERIES = {
    "whole day": "SELECT * FROM {table} ORDER BY t",
    "one hour": "SELECT * FROM {table} WHERE t > '2024-06-01 12:00+00' "
    "AND t <= '2024-06-01 13:00+00' ORDER BY t",
}


def load(conn: psycopg.Connection, groups: int) -> None:
    """One partial row per minute and campaign (one run), counts 1..17."""
    conn.execute(
        "INSERT INTO strata_internal.per_minute__partial "
        "(strata_run, window_start, key_0, agg_0_count) "
        "SELECT 1, %s + m * interval '1 minute', 'c' || g, (m * g) %% 17 + 1 "
        "FROM generate_series(0, 1439) m, generate_series(1, %s) g",
        (DAY, groups),
    )
    conn.execute(
        "INSERT INTO strata_catalog.stream_progress (stream, watermark, rows, runs, "
        "late_rows, late_runs) VALUES ('ev', %s + interval '1 day', 0, 1, 0, 0)",
        (DAY,),
    )
    conn.execute("VACUUM ANALYZE strata_internal.per_minute__partial")


def run_benchmark(args: argparse.Namespace) -> list[Result]:
    with (
        scratch_database("strata-bench-serial-") as database,
        psycopg.connect(database.url, autocommit=True) as conn,
    ):
        register(conn, STREAMS)
        load(conn, args.groups)
        conn.execute("CREATE TABLE plain_top AS SELECT * FROM top_per_5")
        conn.execute("CREATE INDEX plain_top_t ON plain_top (t)")
        conn.execute("VACUUM ANALYZE plain_top")
        before = {
            q: measure(conn, s.format(table="top_per_5"), args.repeat) for q, s in QUERIES.items()
        }
        engine = create_catalog_engine(database.url)
        try:
            # Caught up: the reducer has folded per_minute's partial rows (as it does every
            # few seconds), and the materializer has archived every closed window.
            Reducer(engine, PlanCache(), min_rows=0, max_groups=1_000_000).run_once()
            for archive in ("per_minute__partial", "per_minute__reduced"):  # as autovacuum
                conn.execute(f"VACUUM ANALYZE strata_internal.{archive}")  # type: ignore[arg-type]
            worker = Materializer(engine, PlanCache(), batch=1000)
            (_, seconds) = timed(lambda: [worker.run_once() for _ in range(3)])
        finally:
            engine.dispose()
        conn.execute("VACUUM ANALYZE strata_internal.top_per_5__serial")
        windows = conn.execute("SELECT count(*) FROM strata_internal.top_per_5__serial").fetchone()
        after = {
            q: measure(conn, s.format(table="top_per_5"), args.repeat) for q, s in QUERIES.items()
        }
        plain = {
            q: measure(conn, s.format(table="plain_top"), args.repeat) for q, s in QUERIES.items()
        }
    for query in QUERIES:
        if not (before[query].result == after[query].result == plain[query].result):
            raise BenchError(f"{query}: the view before, after and the plain table disagree")
    print(f"materialized {windows[0] if windows else 0} windows in {seconds:.2f} s")
    results = []
    for query in QUERIES:
        medians = {
            name: m[query].median_ms
            for name, m in (("before", before), ("after", after), ("plain", plain))
        }
        print(f"{query}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items()))
        results.append(
            Result(
                figure=f"serial view after materialization: {query}",
                value=medians["after"],
                baseline=medians["plain"],
                baseline_name="the same query over a plain table of the view's rows",
                unit="ms",
                better="lower",
                context={
                    "view_before_materialization_ms": round(medians["before"], 2),
                    "groups": args.groups,
                    "materialize_seconds": round(seconds, 2),
                },
            )
        )
    return results


SCALES = {"smoke": ["--groups", "20", "--repeat", "2"], "full": []}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    logging.basicConfig(level=logging.WARNING)
    return run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000, help="campaigns (1000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per query (5)")
    return parser


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_benchmark(_parser().parse_args())
