"""Strata against Apache Flink SQL: the same rows, the same aggregates, in the same run.

    python -m bench.peer_flink [--scale full|smoke] [--only WORKLOAD ...] [--threads 4] [--keep]

The peer is what a Flink user runs to get windowed aggregates of files: Flink SQL in
PyFlink's local mini-cluster (``apache-flink`` from PyPI, in a virtual environment of its
own, ``.venv-flink``, with the Java runtime Strata finds; bench.harness.flink), a
filesystem CSV source, parallelism 1, an event-time watermark, window table-valued
functions (``TUMBLE``), a filesystem CSV sink. The workloads, each measured in both
engines in one run on one machine:

* **impressions** (issue 29's): 600,000 ad impressions (bench.harness.impressions) over 6
  hours of event time in 30 runs of 20,000 rows; 6 runs (20% of the rows) arrive 1.5 to
  2.8 hours late, after the runs of that much later event time. Per campaign and 1-minute
  window, ``count(*)`` and ``sum(price)``. Flink's watermark is ``t - INTERVAL '10'
  MINUTE``; Strata's stream has the same delay (which never drops a row).
* **ingest** (bench/ingest.py's three streams): 1,000,000 impressions over a day in runs of
  50,000, 20% of the runs carrying half their rows from anywhere earlier in the day; per
  campaign the 1-minute count and revenue, the 5-minute average and maximum price, the
  hourly count and revenue (Strata: a roll-up of the 1-minute stream; Flink: a third
  TUMBLE over the source, the same numbers). One Flink job (a statement set) computes the
  three, as Strata's one batch does. A run's rows span its slice of the day (72 minutes)
  in random order, so Flink's watermark is as long as a slice: it drops none of a run's
  own rows, only those of the late half from earlier in the day (a 10-minute watermark
  would drop most rows of every run).
* **HiBench** identity, repartition, wordcount, fixwindow (bench/hibench.py's records and
  Strata streams; runs in event-time order, nothing late): Flink's identity copies every
  record into its sink; repartition, wordcount and fixwindow are Strata's SQL as Flink SQL
  (a count per session and per word over a one-day window, per ip over 10-second
  windows), watermark 1 minute as bench/hibench.py's Spark peer.
* **Nexmark** (bench/nexmark.py's events: 40,000 person, auction and bid events over 6
  hours, 20% of each stream's runs 1 to 6 hours late): the queries whose results Flink
  can write to a file (bench.harness.nexmark_flink: q0-q3, q7, q8, q10-q14, q20-q23;
  not those whose results Flink updates), each query alone, its inputs one CSV file a
  stream, watermark 1 hour as bench/nexmark.py's Spark peer. Rows missing here are rows
  of the batch result that the engine's result lacks (a window counted short is one row
  missing and one over-produced). Strata takes each query once (its server warm from the
  workloads before), Flink as many times as everywhere.

How each engine is timed, the same for every workload. **Flink**: the runs' rows in
arrival order in one CSV file (one file is one split, read in order by the single source
task), the job submitted and awaited (``TableResult.wait``), ``FLINK_RUNS`` times (4 at
full scale) in one JVM, the fastest run counted: Flink's JVM starts cold and keeps
compiling over the first few runs, so a second run is not yet warm. The clock covers the
job's submission, its run and its sink files' commit (Flink's own net runtime of the job,
without planning and the mini-cluster's start, is in the context). **Strata**: ``threads``
clients post the runs in arrival order without waiting (``wait=false``, bench.harness.api's
``post_runs``), the clock stops when every run is committed (its raw rows and every
stream's rows visible in PostgreSQL); an untimed pass into streams of their own first (the
server's JVM is warm already: ``strata up`` runs Spark's warm-up before it is used).

Then both engines' results are compared in PostgreSQL (Flink's sink files COPYed there)
with the same aggregate as a batch query over a plain table of every input row (COPY of the
same bodies): rows missing = input rows of a window or key not counted in its result;
over-counted rows, wrong windows and (identity) records are counted too. Strata must be
exact; what Flink drops is reported (a row behind Flink's watermark is dropped without a
word), and rows Flink over-counted fail the benchmark.

Figures: per workload, throughput (rows/s, Strata / Flink), the same against Flink's net
runtime of the job (without its planning and its mini-cluster's start, which a job
submitted to a running Flink cluster would partly save) and rows missing. The scale
``smoke`` proves only that everything works (its numbers mean nothing). The first run of
this benchmark on a machine installs Flink's environment (about 850 MB from PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench import hibench
from bench import nexmark as nexmark_bench
from bench.harness.api import HTTP_TIMEOUT, create_stream, post_runs
from bench.harness.data import DAY_MS, HOUR_MS, Dataset
from bench.harness.database import copy_baseline, fetch_one
from bench.harness.errors import BenchError
from bench.harness.flink import FlinkJob, FlinkOutcome, copy_output, flink_csv, run_flink
from bench.harness.impressions import COLUMNS as IMPRESSION_COLUMNS
from bench.harness.impressions import generate
from bench.harness.lateness import MIXED, ON_TIME
from bench.harness.nexmark_flink import (
    FLINK_QUERIES,
    NOTES,
    side_input_csv,
    source_columns,
)
from bench.harness.nexmark_queries import QUERIES, Query
from bench.harness.nexmark_streams import STREAMS as NEXMARK_STREAMS
from bench.harness.nexmark_streams import Workload as Auctions
from bench.harness.nexmark_streams import create_statement
from bench.harness.nexmark_streams import generate as generate_auctions
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import (
    Server,
    clean_up,
    start_server,
    start_timings,
    stop_problems,
    stop_server,
)

# Issue 29's lateness: a fifth of the runs, each 1.5 to 2.8 hours late, in order otherwise.
LATE_SHARE = 0.2
LATE_MS = (3 * HOUR_MS // 2, 28 * HOUR_MS // 10)
PEER = "Apache Flink SQL"
SETTLE_S = {"full": 10.0, "smoke": 1.0}  # after Strata's untimed pass: its reducer catches up
# Flink's runs of each job; the fastest counts. Its JVM keeps compiling over the first few
# (600,000 impressions here: 13.0, 7.4, 4.5, 3.3 s), so a second run is not yet warm.
FLINK_RUNS = {"full": 4, "smoke": 2}

# ---- checks: (input rows missing, rows over-counted, groups wrong, groups) -----------------

CHECK_COUNTS = """
WITH batch AS (
    SELECT {key} AS k, date_bin('{window}', t, '1970-01-01 00:00:00+00') + interval '{window}'
           AS t, count(*) AS c{sum}
    FROM {{plain}} GROUP BY 1, 2)
