"""Benchmark of ALTER STREAM: a derived stream redefined over archived history, against
PostgreSQL.

    python -m bench.alter [--rows 10000000] [--run-rows 500000] [--chunk-rows N] [--keep]

The figure: ``ALTER STREAM impsn_count AS SELECT ...`` with a definition whose partial form
differs from the stream's (a WHERE filter and another aggregate), so that the new
definition is back-filled from ``--rows`` archived raw rows, timed against PostgreSQL's own
``CREATE TABLE ... AS SELECT ... WHERE ... GROUP BY ...`` of the new query over the same
rows in the same database, in the same run.

What it does, in one process tree (the set-up is bench/backfill.py's):

1. starts ``strata up`` as a real subprocess on a free port and a temporary data dir
   (bench.harness.server), and reads ``database_url`` from ``GET /info``;
2. creates the raw stream ``impsns`` through the API and loads its history directly in
   PostgreSQL (bench.backfill.load_history: committed runs of ``--run-rows`` generated
   rows, then VACUUM ANALYZE); the load is timed and reported on its own;
3. warm-up (untimed in the figure): a small raw stream ``warmup``, the back-fill of
   ``warmup_1m`` over it and an ALTER of ``warmup_1m`` to the new definition, so that the
   timed ALTER pays neither the first Spark job's JVM warm-up nor the first alter's;
4. creates the derived stream ``impsn_count`` (count and revenue per campaign per 1-minute
   window, bench/backfill.py's) and waits until its own back-fill is done (timed, reported,
   not part of the comparison);
5. baseline: ``CREATE TABLE alter_baseline AS SELECT campaign, count(*), max(price),
   <minute end> FROM strata_internal.impsns__raw WHERE price >= 1 GROUP BY 1, 4``, timed;
6. Strata: ``POST /streams`` of ``ALTER STREAM impsn_count AS SELECT campaign, count(*) AS
   c, max(price) AS top, window_end AS t FROM TUMBLE(...) WHERE price >= 1 GROUP BY ...``,
   whose answer must say ``alter.path`` = ``backfill``; then polls ``GET
   /streams/impsn_count`` every 0.1 s until ``progress.alter.state`` is ``done`` for that
   version (``building`` until then); the ALTER time runs from the POST to done, and
   includes the wait for the swapper once every row is back-filled (shown on its own);
7. checks that the view equals the baseline exactly (row counts, EXCEPT ALL both ways, rows
   done = rows total = rows); as a diagnostic, how often the ALTER scanned the raw archive
   (pg_stat_user_tables, read once the server has reported its scans);
8. a cheap ALTER: the same SELECT with ``top`` renamed ``max_price``, which needs no
   back-fill (``alter.path`` must be ``reuse``), timed from the POST to done the same way,
   and the view checked against the baseline again;
9. stops the server with SIGTERM and requires a clean exit within 60 s.

Anything wrong (a path other than expected, a view that differs from the baseline, an
unclean stop) is printed and makes the run exit non-zero. Prints a table and one JSON line
``{"rows", "alter_seconds", "postgres_seconds", "ratio", "strata_rows_per_s",
"cheap_alter_seconds", ...}`` where ratio = Strata ALTER time / PostgreSQL time. The
server's log is ``<data dir>/server.log`` (kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from bench.backfill import (
    RAW,
    RAW_SQL,
    VIEW,
    WARMUP,
    WARMUP_ROWS,
    WARMUP_RUN_ROWS,
    backfill,
    chunks_of,
    cli,
    history_parser,
    load_history,
    raw_table,
    scale_entry,
    scans,
)
from bench.harness.api import create_stream
from bench.harness.database import scalar
from bench.harness.errors import BenchError
from bench.harness.results import Result, Timing, print_table
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

BASELINE = "alter_baseline"
# The new definition: a WHERE filter and max instead of sum, so that the partial rows the
# stream archived cannot serve it and the raw archive must be read again.
ALTER_SQL = (
    "ALTER STREAM {view} AS SELECT campaign, count(*) AS c, max(price) AS {top}, "
    "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') WHERE price >= 1 "
    "GROUP BY campaign, window_end"
)
TOP, RENAMED = "top", "max_price"  # the cheap ALTER renames one output column
BASELINE_SQL = (
    "CREATE TABLE {baseline} AS SELECT campaign, count(*) AS c, max(price) AS top, "
    "to_timestamp(floor(extract(epoch FROM t) / 60) * 60) + interval '1 minute' AS t "
    "FROM {raw} WHERE price >= 1 GROUP BY 1, 4"
)
POLL_INTERVAL = 0.1
# A backend reports its table statistics when idle, at most once a second: the server's
# scans of the raw archive show in pg_stat_user_tables only that long after they ended.
STATS_SETTLE = 2.0
SAMPLES_SHOWN = 6
HTTP_TIMEOUT = 120.0


# ---- the ALTER -------------------------------------------------------------------------


@dataclass
class Sample:
    """What GET /streams/{name} said about the alter, ``at`` seconds after the POST."""

    at: float
    done: int
    total: int
    state: str


@dataclass
class Alter:
    seconds: float  # POST to state "done" as the client sees it
    post_seconds: float  # the POST alone
    answer: dict[str, Any]  # the POST's "alter": path, version, state
    samples: list[Sample]
    final: dict[str, Any]  # progress.alter once done

    @property
    def path(self) -> str:
        return str(self.answer.get("path"))

    @property
    def caught_up(self) -> float | None:
        """When a poll first saw every row back-filled (the swap follows), if one did."""
        for s in self.samples:
            if s.total and s.done == s.total:
                return s.at
        return None


def alter(client: httpx.Client, view: str, statement: str, timeout: float) -> Alter:
    """POST ``statement`` (an ALTER STREAM of ``view``), then poll GET /streams/{view} until
    progress.alter is done for the version the POST answered."""
    samples: list[Sample] = []
    started = time.monotonic()
    response = client.post("/streams", json={"sql": statement})
    posted = time.monotonic() - started
    if not response.is_success:
        raise BenchError(f"{statement}: {response.status_code} {response.text}")
    answer = response.json().get("alter")
    if not isinstance(answer, dict) or not {"path", "version", "state"} <= answer.keys():
        raise BenchError(f"{statement}: no alter path/version/state in {response.text}")
    deadline = started + timeout
    while True:
        response = client.get(f"/streams/{view}")
        now = time.monotonic() - started
        if response.status_code != 200:
            raise BenchError(f"GET /streams/{view}: {response.status_code} {response.text}")
        progress = response.json()["progress"].get("alter")
        if not isinstance(progress, dict):
            raise BenchError(f"{view} shows no alter: {response.json()['progress']}")
        samples.append(
            Sample(now, progress["rows_done"], progress["rows_total"], progress["state"])
        )
        if progress["version"] == answer["version"] and progress["state"] == "done":
            break
        if progress["version"] != answer["version"] and progress["state"] == "done":
            raise BenchError(f"{view} is done at version {progress}, the ALTER made {answer}")
        if time.monotonic() > deadline:
            raise BenchError(f"ALTER of {view} not done after {timeout:.0f}s: {progress}")
        time.sleep(POLL_INTERVAL)
    return Alter(samples[-1].at, posted, answer, samples, progress)


def baseline(database_url: str) -> float:
    """The new query as a batch CREATE TABLE AS over the raw archive, timed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(BASELINE)))
        statement = sql.SQL(BASELINE_SQL).format(
            baseline=sql.Identifier(BASELINE), raw=raw_table(RAW)
        )
        started = time.monotonic()
        conn.execute(statement)
        return time.monotonic() - started


