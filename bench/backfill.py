"""Benchmark of back-fill: a new derived stream over archived history, against PostgreSQL.

    python -m bench.backfill [--rows 10000000] [--run-rows 500000] [--chunk-rows N] [--keep]

The figure: back-fill of a new stream over ``--rows`` archived raw rows, timed against
PostgreSQL's own ``CREATE TABLE ... AS SELECT ... GROUP BY ...`` over the same rows in the
same database, in the same run.

What it does, in one process tree:

1. starts ``strata up`` as a real subprocess on a free port and a temporary data dir
   (embedded PostgreSQL, local Spark; bench.harness.server), and reads
   ``database_url`` from ``GET /info``;
2. creates the raw stream ``impsns`` through the API, then loads its history directly in
   PostgreSQL, not through the HTTP API (which would take minutes): for each run of
   ``--run-rows`` rows, one transaction inserts a committed run into
   ``strata_catalog.runs`` (seq from the runs' own sequence) and its rows into
   ``strata_internal.impsns__raw`` with ``strata_run`` = that seq, generated server-side
   with ``INSERT ... SELECT ... FROM generate_series`` (deterministic: 100 campaigns,
   event times over one day in run order, 10% of the rows up to an hour late, prices with
   4 decimals); then ``VACUUM ANALYZE``. The load is timed and reported on its own, not
   part of the comparison;
3. warm-up (untimed in the figure): the same over a small raw stream ``warmup`` and a
   back-fill of ``warmup_1m``, so that the timed back-fill does not pay the first Spark
   job's JVM warm-up;
4. baseline: ``CREATE TABLE baseline AS SELECT campaign, count(*), sum(price), <minute
   end> FROM strata_internal.impsns__raw GROUP BY 1, 4``, timed;
5. Strata: ``POST /streams`` of the derived stream ``impsn_count`` (count and revenue per
   campaign per 1-minute window), then polls ``GET /streams/impsn_count`` until
   ``progress.backfill.state`` is ``done``; the back-fill time runs from the POST to
   done. The rate and ETA the server reports along the way are sampled;
6. checks that the view equals the baseline exactly (row counts, EXCEPT ALL both ways,
   sum of counts = rows, back-fill rows done = rows total = rows) and exits non-zero
   otherwise;
7. diagnostics: how often the back-fill scanned the raw archive (pg_stat_user_tables)
   and how long reading one chunk back takes (the back-filler's own copy_out);
8. stops the server with SIGTERM and requires a clean exit within 60 s.

``--chunk-rows`` is passed to the server as STRATA_BACKFILL_CHUNK_ROWS (default: the
server's own default); a chunk is whole runs of one source, up to that many rows (at
least one run).

Prints a table and one JSON line ``{"rows", "strata_rows_per_s", "postgres_rows_per_s",
"ratio", ...}`` where ratio = Strata back-fill time / PostgreSQL time. The server's log is
``<data dir>/server.log`` (kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pyarrow as pa
from psycopg import sql

from bench.harness.api import create_stream
from bench.harness.database import scalar
from bench.harness.errors import BenchError
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import (
    Server,
    clean_up,
    log_lines,
    log_problems,
    start_server,
    start_timings,
    stop_orphaned_postgres,
    stop_problems,
    stop_server,
)
from rewriter import RawStreamPlan, rewrite
from rewriter.naming import INTERNAL_SCHEMA, RUN_COLUMN, raw_archive_table
from server.ingest.archive import copy_out
from server.ingest.parse import arrow_schema
from server.settings import Settings

RAW = "impsns"
VIEW = "impsn_count"
BASELINE = "baseline"
WARMUP = "warmup"
RAW_SQL = (
    "CREATE STREAM {raw} (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time='t')"
)
VIEW_SQL = (
    "CREATE STREAM {view} AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)
BASELINE_SQL = (
    "CREATE TABLE {baseline} AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "to_timestamp(floor(extract(epoch FROM t) / 60) * 60) + interval '1 minute' AS t "
    "FROM {raw} GROUP BY 1, 4"
)
# Row i (0-based over the whole history) of ``rows``: ~100 campaigns (multiplicative
# hash), prices 0.0001 .. 4.9999, event times over 2024-01-01 in run order with every
# 10th row up to an hour late (so a minute window's rows spread over several runs).
INSERT_SQL = """
INSERT INTO {raw} (campaign, user_id, price, t, {run})
SELECT 'campaign_' || lpad(((i * 2654435761) %% 4294967296 / 42949673)::text, 3, '0'),
       1 + (i * 48271) %% 9999991,
       ((((i * 69069 + 1) %% 49999) + 1) / 10000.0)::numeric(12, 4),
       timestamptz '2024-01-01 00:00:00+00'
         + greatest(i * 86400000 / %(rows)s::bigint
                    - CASE WHEN i %% 10 = 3 THEN (i * 7919) %% 3600000 ELSE 0 END, 0)
           * interval '1 millisecond',
       %(seq)s::bigint
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i
"""
INSERT_RUN_SQL = """
INSERT INTO strata_catalog.runs (seq, run_id, stream, status, rows, committed_at)
VALUES (nextval(pg_get_serial_sequence('strata_catalog.runs', 'seq')), %(run_id)s,
        %(stream)s, 'committed', %(rows)s, now())