SELECT coalesce(sum(greatest(coalesce(b.c, 0) - coalesce(o.c, 0), 0)), 0)::bigint,
       coalesce(sum(greatest(coalesce(o.c, 0) - coalesce(b.c, 0), 0)), 0)::bigint,
       count(*) FILTER (WHERE o.c IS DISTINCT FROM b.c{sum_differs}),
       count(*)
FROM batch b FULL JOIN (SELECT {key} AS k, c{sum_out}, t FROM {{output}}) o USING (k, t)
"""


def check_counts(key: str, window: str, total: str | None = None) -> str:
    """The check of a count (and of a sum of ``total`` as ``revenue``) per ``key`` and
    ``window``, with ``{plain}`` and ``{output}`` to fill in."""
    return CHECK_COUNTS.format(
        key=key,
        window=window,
        sum=f", sum({total}) AS revenue" if total else "",
        sum_differs=" OR o.revenue IS DISTINCT FROM b.revenue" if total else "",
        sum_out=", revenue" if total else "",
    )


# The 5-minute average and maximum: missing, extra or different windows (Flink's average
# has 6 decimals; equal to within 1e-5). Rows are not counted here: (0, 0, wrong, groups).
CHECK_5M = """
WITH batch AS (
    SELECT campaign, date_bin('5 minutes', t, '1970-01-01 00:00:00+00') + interval '5 minutes'
           AS t, avg(price) AS avg_price, max(price) AS max_price
    FROM {plain} GROUP BY 1, 2)
SELECT 0, 0, count(*) FILTER (WHERE o.t IS NULL OR b.t IS NULL OR o.max_price <> b.max_price
                              OR abs(o.avg_price - b.avg_price) > 0.00001),
       count(*)
FROM batch b FULL JOIN (SELECT campaign, avg_price, max_price, t FROM {output}) o
     ON (b.campaign, b.t) = (o.campaign, o.t)
"""


# ---- workloads -------------------------------------------------------------------------------


@dataclass
class Output:
    """One result of a workload: Strata's view ``<raw><suffix>`` and Flink's sink of the same
    rows, checked by ``check`` (a query with ``{plain}`` and ``{output}``)."""

    suffix: str
    strata: str  # CREATE STREAM ... with {raw}
    flink_columns: str  # the Flink sink's columns
    flink_select: str  # Flink SQL over the source table {src}
    columns: str  # the PostgreSQL table of Flink's rows
    check: str


@dataclass
class Workload:
    name: str
    title: str  # for the figures
    data: Dataset
    plain: str  # the PostgreSQL table of every input row (and Flink's source file's name)
    columns: str  # PostgreSQL columns of the raw stream and the plain table
    raw: str  # CREATE STREAM of the raw stream, with {raw}
    flink_columns: str  # the Flink source's columns and its WATERMARK
    outputs: list[Output]


@dataclass
class Measured:
    """One workload in one engine: the timed pass, and each output's check."""

    rows: int
    seconds: float
    checks: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def missing(self) -> int:  # rows missing from the first output (the count)
        return next(iter(self.checks.values()))[0]