def verify(database_url: str, rows: int, done: Alter, top: str) -> tuple[list[str], int]:
    """What is wrong with the altered view, whose max column is ``top``, against the
    baseline (empty when all is right), and its row count."""
    problems: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        view_rows = int(scalar(conn, f"SELECT count(*) FROM {VIEW}"))
        baseline_rows = scalar(conn, f"SELECT count(*) FROM {BASELINE}")
        if view_rows != baseline_rows:
            problems.append(f"{VIEW} has {view_rows} rows, {BASELINE} {baseline_rows}")
        if view_rows == 0:
            problems.append(f"{VIEW} is empty")
        columns = {
            VIEW: f'campaign, c, "{top}", t',
            BASELINE: "campaign, c, top, t",
        }
        for left, right in ((VIEW, BASELINE), (BASELINE, VIEW)):
            differ = scalar(
                conn,
                f"SELECT count(*) FROM (SELECT {columns[left]} FROM {left} "
                f"EXCEPT ALL SELECT {columns[right]} FROM {right}) d",
            )
            if differ:
                problems.append(f"{differ} rows of {left} are not in {right}")
    final = done.final
    if done.path == "backfill" and not final["rows_done"] == final["rows_total"] == rows:
        problems.append(
            f"the ALTER's back-fill did {final['rows_done']} of {final['rows_total']} rows, "
            f"expected {rows}"
        )
    return problems, view_rows