RETURNING seq
"""
WARMUP_ROWS = 20_000
WARMUP_RUN_ROWS = 10_000
POLL_INTERVAL = 0.5
SAMPLES_SHOWN = 6
HTTP_TIMEOUT = 120.0
# The back-fill chunk size `strata up` uses unless told otherwise.
SERVER_CHUNK_ROWS: int = Settings.model_fields["backfill_chunk_rows"].default


# ---- results ---------------------------------------------------------------------------


@dataclass
class Sample:
    """What GET /streams/{name} said about the back-fill, ``at`` seconds after the POST."""

    at: float
    done: int
    total: int
    rate: int
    eta: float | None
    state: str


@dataclass
class Backfill:
    seconds: float  # POST to done, as the client sees it
    post_seconds: float  # the POST alone (plans the back-fill under SHARE locks)
    # finished_at - started_at as the server records them: both are now() of a transaction,
    # i.e. its start, so this ends when the last chunk's transaction began.
    server_seconds: float
    samples: list[Sample]
    final: dict[str, object]

    def chunk_seconds(self) -> list[float]:
        """Seconds between successive advances of rows_done as the polls saw them (one
        chunk each, to the poll interval; the first includes the worker's wake-up)."""
        times: list[float] = []
        last_done, last_at = 0, 0.0
        for s in self.samples:
            if s.done > last_done:
                times.append(s.at - last_at)
                last_done, last_at = s.done, s.at
        return times


# ---- loading history -------------------------------------------------------------------


def raw_table(stream: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(
        sql.Identifier(INTERNAL_SCHEMA), sql.Identifier(raw_archive_table(stream))
    )


def load_history(database_url: str, stream: str, rows: int, run_rows: int) -> list[int]:
    """Committed runs of ``stream`` holding ``rows`` generated rows, one transaction per
    run (catalog row + raw rows), then VACUUM ANALYZE; returns the runs' seqs."""
    insert = sql.SQL(INSERT_SQL).format(raw=raw_table(stream), run=sql.Identifier(RUN_COLUMN))
    seqs: list[int] = []
    with psycopg.connect(database_url) as conn:
        for index, lo in enumerate(range(0, rows, run_rows)):
            hi = min(lo + run_rows, rows)
            with conn.transaction():
                row = conn.execute(
                    INSERT_RUN_SQL,
                    {"run_id": f"history-{stream}-{index:05d}", "stream": stream, "rows": hi - lo},
                ).fetchone()
                assert row is not None
                seq = int(row[0])
                conn.execute(insert, {"rows": rows, "seq": seq, "lo": lo, "hi": hi})
            seqs.append(seq)
        conn.commit()
        conn.autocommit = True
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(raw_table(stream)))
    return seqs


def chunks_of(run_rows: list[int], chunk_rows: int) -> int:
    """How many chunks the back-filler makes of runs of these sizes (in seq order)."""
    chunks, rows = 0, 0
    for n in run_rows:
        if chunks == 0 or rows + n > chunk_rows:
            chunks, rows = chunks + 1, 0
        rows += n
    return chunks


# ---- the phases ------------------------------------------------------------------------


def backfill(client: httpx.Client, view: str, raw: str, timeout: float) -> Backfill:
    """POST the derived stream, poll until its back-fill is done."""
    samples: list[Sample] = []
    started = time.monotonic()
    create_stream(client, VIEW_SQL.format(view=view, raw=raw))
    posted = time.monotonic() - started
    deadline = started + timeout
    while True:
        response = client.get(f"/streams/{view}")
        now = time.monotonic() - started
        if response.status_code != 200:
            raise BenchError(f"GET /streams/{view}: {response.status_code} {response.text}")
        progress = response.json()["progress"]["backfill"]
        if progress is None:
            raise BenchError(f"{view} has no back-fill: {response.json()['progress']}")
        samples.append(
            Sample(
                now,
                progress["rows_done"],
                progress["rows_total"],
                progress["rows_per_second"],
                progress["eta_seconds"],
                progress["state"],
            )
        )
        if progress["state"] == "done":
            break
        if time.monotonic() > deadline:
            raise BenchError(f"back-fill of {view} not done after {timeout:.0f}s: {progress}")
        time.sleep(POLL_INTERVAL)
    seconds = samples[-1].at
    finished = _parse_time(progress["finished_at"]) - _parse_time(progress["started_at"])
    return Backfill(seconds, posted, finished, samples, progress)


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def baseline(database_url: str, raw: str) -> float:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(BASELINE)))
        statement = sql.SQL(BASELINE_SQL).format(
            baseline=sql.Identifier(BASELINE), raw=raw_table(raw)
        )
        started = time.monotonic()
        conn.execute(statement)
        return time.monotonic() - started