def _flink_window(select: str, size: str) -> str:
    return f"TABLE(TUMBLE(TABLE {{src}}, DESCRIPTOR(t), INTERVAL {size})) {select}"


MINUTE_1M = Output(
    "_1m",
    "CREATE STREAM {raw}_1m AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "campaign STRING, c BIGINT, revenue DECIMAL(38, 4), t TIMESTAMP(3)",
    "SELECT campaign, COUNT(*) AS c, SUM(price) AS revenue, window_end AS t FROM "
    + _flink_window("GROUP BY campaign, window_start, window_end", "'1' MINUTE"),
    "campaign text, c bigint, revenue numeric, t timestamptz",
    check_counts("campaign", "1 minute", "price"),
)
MINUTES_5M = Output(
    "_5m",
    "CREATE STREAM {raw}_5m AS SELECT campaign, avg(price) AS avg_price, "
    "max(price) AS max_price, window_end AS t "
    "FROM TUMBLE({raw}, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
    "campaign STRING, avg_price DECIMAL(38, 6), max_price DECIMAL(12, 4), t TIMESTAMP(3)",
    "SELECT campaign, AVG(price) AS avg_price, MAX(price) AS max_price, window_end AS t FROM "
    + _flink_window("GROUP BY campaign, window_start, window_end", "'5' MINUTE"),
    "campaign text, avg_price numeric, max_price numeric, t timestamptz",
    CHECK_5M,
)
HOUR_1H = Output(
    "_1h",
    "CREATE STREAM {raw}_1h AS SELECT campaign, sum(c) AS c, sum(revenue) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}_1m, t, INTERVAL '1 hour') GROUP BY campaign, window_end",
    "campaign STRING, c BIGINT, revenue DECIMAL(38, 4), t TIMESTAMP(3)",
    "SELECT campaign, COUNT(*) AS c, SUM(price) AS revenue, window_end AS t FROM "
    + _flink_window("GROUP BY campaign, window_start, window_end", "'1' HOUR"),
    "campaign text, c bigint, revenue numeric, t timestamptz",
    check_counts("campaign", "1 hour", "price"),
)
IMPRESSION_RAW = (
    f"CREATE STREAM {{raw}} ({IMPRESSION_COLUMNS}) WITH (event_time = 't', delay = '10 minutes')"
)
IMPRESSION_FLINK = (
    "campaign STRING, user_id BIGINT, price DECIMAL(12, 4), t TIMESTAMP(3), "
    "WATERMARK FOR t AS t - INTERVAL '{minutes}' MINUTE{precision}"
)
SLICE_MS = 12 * 60_000  # event time of one run of the impressions workload (30 runs: 6 h)
HIBENCH_FLINK = (
    "ip STRING, session STRING, url STRING, t TIMESTAMP(3), revenue DECIMAL(10, 2), "
    "user_agent STRING, country STRING, `language` STRING, word STRING, duration INT, "
    "WATERMARK FOR t AS t - INTERVAL '1' MINUTE"
)
HIBENCH_WINDOWS = {"1 day": "'1' DAY", "10 seconds": "'10' SECOND"}


def _impression_flink(minutes: int) -> str:
    """The impressions' Flink source columns with a watermark of ``minutes``."""
    precision = f"({len(str(minutes))})" if minutes > 99 else ""  # MINUTE is MINUTE(2)
    return IMPRESSION_FLINK.format(minutes=minutes, precision=precision)


def hibench_output(workload: str) -> Output:
    if workload == "identity":
        fields = hibench.FIELDS
        return Output(
            "_out",
            hibench.IDENTITY.format(out="{raw}_out", raw="{raw}"),
            HIBENCH_FLINK.rsplit(", WATERMARK", 1)[0],
            "SELECT * FROM {src}",
            hibench.COLUMNS,
            hibench.CHECK_RECORDS.format(fields=fields, plain="{plain}", output="{output}"),
        )
    key, window = hibench.STRATA_KEYED[workload]
    return Output(
        "_out",
        hibench.KEYED.format(out="{raw}_out", raw="{raw}", key=key, window=window),
        f"{key} STRING, c BIGINT, t TIMESTAMP(3)",
        f"SELECT {key}, COUNT(*) AS c, window_end AS t FROM "
        + _flink_window(f"GROUP BY {key}, window_start, window_end", HIBENCH_WINDOWS[window]),
        f"{key} text, c bigint, t timestamptz",
        check_counts(key, window),
    )