# ---- the run ---------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figure."""
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-alter-"))
    server: Server | None = None
    exit_code = 0
    timings: list[Timing] = []
    results: list[Result] = []
    problems: list[str] = []
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
                    f"{len(seqs)} committed runs of {args.run_rows:,} rows; not part of the "
                    "comparison",
                )
            )

            started = time.monotonic()
            load_history(url, WARMUP, WARMUP_ROWS, WARMUP_RUN_ROWS)
            warm_view = f"{WARMUP}_1m"
            backfill(client, warm_view, WARMUP, args.timeout)
            warm = alter(
                client,
                warm_view,
                ALTER_SQL.format(view=warm_view, raw=WARMUP, top=TOP),
                args.timeout,
            )
            timings.append(
                Timing(
                    "warm-up",
                    WARMUP_ROWS,
                    time.monotonic() - started,
                    f"back-fill of {warm_view} over {WARMUP_ROWS:,} rows, then its ALTER "
                    f"(path {warm.path}) {warm.seconds:.2f}s",
                )
            )

            created = backfill(client, VIEW, RAW, args.timeout)
            timings.append(
                Timing(
                    "create + back-fill (untimed)",
                    args.rows,
                    created.seconds,
                    f"{VIEW} as bench/backfill.py defines it; not part of the comparison",
                )
            )

            load_before = os.getloadavg()[0]
            pg_seconds = baseline(url)
            postgres = Timing(
                "PostgreSQL CREATE..WHERE..",
                args.rows,
                pg_seconds,
                f"CREATE TABLE {BASELINE} AS SELECT .. FROM raw archive WHERE .. GROUP BY 1, 4",
            )
            scans_before = scans(url, RAW)
            done = alter(client, VIEW, ALTER_SQL.format(view=VIEW, raw=RAW, top=TOP), args.timeout)
            strata = Timing(
                "Strata ALTER (back-fill)",
                args.rows,
                done.seconds,
                f"POST to state=done; path {done.path}, version {done.answer['version']}; "
                f"POST {done.post_seconds:.2f}s",
            )
            timings += [postgres, strata]
            if done.path != "backfill":
                problems.append(f"the ALTER took path {done.path!r}, expected 'backfill'")

            started = time.monotonic()
            wrong, view_rows = verify(url, args.rows, done, TOP)
            problems += wrong
            timings.append(
                Timing(
                    "verify",
                    0,
                    time.monotonic() - started,
                    "; ".join(wrong) or f"ok: view == baseline, {view_rows:,} rows",
                )
            )

            time.sleep(STATS_SETTLE)  # after the timed ALTER: see STATS_SETTLE
            scans_after = scans(url, RAW)

            cheap = alter(
                client, VIEW, ALTER_SQL.format(view=VIEW, raw=RAW, top=RENAMED), args.timeout
            )
            timings.append(
                Timing(
                    "Strata ALTER (rename)",
                    0,
                    cheap.seconds,
                    f"{TOP} AS {RENAMED}: path {cheap.path}, version "
                    f"{cheap.answer['version']}; POST {cheap.post_seconds:.2f}s",
                )
            )
            if cheap.path != "reuse":
                problems.append(f"the renaming ALTER took path {cheap.path!r}, expected 'reuse'")
            started = time.monotonic()
            wrong, view_rows = verify(url, args.rows, cheap, RENAMED)
            problems += wrong
            timings.append(
                Timing(
                    "verify after rename",
                    0,
                    time.monotonic() - started,
                    "; ".join(wrong) or f"ok: view == baseline, {view_rows:,} rows",
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
        print(f"\nALTER progress as GET /streams/{VIEW} reported it:")
        print(f"  {'at s':>7} {'rows done':>12} {'rows total':>12}  state")
        samples = done.samples
        step = max(1, len(samples) // (SAMPLES_SHOWN - 1))
        shown = samples[::step]
        if shown[-1] is not samples[-1]:
            shown.append(samples[-1])
        for s in shown:
            print(f"  {s.at:>7.1f} {s.done:>12,} {s.total:>12,}  {s.state}")
        scanned = scans_after[1] - scans_before[1]
        print(
            f"\nraw archive during the ALTER: {scans_after[0] - scans_before[0]} sequential "
            f"scans, {scanned:,} tuples read ({scanned / args.rows:.1f}x the archive)"
        )
        caught_up = done.caught_up
        if caught_up is not None:
            print(
                f"rows done = rows total first polled at {caught_up:.2f}s, state done at "
                f"{done.seconds:.2f}s: {done.seconds - caught_up:.2f}s for the swap to follow"
            )
        lines = log_lines(server, ("strata.alter", "strata.backfill"))
        if lines:
            print("\nserver log (alter, back-fill):")
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
                    "alter_seconds": round(strata.seconds, 3),
                    "postgres_seconds": round(postgres.seconds, 3),
                    "ratio": round(strata.seconds / postgres.seconds, 2),
                    "strata_rows_per_s": round(strata.rows_per_s),
                    "postgres_rows_per_s": round(postgres.rows_per_s),
                    "cheap_alter_seconds": round(cheap.seconds, 3),
                    "create_backfill_seconds": round(created.seconds, 3),
                }
            )
        )
        results.append(
            Result(
                f"ALTER STREAM to a new partial form over {args.rows:,} archived rows",
                strata.seconds,
                postgres.seconds,
                "PostgreSQL CREATE TABLE AS SELECT .. WHERE .. GROUP BY over the same rows",
                "s",
                "lower",
                notes="WHERE price >= 1, max instead of sum; POST to done, view swapped",
                context={
                    "rows": args.rows,
                    "strata_rows_per_s": round(strata.rows_per_s),
                    "postgres_rows_per_s": round(postgres.rows_per_s),
                    "cheap_alter_s": round(cheap.seconds, 3),
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


def _parser() -> argparse.ArgumentParser:
    return history_parser(__doc__.split("\n\n")[0], "an ALTER")


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results); the scales are bench/backfill.py's."""
    return scale_entry(scale, run_benchmark, _parser(), "ALTER STREAM")


def main(argv: list[str] | None = None) -> int:
    return cli(run_benchmark, _parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