def scans(database_url: str, stream: str) -> tuple[int, int]:
    """(seq_scan, seq_tup_read) of a raw archive so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0), coalesce(seq_tup_read, 0) FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = %s",
            (INTERNAL_SCHEMA, raw_archive_table(stream)),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def read_one_chunk(database_url: str, stream: str, runs: list[int]) -> tuple[float, int]:
    """Time the back-filler's read of one chunk (its copy_out: COPY ... WHERE strata_run =
    ANY(runs), CSV into Arrow); returns (seconds, rows)."""
    plan = rewrite(RAW_SQL.format(raw=stream), {})
    assert isinstance(plan, RawStreamPlan)
    schema = arrow_schema(plan.columns).append(pa.field(RUN_COLUMN, pa.int64()))
    with psycopg.connect(database_url, autocommit=True) as conn, conn.cursor() as cursor:
        started = time.monotonic()
        table = copy_out(cursor, raw_archive_table(stream), schema, runs=runs)
        return time.monotonic() - started, table.num_rows


def verify(database_url: str, rows: int, done: Backfill) -> tuple[list[str], int]:
    """What is wrong with the view (empty when all is right), and its row count."""
    problems: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        view_rows = int(scalar(conn, f"SELECT count(*) FROM {VIEW}"))
        baseline_rows = scalar(conn, f"SELECT count(*) FROM {BASELINE}")
        if view_rows != baseline_rows:
            problems.append(f"{VIEW} has {view_rows} rows, {BASELINE} {baseline_rows}")
        if view_rows == 0:
            problems.append(f"{VIEW} is empty")
        counted = scalar(conn, f"SELECT sum(c) FROM {VIEW}")
        if counted != rows:
            problems.append(f"sum(c) of {VIEW} is {counted}, expected {rows}")
        cols = "campaign, c, revenue, t"
        for left, right in ((VIEW, BASELINE), (BASELINE, VIEW)):
            differ = scalar(
                conn,
                f"SELECT count(*) FROM (SELECT {cols} FROM {left} "
                f"EXCEPT ALL SELECT {cols} FROM {right}) d",
            )
            if differ:
                problems.append(f"{differ} rows of {left} are not in {right}")
    final = done.final
    if not final["rows_done"] == final["rows_total"] == rows:
        problems.append(
            f"back-fill did {final['rows_done']} of {final['rows_total']} rows, expected {rows}"
        )
    return problems, view_rows


# ---- the run ---------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figure."""
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-backfill-"))
    server: Server | None = None
    exit_code = 0
    timings: list[Timing] = []
    results: list[Result] = []
    try:
        server = start_server(data_dir)
        url = server.database_url
        timings += start_timings(server, url)
        with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
            create_stream(client, RAW_SQL.format(raw=RAW))
            create_stream(client, RAW_SQL.format(raw=WARMUP))

            started = time.monotonic()
            seqs = load_history(url, RAW, args.rows, args.run_rows)
            run_sizes = [
                min(args.run_rows, args.rows - lo) for lo in range(0, args.rows, args.run_rows)
            ]
            chunks = chunks_of(run_sizes, args.chunk_rows)
            timings.append(
                Timing(
                    "load history (untimed)",
                    args.rows,
                    time.monotonic() - started,
                    f"{len(seqs)} committed runs of {args.run_rows:,} rows, SQL INSERT..SELECT "
                    "generate_series + VACUUM ANALYZE; not part of the comparison",
                )
            )

            started = time.monotonic()
            load_history(url, WARMUP, WARMUP_ROWS, WARMUP_RUN_ROWS)
            warm = backfill(client, f"{WARMUP}_1m", WARMUP, args.timeout)
            timings.append(
                Timing(
                    "warm-up back-fill",
                    WARMUP_ROWS,
                    time.monotonic() - started,
                    f"{WARMUP}_1m over {WARMUP_ROWS:,} rows (JVM/Spark warm-up), "
                    f"back-fill {warm.seconds:.2f}s",
                )
            )

            load_before = os.getloadavg()[0]
            pg_seconds = baseline(url, RAW)
            postgres = Timing(
                "PostgreSQL CREATE..GROUP BY",
                args.rows,
                pg_seconds,
                f"CREATE TABLE {BASELINE} AS SELECT .. FROM raw archive GROUP BY 1, 4",
            )
            scans_before = scans(url, RAW)
            done = backfill(client, VIEW, RAW, args.timeout)
            scans_after = scans(url, RAW)
            strata = Timing(
                "Strata back-fill",
                args.rows,
                done.seconds,
                f"POST /streams to state=done; {chunks} chunks of <= {args.chunk_rows:,} "
                f"rows (server default); POST {done.post_seconds:.2f}s; server's "
                f"started_at..finished_at {done.server_seconds:.2f}s",
            )
            timings += [postgres, strata]

        started = time.monotonic()
        problems, view_rows = verify(url, args.rows, done)
        timings.append(
            Timing(
                "verify",
                0,
                time.monotonic() - started,
                "; ".join(problems) or f"ok: view == baseline, {view_rows:,} rows",
            )
        )
        first_chunk = seqs[: max(1, args.chunk_rows // args.run_rows)]
        read_seconds, read_rows = read_one_chunk(url, RAW, first_chunk)
        timings.append(
            Timing(
                "diag: read one chunk",
                read_rows,
                read_seconds,
                f"the back-filler's copy_out of {len(first_chunk)} run(s), after the fact",
            )
        )
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        orphan = stop_orphaned_postgres(data_dir)
        if orphan is not None:
            problems.append(f"the embedded PostgreSQL (pid {orphan}) outlived the server")

        print_table(timings, phase_width=28, rows_width=11)
        print(
            f"\n{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after the timed phases"
        )
        print("\nback-fill progress as GET /streams/impsn_count reported it:")
        print(f"  {'at s':>7} {'rows done':>12} {'rows/s':>10} {'ETA s':>7}  state")
        samples = done.samples
        step = max(1, len(samples) // (SAMPLES_SHOWN - 1))
        shown = samples[::step]
        if shown[-1] is not samples[-1]:
            shown.append(samples[-1])
        for s in shown:
            eta = "" if s.eta is None else f"{s.eta:.0f}"
            print(f"  {s.at:>7.1f} {s.done:>12,} {s.rate:>10,} {eta:>7}  {s.state}")
        scanned = scans_after[1] - scans_before[1]
        print(
            f"\nraw archive during the back-fill: {scans_after[0] - scans_before[0]} "
            f"sequential scans, {scanned:,} tuples read ({scanned / args.rows:.1f}x the "
            f"archive; no index on {RUN_COLUMN})"
        )
        steps = done.chunk_seconds()
        if steps:
            print(
                f"{chunks} chunks, {done.seconds / chunks:.2f}s per chunk on average; as polled "
                f"({len(steps)} advances): first {steps[0]:.2f}s, median "
                f"{percentile(steps, 0.5):.2f}s, max {max(steps):.2f}s; reading one chunk "
                f"back takes {read_seconds:.2f}s of it, the rest is Spark, the partial rows' "
                "COPY and the catalog updates"
            )
        lines = log_lines(server, ("strata.backfill", "strata.reduc", "committed "))
        if lines:
            print("\nserver log (back-fill, reducer, commits):")
            for line in lines[-15:]:
                print("  " + line[:300])
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:15]:
                print("  " + line[:300])
        print(
            json.dumps(
                {
                    "rows": args.rows,
                    "run_rows": args.run_rows,
                    "chunk_rows": args.chunk_rows,
                    "strata_seconds": round(strata.seconds, 3),
                    "postgres_seconds": round(postgres.seconds, 3),
                    "strata_rows_per_s": round(strata.rows_per_s),
                    "postgres_rows_per_s": round(postgres.rows_per_s),
                    "ratio": round(strata.seconds / postgres.seconds, 2),
                    "load_seconds": round(timings[1].seconds, 2),
                }
            )
        )
        results.append(
            Result(
                f"back-fill of a new stream over {args.rows:,} archived rows",
                strata.seconds,
                postgres.seconds,
                "PostgreSQL CREATE TABLE AS SELECT .. GROUP BY over the same rows",
                "s",
                "lower",
                notes="1-minute count and revenue per campaign",
                context={
                    "rows": args.rows,
                    "strata_rows_per_s": round(strata.rows_per_s),
                    "postgres_rows_per_s": round(postgres.rows_per_s),
                    "chunks": chunks,
                },
            )
        )
        if problems:
            print("\nWRONG:\n  " + "\n  ".join(problems), file=sys.stderr)
            exit_code = 1
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        exit_code = 1
    finally:
        clean_up(server, data_dir, failed=exit_code != 0, keep=args.keep)
    return exit_code, results


# The arguments of each scale of bench/run.py (full: the defaults, the README's figure);
# bench/alter.py's too.
SCALES = {"smoke": ["--rows", "20000", "--run-rows", "5000"], "full": []}

# A benchmark over archived history: its run, from parsed arguments to exit code and figures.
HistoryRun = Callable[[argparse.Namespace], tuple[int, list[Result]]]


def scale_entry(
    scale: str, run_history: HistoryRun, parser: argparse.ArgumentParser, what: str
) -> list[Result]:
    """bench/run.py's entry of a benchmark over archived history (see bench.harness.results)."""
    args = parser.parse_args(SCALES[check_scale(scale)])
    os.environ["STRATA_BACKFILL_CHUNK_ROWS"] = str(args.chunk_rows)  # read by `strata up`
    code, results = run_history(args)
    if code:
        raise BenchError(f"the {what} benchmark failed (see above)")
    return results


def cli(run_history: HistoryRun, parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """The command line of a benchmark over archived history."""
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.run_rows <= 0:
        parser.error("--rows and --run-rows must be positive")
    if args.chunk_rows <= 0:
        parser.error("--chunk-rows must be positive")
    # The server is started with this process's environment.
    os.environ["STRATA_BACKFILL_CHUNK_ROWS"] = str(args.chunk_rows)
    return run_history(args)[0]


def history_parser(description: str, timed: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark over archived history; ``timed`` names what
    --timeout bounds."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000, help="history rows (10000000)")
    parser.add_argument("--run-rows", type=int, default=500_000, help="rows per run (500000)")
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=SERVER_CHUNK_ROWS,
        help=f"the server's back-fill chunk size (STRATA_BACKFILL_CHUNK_ROWS, {SERVER_CHUNK_ROWS})",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help=f"most seconds {timed} may take (1800)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir (server log, embedded PostgreSQL)"
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    return history_parser(__doc__.split("\n\n")[0], "a back-fill")


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    return scale_entry(scale, run_benchmark, _parser(), "back-fill")


def main(argv: list[str] | None = None) -> int:
    return cli(run_benchmark, _parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