@dataclass(frozen=True)
class Scale:
    rows: int  # impressions
    run_rows: int
    ingest_rows: int
    ingest_run_rows: int
    hibench_runs: int
    hibench_run_rows: int
    nexmark: nexmark_bench.Scale


SCALES = {
    "full": Scale(600_000, 20_000, 1_000_000, 50_000, 50, 20_000, nexmark_bench.SCALES["full"]),
    "smoke": Scale(
        6_000, 200, 6_000, 1_000, 4, 500, nexmark_bench.Scale(1_000, 250, 2, ("q0", "q3", "q12"))
    ),
}
WORKLOADS = ("impressions", "ingest", *(f"hibench_{w}" for w in hibench.WORKLOADS), "nexmark")


def impressions_late(rows: int, run_rows: int, seed: int) -> Dataset:
    """Impressions in runs of ``run_rows``, each run 12 minutes of event time, arriving in
    event-time order but for a fifth of them, each of which arrives 1.5 to 2.8 hours late:
    after the runs of up to that much later event time. The late runs are drawn from those
    with at least 2.8 hours of event time after them, so that each is as late as it says
    (bench.harness.lateness's profiles draw from every run: one due near the end arrives
    last, late behind nothing)."""
    runs = -(-rows // run_rows)
    data = generate(rows, run_rows, seed, ON_TIME, runs * SLICE_MS)
    rng = random.Random(seed)
    room = [run for run in range(1, runs) if (runs - run - 1) * SLICE_MS >= LATE_MS[1]]
    late = set(rng.sample(room, min(len(room), round(LATE_SHARE * runs))))
    arrives = sorted(
        ((run + 1) * SLICE_MS + (rng.randint(*LATE_MS) if run in late else 0), run)
        for run in range(runs)
    )
    order = [run for _, run in arrives]
    return Dataset(
        [data.bodies[run] for run in order],
        [data.rows_per_body[run] for run in order],
        [index for index, run in enumerate(order) if run in late],
    )


def workloads(size: Scale, names: tuple[str, ...]) -> list[Workload]:
    found = []
    if "impressions" in names:
        data = impressions_late(size.rows, size.run_rows, 2029)
        late = sum(data.rows_per_body[i] for i in data.late_runs)
        title = (
            f"{data.rows:,} impressions in {len(data.bodies)} runs, {late / data.rows:.0%} "
            f"1.5-2.8 h late; count and revenue per campaign and minute"
        )
        found.append(
            Workload(
                "impressions",
                title,
                data,
                "impressions_plain",
                IMPRESSION_COLUMNS,
                IMPRESSION_RAW,
                _impression_flink(10),
                [MINUTE_1M],
            )
        )
    if "ingest" in names:
        data = generate(size.ingest_rows, size.ingest_run_rows, 2024, MIXED, DAY_MS)
        # A run's rows span its slice of the day in random order: a watermark as long as
        # the slice drops none of its own rows, only those from before it (the late half).
        minutes = -(-DAY_MS // len(data.bodies) // 60_000)
        title = (
            f"ingest's three streams, {data.rows:,} impressions in runs of "
            f"{size.ingest_run_rows:,}, 20% of the runs half late; Flink watermark {minutes} min"
        )
        found.append(
            Workload(
                "ingest",
                title,
                data,
                "ingest_plain",
                IMPRESSION_COLUMNS,
                IMPRESSION_RAW,
                _impression_flink(minutes),
                [MINUTE_1M, MINUTES_5M, HOUR_1H],
            )
        )
    chosen = [w for w in hibench.WORKLOADS if f"hibench_{w}" in names]
    if chosen:
        visits = hibench.generate_visits(size.hibench_runs, size.hibench_run_rows)
        for workload in chosen:
            title = (
                f"HiBench {workload}, {visits.rows:,} records in runs of {size.hibench_run_rows:,}"
            )
            found.append(
                Workload(
                    f"hibench_{workload}",
                    title,
                    visits,
                    "hibench_plain",
                    hibench.COLUMNS,
                    hibench.RAW,
                    HIBENCH_FLINK,
                    [hibench_output(workload)],
                )
            )
    return found


# ---- Flink ---------------------------------------------------------------------------------


def flink_job(workload: Workload, work: Path) -> FlinkJob:
    source = work / f"{workload.plain}.csv"
    if not source.exists():
        flink_csv(workload.data.bodies, source)
    src = f"{workload.name}_src"
    statements = [
        f"CREATE TABLE {src} ({workload.flink_columns}) WITH ('connector' = 'filesystem', "
        f"'path' = '{source}', 'format' = 'csv')"
    ]
    inserts, outputs = [], []
    for output in workload.outputs:
        sink = f"{workload.name}{output.suffix}_sink"
        directory = work / "flink-out" / f"{workload.name}{output.suffix}"
        statements.append(
            f"CREATE TABLE {sink} ({output.flink_columns}) WITH ('connector' = 'filesystem', "
            f"'path' = '{directory}', 'format' = 'csv')"
        )
        inserts.append(f"INSERT INTO {sink} " + output.flink_select.format(src=src))
        outputs.append(str(directory))
    return FlinkJob(workload.name, statements, inserts, outputs)


def flink_results(
    database_url: str, workload: Workload, outcome: FlinkOutcome, work: Path
) -> Measured:
    runs = outcome.of(workload.name)
    best = min(runs, key=lambda run: run.wall_s)
    measured = Measured(
        workload.data.rows,
        best.wall_s,
        extra={
            "flink_net_s": round(best.net_s, 3),
            "flink_first_run_s": round(runs[0].wall_s, 3),
            "flink_runs_s": [round(run.wall_s, 2) for run in runs],
        },
    )
    for output in workload.outputs:
        table = f"flink_{workload.name}{output.suffix}"
        directory = work / "flink-out" / f"{workload.name}{output.suffix}"
        copy_output(database_url, directory, table, output.columns)
        measured.checks[output.suffix] = _check(database_url, workload, output, table)
    return measured


# ---- Strata --------------------------------------------------------------------------------


def strata_pass(server: Server, workload: Workload, raw: str, threads: int) -> Timing:
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
        create_stream(client, workload.raw.format(raw=raw))
        for output in workload.outputs:
            create_stream(client, output.strata.format(raw=raw))
    return post_runs(server, workload.data, threads, "async", raw)


def strata_results(
    server: Server, workload: Workload, threads: int, settle: float
) -> tuple[Measured, Timing]:
    warm = strata_pass(server, workload, f"{workload.name}_warm", threads)
    time.sleep(settle)
    timing = strata_pass(server, workload, workload.name, threads)
    measured = Measured(
        workload.data.rows,
        timing.seconds,
        extra={
            "strata_first_run_s": round(warm.seconds, 3),
            "strata_accepted_s": round(timing.extra["accepted_s"], 3),
        },
    )
    for output in workload.outputs:
        view = f"{workload.name}{output.suffix}"
        measured.checks[output.suffix] = _check(server.database_url, workload, output, view)
    return measured, timing


def _check(
    database_url: str, workload: Workload, output: Output, table: str
) -> tuple[int, int, int, int]:
    statement = output.check.format(plain=workload.plain, output=table)
    with psycopg.connect(database_url, autocommit=True) as conn:
        lost, over, wrong, groups = (int(v) for v in fetch_one(conn, statement))
    return lost, over, wrong, groups


# ---- Nexmark -------------------------------------------------------------------------------


def nexmark_queries(size: Scale) -> list[Query]:
    """The queries Flink can write to a file (bench.harness.nexmark_flink), of the scale's."""
    wanted = size.nexmark.queries or tuple(FLINK_QUERIES)
    return [q for q in QUERIES if q.name in FLINK_QUERIES and q.name in wanted]


def nexmark_runs(auctions: Auctions, streams: tuple[str, ...]) -> tuple[Dataset, list[str]]:
    """The runs of ``streams``, in arrival order, and the stream of each."""
    mine = [run for run in auctions.runs if run.stream in streams]
    late = [n for n, run in enumerate(mine) if run.late]
    return Dataset([r.body for r in mine], [r.rows for r in mine], late), [r.stream for r in mine]


def nexmark_jobs(auctions: Auctions, queries: list[Query], work: Path) -> list[FlinkJob]:
    """A Flink job per query: its inputs (one CSV file a stream, the runs in arrival order),
    its text, its sink made by CREATE TABLE ... AS SELECT (the query's own columns)."""
    files = {stream: work / f"nexmark_{stream}.csv" for stream in NEXMARK_STREAMS}
    for stream, path in files.items():
        flink_csv([run.body for run in auctions.runs if run.stream == stream], path)
    side = work / "nexmark_side_input.csv"
    side.write_bytes(side_input_csv())
    # An empty field is NULL, as PostgreSQL's COPY (and Strata) read it.
    csv = "'format' = 'csv', 'csv.null-literal' = ''"
    jobs = []
    for query in queries:
        statements = [
            f"CREATE TABLE {stream} ({source_columns(stream)}) WITH ("
            f"'connector' = 'filesystem', 'path' = '{files[stream]}', {csv})"
            for stream in query.inputs
        ]
        if "side_input" in FLINK_QUERIES[query.name]:
            statements.append(
                "CREATE TABLE side_input (`key` BIGINT, `value` STRING) WITH ("
                f"'connector' = 'filesystem', 'path' = '{side}', {csv})"
            )
        directory = work / "flink-out" / f"nexmark_{query.name}"
        sink = f"{query.name}_sink"
        ctas = (
            f"CREATE TABLE {sink} WITH ('connector' = 'filesystem', 'path' = '{directory}', "
            f"{csv}) AS {FLINK_QUERIES[query.name]}"
        )
        jobs.append(
            FlinkJob(
                f"nexmark_{query.name}",
                statements,
                [ctas],
                [str(directory)],
                reset=[f"DROP TABLE IF EXISTS {sink}"],
            )
        )
    return jobs


def nexmark_flink(
    database_url: str, query: Query, outcome: FlinkOutcome, work: Path
) -> tuple[float, float, nexmark_bench.Accuracy]:
    """Flink's fastest run of ``query`` (wall and net seconds), and its rows (the last run's)
    against the batch."""
    last = min(outcome.of(f"nexmark_{query.name}"), key=lambda run: run.wall_s)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {nexmark_bench.BATCH}, public")  # type: ignore[arg-type]
        cursor = conn.execute(f"SELECT * FROM ({query.batch}) b LIMIT 0")  # type: ignore[arg-type]
        width = len(cursor.description or ())
    names = ", ".join(f"c{k}" for k in range(width))  # the batch's types, unique names
    table = f"public.flink_{query.name}"
    copy_output(
        database_url,
        work / "flink-out" / f"nexmark_{query.name}",
        table,
        f"AS SELECT * FROM ({query.batch}) b({names}) WITH NO DATA",
        search_path=f"{nexmark_bench.BATCH}, public",
    )
    return last.wall_s, last.net_s, nexmark_bench.accuracy(database_url, query, table)


def nexmark_strata(
    server: Server, auctions: Auctions, query: Query, threads: int
) -> tuple[Timing, nexmark_bench.Accuracy]:
    """The query alone in Strata: its input streams and its streams created, the inputs' runs
    posted by ``threads`` clients without waiting until all are committed, the view
    checked, everything dropped again."""
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
        for stream in query.inputs:
            create_stream(client, create_statement(stream))
        for statement in query.streams:
            create_stream(client, statement)
        data, streams = nexmark_runs(auctions, query.inputs)
        timing = post_runs(server, data, threads, "async", streams)
        timing.name = f"Strata nexmark {query.name}"
        checked = nexmark_bench.accuracy(server.database_url, query, f"public.{query.name}")
        for name in (query.name, *reversed(query.inputs)):
            response = client.delete(f"/streams/{name}")
            if response.status_code != 200:
                raise BenchError(f"dropping {name}: {response.status_code} {response.text}")
    return timing, checked


# ---- the benchmark ---------------------------------------------------------------------------


def run(
    scale: str = "full",
    *,
    names: tuple[str, ...] = WORKLOADS,
    threads: int = 4,
    keep: bool = False,
) -> dict[str, Any]:
    """The comparison at ``scale`` of the workloads ``names``; returns the figures, with
    ``problems`` listing what was wrong (empty when all is right)."""
    size = SCALES[check_scale(scale)]
    started = time.monotonic()
    chosen = workloads(size, names)
    auctions, queries = None, []
    if "nexmark" in names:
        n = size.nexmark
        auctions = generate_auctions(
            n.events, n.run_events, nexmark_bench.SEED, late=0.2, span_ms=n.span_hours * HOUR_MS
        )
        queries = nexmark_queries(size)
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            "; ".join(f"{w.name}: {w.data.size / 1e6:.1f} MB" for w in chosen),
        )
    ]
    work = Path(tempfile.mkdtemp(prefix="strata-flink-"))
    server: Server | None = None
    problems: list[str] = []
    results: dict[str, Any] = {
        "scale": scale,
        "cpus": os.cpu_count(),
        "workloads": {},
        "nexmark": {},
    }
    failed = True
    try:
        server = start_server(work)
        timings += start_timings(server, server.database_url)
        url = server.database_url
        for plain, workload in {w.plain: w for w in chosen}.items():
            copy = copy_baseline(url, workload.data, plain, workload.columns)
            copy.name = f"COPY {plain}"
            timings.append(copy)
        if auctions is not None:
            nexmark_bench.load_batch_tables(url, auctions)
        results["load_average_before"] = os.getloadavg()[0]

        phase = time.monotonic()
        jobs = [flink_job(w, work) for w in chosen]
        if auctions is not None:
            jobs += nexmark_jobs(auctions, queries, work)
        for job in jobs:
            job.runs = FLINK_RUNS[scale]
        outcome = run_flink(jobs, work)
        timings.append(
            Timing(
                "Flink (every job)",
                0,
                time.monotonic() - phase,
                f"one JVM, {FLINK_RUNS[scale]} runs a job",
            )
        )
        flink = {}
        for workload in chosen:
            flink[workload.name] = flink_results(url, workload, outcome, work)
            timings.append(
                Timing(f"Flink {workload.name}", workload.data.rows, flink[workload.name].seconds)
            )
        strata = {}
        for workload in chosen:
            strata[workload.name], timing = strata_results(
                server, workload, threads, SETTLE_S[scale]
            )
            timing.name = f"Strata {workload.name}"
            timings.append(timing)
        if auctions is not None:
            results["nexmark"] = nexmark_figures(
                server, auctions, queries, outcome, work, threads, timings, problems
            )
        results["load_average_after"] = os.getloadavg()[0]

        for workload in chosen:
            ours, theirs = strata[workload.name], flink[workload.name]
            for suffix, (lost, over, wrong, _groups) in ours.checks.items():
                if lost or over or wrong:
                    problems.append(
                        f"Strata {workload.name}{suffix}: {lost} rows missing, {over} "
                        f"over-counted, {wrong} windows wrong"
                    )
            for suffix, (_lost, over, _wrong, _groups) in theirs.checks.items():
                if over:
                    problems.append(f"Flink {workload.name}{suffix}: {over} rows over-counted")
            results["workloads"][workload.name] = {
                "title": workload.title,
                "rows": workload.data.rows,
                "runs": len(workload.data.bodies),
                "strata_rows_per_s": round(ours.rows_per_s),
                "flink_rows_per_s": round(theirs.rows_per_s),
                "ratio": round(ours.rows_per_s / theirs.rows_per_s, 3),
                "strata_seconds": round(ours.seconds, 3),
                "flink_seconds": round(theirs.seconds, 3),
                "strata_missing": ours.missing,
                "flink_missing": theirs.missing,
                "strata_checks": ours.checks,
                "flink_checks": theirs.checks,
                **ours.extra,
                **theirs.extra,
            }
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        results["problems"] = problems
        results["seconds"] = round(time.monotonic() - started, 1)
        print_table(timings, phase_width=26)
        print_report(results)
        failed = bool(problems)
    finally:
        clean_up(server, work, failed=failed, keep=keep)
    return results


def nexmark_figures(
    server: Server,
    auctions: Auctions,
    queries: list[Query],
    outcome: FlinkOutcome,
    work: Path,
    threads: int,
    timings: list[Timing],
    problems: list[str],
) -> dict[str, dict[str, Any]]:
    """Each query in Flink (its warm run, already done) and in Strata, checked."""
    found: dict[str, dict[str, Any]] = {}
    for query in queries:
        data, _ = nexmark_runs(auctions, query.inputs)
        entry: dict[str, Any] = {"inputs": list(query.inputs), "events": data.rows}
        if query.name in NOTES:
            entry["flink_note"] = NOTES[query.name]
        try:
            wall, net, theirs = nexmark_flink(server.database_url, query, outcome, work)
        except BenchError as error:  # a query Flink refuses is a finding, not a crash
            entry["flink_error"] = str(error)[:300]
        else:
            timings.append(Timing(f"Flink nexmark {query.name}", data.rows, wall))
            entry |= {
                "flink_events_per_s": round(data.rows / wall),
                "flink_seconds": round(wall, 3),
                "flink_net_s": round(net, 3),
                "flink": vars(theirs),
            }
        timing, ours = nexmark_strata(server, auctions, query, threads)
        timings.append(timing)
        entry |= {
            "strata_events_per_s": round(timing.rows_per_s),
            "strata_seconds": round(timing.seconds, 3),
            "strata": vars(ours),
        }
        if ours.rows_lost or ours.rows_over_produced:
            problems.append(f"Strata nexmark {query.name}: {ours}")
        found[query.name] = entry
    return found


def print_report(results: dict[str, Any]) -> None:
    print(
        f"\n{'workload':<22} {'Strata rows/s':>14} {'Flink rows/s':>13} {'ratio':>6}  "
        f"{'Strata missing':>14} {'Flink missing':>18}  Flink net / first run"
    )
    for name, f in results["workloads"].items():
        lost = f["flink_missing"]
        share = f"{lost:,} ({lost / f['rows']:.1%})"
        print(
            f"{name:<22} {f['strata_rows_per_s']:>14,} {f['flink_rows_per_s']:>13,} "
            f"{f['ratio']:>6.2f}  {f['strata_missing']:>14,} "
            f"{share:>18}  "
            f"{f['flink_net_s']:.2f}s / {f['flink_first_run_s']:.2f}s"
        )
    if results["nexmark"]:
        print(
            f"\n{'Nexmark':<8} {'events':>7} {'Strata ev/s':>12} {'Flink ev/s':>11} "
            f"{'Strata lost':>12} {'Flink lost / over':>18} {'batch rows':>11}"
        )
    for name, f in results["nexmark"].items():
        theirs = f.get("flink")
        flink = f"{f['flink_events_per_s']:>11,}" if theirs else f"{'-':>11}"
        lost = f"{theirs['rows_lost']:,} / {theirs['rows_over_produced']:,}" if theirs else "-"
        print(
            f"{name:<8} {f['events']:>7,} {f['strata_events_per_s']:>12,} {flink} "
            f"{f['strata']['rows_lost']:>12,} {lost:>18} {f['strata']['batch_rows']:>11,}"
            + (f"  Flink: {f['flink_error']}" if "flink_error" in f else "")
        )
    print(
        f"\n{results['cpus']} CPUs; load average (1 min) {results['load_average_before']:.2f} "
        f"before, {results['load_average_after']:.2f} after; {results['seconds']}s in all"
    )
    if results["problems"]:
        print("\nWRONG:\n  " + "\n  ".join(results["problems"]), file=sys.stderr)
    print(json.dumps(results))


def figures(results: dict[str, Any]) -> list[Result]:
    """The figures of ``run`` for bench/run.py: Strata against Flink, same run."""
    out = []
    for f in results["workloads"].values():
        context = {
            "rows": f["rows"],
            "runs": f["runs"],
            "strata_seconds": f["strata_seconds"],
            "flink_seconds": f["flink_seconds"],
            "flink_net_s": f["flink_net_s"],
            "strata_rows_missing": f["strata_missing"],
            "flink_rows_missing": f["flink_missing"],
        }
        out.append(
            Result(
                f"throughput, warm ({f['title']})",
                f["strata_rows_per_s"],
                f["flink_rows_per_s"],
                PEER,
                "rows/s",
                "higher",
                context=context,
            )
        )
        out.append(  # the same against the job alone: no planning, no mini-cluster start
            Result(
                f"throughput against Flink's net job runtime ({f['title']})",
                f["strata_rows_per_s"],
                round(f["rows"] / f["flink_net_s"]),
                f"{PEER} (net runtime of its fastest job)",
                "rows/s",
                "higher",
                context=context,
            )
        )
        out.append(
            Result(
                f"rows missing from the results ({f['title']})",
                f["strata_missing"],
                f["flink_missing"],
                PEER,
                "rows",
                "lower",
                context=context,
            )
        )
    for name, f in results["nexmark"].items():
        theirs = f.get("flink")
        if not theirs:
            continue
        context = {
            "events": f["events"],
            "strata_seconds": f["strata_seconds"],
            "flink_seconds": f["flink_seconds"],
            "flink_net_s": f["flink_net_s"],
            "batch_rows": theirs["batch_rows"],
        }
        what = f"Nexmark {name}, {f['events']:,} events, 20% of the runs 1-6 h late"
        out.append(
            Result(
                f"{what}: throughput, warm",
                f["strata_events_per_s"],
                f["flink_events_per_s"],
                PEER,
                "events/s",
                "higher",
                notes=f.get("flink_note", ""),
                context=context,
            )
        )
        out.append(
            Result(
                f"{what}: result rows missing",
                f["strata"]["rows_lost"],
                theirs["rows_lost"],
                PEER,
                "rows",
                "lower",
                context=context | {"flink_rows_over_produced": theirs["rows_over_produced"]},
            )
        )
    return out


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    results = run(scale)
    if results["problems"]:
        raise BenchError("; ".join(results["problems"]))
    return figures(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", choices=sorted(SCALES), default="full", help="(full)")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, help="these workloads only")
    parser.add_argument("--threads", type=int, default=4, help="Strata's client threads (4)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (server log, Flink's files)"
    )
    args = parser.parse_args(argv)
    names = tuple(args.only) if args.only else WORKLOADS
    try:
        results = run(args.scale, names=names, threads=args.threads, keep=args.keep)
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
