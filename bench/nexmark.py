"""Nexmark: each of the 24 queries alone, Strata against Spark Structured Streaming where
Spark can run the query, on the same late runs.

    python -m bench.nexmark [--scale full|smoke] [--threads 4] [--keep] [--only q0 q5 ...]
    python -m bench.nexmark --texts   # which of Nexmark's own texts run as written

The workload is bench.harness.nexmark_streams': person, auction and bid events in
Nexmark's proportions, in runs of which 20% arrive 1 to 6 hours late and every arrival is
jittered by up to 30 minutes. For each query (bench.harness.nexmark_queries):

1. Strata (``strata up``, a real subprocess on a temporary data dir): the raw streams the
   query reads and the query's streams are created; ``threads`` clients post the runs of
   those streams in arrival order (``wait=true``); the clock stops when every run is
   committed. Events/s = the input events over those seconds. Then the view is compared
   with the batch query over every input row (plain tables COPYed from the same runs, in
   the schema ``nexmark_batch``): rows lost = rows of the batch result not in the view,
   rows over-produced = rows of the view not in the batch result (multisets, every
   column). The whole view is read, and the batch query run, three times each after an
   untimed read (median milliseconds): what a reader pays, against computing the result
   from scratch. The streams are then dropped, for the next query. Then the same for
   the Nexmark project's own text of the query (bench/nexmark_queries/, as written: its
   sources from ddl_strata.sql, the runs with Nexmark's column names), its view checked
   against the batch query over the raw rows received (bench.harness.nexmark_texts.compared).
2. Spark Structured Streaming, for the queries it can run (``SPARK``: projections, the
   stream-stream and stream-static joins, the windowed and per-day aggregates), in this
   process (local[*]): the run files of the input streams, in arrival order, ``threads``
   per micro-batch, a 1-hour watermark on every input's ``date_time``, a ``foreachBatch``
   sink COPYing into PostgreSQL (appended for rows; upserted on the group keys in update
   mode for aggregates). Rows lost as for Strata; for aggregates, rows lost = the input
   rows the batch counts in a group minus those Spark counted (``count_column``), since
   Spark's ``avg`` is a double where PostgreSQL's is exact.
   Spark runs neither ranks over a stream (q5, q7, q9, q18, q19), nor an aggregate over an
   aggregate (q4, q6), nor ``count(DISTINCT)`` (q15, q16) in streaming queries; the table
   says "-" for those, and for q8 and q11, whose window join and session window Spark
   supports only in forms that emit a window once the watermark passes it.

Exits non-zero when Strata loses or over-produces any row. The scale ``smoke`` runs four
queries on little data and proves only that everything works.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from pyspark.sql import SparkSession
from pyspark.sql import types as T  # noqa: N812 - Spark's own convention

from bench.harness import nexmark_texts
from bench.harness.api import create_stream, post_runs
from bench.harness.data import HOUR_MS, Dataset
from bench.harness.database import fetch_one, measure
from bench.harness.errors import BenchError
from bench.harness.nexmark_queries import QUERIES, SIDE_INPUT, Query, side_input_statements
from bench.harness.nexmark_streams import (
    COLUMNS,
    STREAMS,
    Workload,
    create_statement,
    generate,
)
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import Server, clean_up, start_timings, stop_problems, stop_server
from bench.harness.sss import PostgresSink, SparkJob, start_server_and_spark
from server.engines.spark import stop_spark_session

SPARK = "Spark Structured Streaming"
SEED = 2025
BATCH = "nexmark_batch"  # the schema of the plain tables the batch queries read
WATERMARK = "1 hour"
_SPARK_TYPES = {
    "bigint": T.LongType(),
    "text": T.StringType(),
    "timestamptz": T.TimestampType(),
}
_RANKS = (
    "count(*) AS total_bids, count_if(price < 10000) AS rank1_bids, "
    "count_if(price >= 10000 AND price < 1000000) AS rank2_bids, "
    "count_if(price >= 1000000) AS rank3_bids"
)


@dataclass(frozen=True)
class SparkQuery:
    """A query as a Spark user writes it over the streaming inputs (temporary views named
    person, auction, bid, and the static side_input): its SQL, and for an aggregate the
    group keys (upserted on, update mode) and the column that counts input rows."""

    sql: str
    keys: tuple[str, ...] = ()
    count_column: str = ""


SPARK_QUERIES: dict[str, SparkQuery] = {
    "q0": SparkQuery("SELECT auction, bidder, price, date_time, extra FROM bid"),
    "q1": SparkQuery("SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"),
    "q2": SparkQuery("SELECT auction, price FROM bid WHERE auction % 123 = 0"),
    "q3": SparkQuery(
        "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p "
        "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')"
    ),
    "q10": SparkQuery(
        "SELECT auction, bidder, price, date_time, extra, date_format(date_time, "
        "'yyyy-MM-dd') AS dt, date_format(date_time, 'HH:mm') AS hm FROM bid"
    ),
    "q12": SparkQuery(
        "SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS "
        "endtime FROM bid GROUP BY bidder, window(date_time, '10 seconds')",
        keys=("bidder", "starttime"),
        count_column="bid_count",
    ),
    "q13": SparkQuery(
        "SELECT b.auction, b.bidder, b.price, b.date_time, s.value FROM bid b "
        f"JOIN {SIDE_INPUT} s ON b.auction % 10000 = s.key"
    ),
    "q14": SparkQuery(
        "SELECT auction, bidder, 0.908 * price AS price, CASE WHEN hour(date_time) "
        "BETWEEN 8 AND 18 THEN 'dayTime' WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 "
        "THEN 'nightTime' ELSE 'otherTime' END AS bid_time_type, date_time, extra, "
        "length(extra) - length(replace(extra, 'c', '')) AS c_counts FROM bid "
        "WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"
    ),
    "q17": SparkQuery(
        f"SELECT auction, date_format(date_time, 'yyyy-MM-dd') AS day, {_RANKS}, "
        "min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, "
        "sum(price) AS sum_price FROM bid GROUP BY auction, date_format(date_time, "
        "'yyyy-MM-dd')",
        keys=("auction", "day"),
        count_column="total_bids",
    ),
    "q20": SparkQuery(
        "SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time AS "
        "bid_date_time, b.extra AS bid_extra, a.item_name, a.description, a.initial_bid, "
        "a.reserve, a.date_time AS auction_date_time, a.expires, a.seller, a.category, "
        "a.extra AS auction_extra FROM bid b JOIN auction a ON b.auction = a.id "
        "WHERE a.category = 10"
    ),
    "q21": SparkQuery(
        "SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN "
        "'0' WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN "
        "'2' WHEN lower(channel) = 'baidu' THEN '3' ELSE regexp_extract(url, "
        "'[?&]channel_id=([^&]*)', 1) END AS channel_id FROM bid WHERE regexp_extract(url, "
        "'[?&]channel_id=([^&]*)', 1) != '' OR lower(channel) IN ('apple', 'google', "
        "'facebook', 'baidu')"
    ),
    "q22": SparkQuery(
        "SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, "
        "split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3 FROM bid"
    ),
    "q23": SparkQuery(
        "SELECT b.bidder, b.price, b.channel, b.url, b.extra AS bid_extra, p.id AS "
        "person_id, p.name, p.email_address, p.credit_card, p.city, p.state, p.extra AS "
        "person_extra, a.item_name, a.description, a.initial_bid, a.reserve, a.date_time AS "
        "auction_date_time, a.expires, a.seller, a.category, a.extra AS auction_extra "
        "FROM bid b JOIN person p ON p.id = b.bidder JOIN auction a ON a.seller = b.bidder"
    ),
}


@dataclass(frozen=True)
class Scale:
    events: int
    run_events: int  # events per slice: a run of each stream
    span_hours: int
    queries: tuple[str, ...]  # all when empty


SCALES = {
    "full": Scale(40_000, 4_000, 6, ()),
    "smoke": Scale(1_000, 250, 2, ("q0", "q4", "q12", "q20")),
}


@dataclass(frozen=True)
class Accuracy:
    rows_lost: int
    rows_over_produced: int
    batch_rows: int


def _runs_of(workload: Workload, streams: tuple[str, ...]) -> tuple[Dataset, list[str]]:
    """The runs of ``streams``, in arrival order, and the stream of each."""
    mine = [run for run in workload.runs if run.stream in streams]
    late = [n for n, run in enumerate(mine) if run.late]
    return Dataset([r.body for r in mine], [r.rows for r in mine], late), [r.stream for r in mine]


def load_batch_tables(database_url: str, workload: Workload) -> None:
    """Every run into plain tables in the schema BATCH, and the side input in public."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {BATCH} CASCADE")  # type: ignore[arg-type]
        conn.execute(f"CREATE SCHEMA {BATCH}")  # type: ignore[arg-type]
        for statement in side_input_statements():
            conn.execute(statement)  # type: ignore[arg-type]
        with conn.cursor() as cursor:
            for stream in STREAMS:
                columns = ", ".join(f"{n} {k}" for n, k in COLUMNS[stream])
                cursor.execute(f"CREATE TABLE {BATCH}.{stream} ({columns})")  # type: ignore[arg-type]
            for run in workload.runs:
                statement = f"COPY {BATCH}.{run.stream} FROM STDIN (FORMAT csv, HEADER true)"
                with cursor.copy(statement) as copy:  # type: ignore[arg-type]
                    copy.write(run.body)


def accuracy(database_url: str, query: Query, result: str) -> Accuracy:
    """``result`` (a view or table of the query's columns) against the batch query over
    the plain tables, as multisets of rows."""
    return _compare(database_url, f"SELECT * FROM {result}", query.batch, f"{BATCH}, public")


def _compare(database_url: str, rows: str, batch: str, search_path: str) -> Accuracy:
    """The rows of query ``rows`` against those of ``batch``, as multisets: the batch's
    rows missing, the rows beyond the batch's, the batch's rows."""
    check = (
        f"SELECT (SELECT count(*) FROM (({batch}) EXCEPT ALL ({rows})) l), "
        f"(SELECT count(*) FROM (({rows}) EXCEPT ALL ({batch})) o), "
        f"(SELECT count(*) FROM ({batch}) b)"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {search_path}")  # type: ignore[arg-type]
        return Accuracy(*(int(v) for v in fetch_one(conn, check)))


def counted_accuracy(
    database_url: str, query: Query, spark: SparkQuery, result: str, columns: list[str]
) -> Accuracy:
    """For an aggregate: the input rows the batch counts in each group that ``result``
    (of ``columns``, the batch's in order) does not (groups missing count whole), and
    those it counts beyond the batch."""
    keys = " AND ".join(f"b.{k} = r.{k}" for k in spark.keys)
    count = spark.count_column
    check = (
        f"SELECT coalesce(sum(greatest(b.{count} - coalesce(r.{count}, 0), 0)), 0), "
        f"coalesce(sum(greatest(coalesce(r.{count}, 0) - b.{count}, 0)), 0), count(*) "
        f"FROM ({query.batch}) b({', '.join(columns)}) LEFT JOIN {result} r ON {keys}"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {BATCH}, public")  # type: ignore[arg-type]
        return Accuracy(*(int(v) for v in fetch_one(conn, check)))


# ---- Strata ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reads:
    """Median milliseconds to read the whole result: the view, and the batch query over
    the plain tables (the same rows, computed from scratch), in the same run."""

    view_ms: float
    batch_ms: float


def read_times(database_url: str, query: Query, repeat: int = 3) -> Reads:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {BATCH}, public")  # type: ignore[arg-type]
        view = measure(conn, f"SELECT * FROM public.{query.name}", repeat)
        batch = measure(conn, query.batch, repeat)
    return Reads(round(view.median_ms, 2), round(batch.median_ms, 2))


def strata_query(
    server: Server, workload: Workload, query: Query, threads: int
) -> tuple[Timing, Accuracy, Reads]:
    """The query alone: its input streams and its streams created, the inputs' runs
    posted, the view checked and read, everything dropped again."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for stream in query.inputs:
            create_stream(client, create_statement(stream))
        for statement in query.streams:
            create_stream(client, statement)
        data, streams = _runs_of(workload, query.inputs)
        timing = post_runs(server, data, threads, "wait", streams)
        timing.name = f"Strata {query.name}"
        checked = accuracy(server.database_url, query, f"public.{query.name}")
        reads = read_times(server.database_url, query)
        for name in (query.name, *reversed(query.inputs)):
            response = client.delete(f"/streams/{name}")
            if response.status_code != 200:
                raise BenchError(f"dropping {name}: {response.status_code} {response.text}")
    return timing, checked, reads


def strata_text(
    server: Server, workload: Workload, query: Query, threads: int
) -> tuple[Timing, Accuracy]:
    """The Nexmark project's own text of the query (bench/nexmark_queries/), as written:
    its sources (ddl_strata.sql), side input and functions, its streams, the same runs
    (with Nexmark's column names) posted, its view checked against the batch query over
    the raw rows received (nexmark_texts.compared), everything dropped again."""
    text = nexmark_texts.read(query.name)
    if text.refused is not None:
        raise BenchError(f"{query.name}'s text is refused: {text.refused}")
    sources = {s.split()[2]: s for s in nexmark_texts.source_statements()}
    with psycopg.connect(server.database_url, autocommit=True) as conn:
        for statement in text.tables:
            name = nexmark_texts.TABLE.match(statement).group(1)  # type: ignore[union-attr]
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name.lower())))
            conn.execute(statement)  # type: ignore[arg-type]
            conn.execute(nexmark_texts.side_input_rows())  # type: ignore[arg-type]
        for statement in text.functions:
            conn.execute(statement)  # type: ignore[arg-type]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for stream in query.inputs:
            create_stream(client, sources[stream])
        for statement in text.streams:
            create_stream(client, statement)
        data, streams = _runs_of(workload, query.inputs)
        data = replace(data, bodies=[nexmark_texts.flink_header(b) for b in data.bodies])
        timing = post_runs(server, data, threads, "wait", streams)
        timing.name = f"Strata {query.name} as written"
        view, batch = nexmark_texts.compared(query.name)
        checked = _compare(server.database_url, view, batch, "public")
        made = [s.split()[2].lower() for s in text.streams]  # unquoted names fold
        for name in (*reversed(made), *reversed(query.inputs)):
            response = client.delete(f"/streams/{name}")
            if response.status_code != 200:
                raise BenchError(f"dropping {name}: {response.status_code} {response.text}")
    return timing, checked


# ---- Spark Structured Streaming -------------------------------------------------------------


def spark_query(
    spark: SparkSession,
    database_url: str,
    workload: Workload,
    query: Query,
    work: Path,
    threads: int,
) -> tuple[Timing, Accuracy, dict[str, int]]:
    """The query as a Spark streaming query over the input streams' run files."""
    wanted = SPARK_QUERIES[query.name]
    sources = {stream: work / f"{query.name}-{stream}" for stream in query.inputs}
    staging = work / f"{query.name}-staging"
    for directory in (*sources.values(), staging):
        directory.mkdir(parents=True)
    for stream, directory in sources.items():
        schema = T.StructType([T.StructField(n, _SPARK_TYPES[k]) for n, k in COLUMNS[stream]])
        frame = (
            spark.readStream.schema(schema)
            .option("header", True)
            .csv(str(directory))
            .withWatermark("date_time", WATERMARK)
        )
        frame.createOrReplaceTempView(stream)
    if SIDE_INPUT in wanted.sql:
        spark.createDataFrame(
            [(k, f"value-{k}") for k in range(10_000)], "key bigint, value string"
        ).createOrReplaceTempView(SIDE_INPUT)
    table = f"sss_{query.name}"
    frame = spark.sql(wanted.sql)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {BATCH}, public")  # type: ignore[arg-type]
        conn.execute(f"DROP TABLE IF EXISTS public.{table}")  # type: ignore[arg-type]
        conn.execute(  # the batch result's types, under Spark's names
            f"CREATE TABLE public.{table} AS SELECT * FROM ({query.batch}) "  # type: ignore[arg-type]
            f"b({', '.join(frame.columns)}) WITH NO DATA"
        )
        if wanted.keys:
            conn.execute(f"ALTER TABLE public.{table} ADD PRIMARY KEY ({', '.join(wanted.keys)})")  # type: ignore[arg-type]
    sink = PostgresSink(database_url, table, frame.columns, wanted.keys)
    streaming = (
        frame.writeStream.queryName(table)
        .outputMode("update" if wanted.keys else "append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoints" / table))
        .trigger(processingTime="0 seconds")
        .start()
    )
    job = SparkJob([streaming], [sink])
    data, streams = _runs_of(workload, query.inputs)
    try:
        job.wait()
        started = time.monotonic()
        for first in range(0, len(data.bodies), threads):
            for index in range(first, min(first + threads, len(data.bodies))):
                name = f"run-{index:05d}.csv"
                (staging / name).write_bytes(data.bodies[index])
                os.rename(staging / name, sources[streams[index]] / name)
            job.wait()
        seconds = time.monotonic() - started
        progress = job.progress()
    finally:
        job.stop()
    checked = (
        counted_accuracy(database_url, query, wanted, f"public.{table}", frame.columns)
        if wanted.keys
        else accuracy(database_url, query, f"public.{table}")
    )
    notes = f"watermark {WATERMARK}, {progress['state_rows_dropped']:,} rows dropped as late"
    return Timing(f"Spark SSS {query.name}", data.rows, seconds, notes), checked, progress


# ---- The run ---------------------------------------------------------------------------------


def run(
    scale: str = "full",
    *,
    threads: int = 4,
    keep: bool = False,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every query (or ``only`` these) at ``scale``; the figures, with ``problems``."""
    size = SCALES[check_scale(scale)]
    started = time.monotonic()
    workload = generate(
        size.events, size.run_events, SEED, late=0.2, span_ms=size.span_hours * HOUR_MS
    )
    chosen = [q for q in QUERIES if q.name in (only or size.queries or [q.name])]
    late_events = sum(run.rows for run in workload.runs if run.late)
    timings = [Timing("generate", workload.events, time.monotonic() - started)]
    work = Path(tempfile.mkdtemp(prefix="strata-nexmark-"))
    server: Server | None = None
    spark: SparkSession | None = None
    problems: list[str] = []
    per_query: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {
        "scale": scale,
        "events": workload.events,
        "late_events": late_events,
        "runs": len(workload.runs),
        "span_hours": size.span_hours,
        "cpus": os.cpu_count(),
        "queries": per_query,
    }
    failed = True
    try:
        server, spark, spark_seconds = start_server_and_spark(work, "nexmark-sss")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        timings.append(Timing("Spark session", 0, spark_seconds))
        timings += start_timings(server, server.database_url)
        load_batch_tables(server.database_url, workload)
        for query in chosen:
            entry: dict[str, Any] = {"inputs": list(query.inputs)}
            timing, exact, reads = strata_query(server, workload, query, threads)
            timings.append(timing)
            entry |= {
                "events": timing.rows,
                "strata_events_per_s": round(timing.rows_per_s),
                "strata": vars(exact),
                "read_view_ms": reads.view_ms,
                "read_batch_ms": reads.batch_ms,
            }
            if exact.rows_lost or exact.rows_over_produced:
                problems.append(f"Strata {query.name}: {exact}")
            text_timing, text_exact = strata_text(server, workload, query, threads)
            timings.append(text_timing)
            entry |= {
                "text_events_per_s": round(text_timing.rows_per_s),
                "text": vars(text_exact),
            }
            if text_exact.rows_lost or text_exact.rows_over_produced:
                problems.append(f"Strata {query.name} as written: {text_exact}")
            if query.name in SPARK_QUERIES:
                try:
                    sss_timing, sss, progress = spark_query(
                        spark, server.database_url, workload, query, work, threads
                    )
                except Exception as error:  # a query Spark refuses is a finding, not a crash
                    entry["sss_error"] = str(error).splitlines()[0][:300]
                else:
                    timings.append(sss_timing)
                    entry |= {
                        "sss_events_per_s": round(sss_timing.rows_per_s),
                        "sss": vars(sss),
                        "sss_progress": progress,
                    }
                    if sss.rows_over_produced:
                        problems.append(f"Spark {query.name} over-produced: {sss}")
            per_query[query.name] = entry
        stop_spark_session(spark)
        spark = None
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        results["problems"] = problems
        results["seconds"] = round(time.monotonic() - started, 1)
        print_table(timings, phase_width=18)
        print_report(results)
        failed = bool(problems)
    finally:
        if spark is not None:
            stop_spark_session(spark)
        clean_up(server, work, failed=failed, keep=keep)
    return results


def print_report(results: dict[str, Any]) -> None:
    """The per-query table, in the Markdown of docs/benchmarks.md."""
    print(
        f"\n{results['events']:,} events in {results['runs']} runs over "
        f"{results['span_hours']} h, {results['late_events']:,} in runs 1-6 h late\n"
    )
    print(
        "| query | Strata events/s | Strata rows lost | as written: events/s, rows lost | "
        "read: view / batch query (ms) | Spark SSS events/s | Spark SSS rows lost (of) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, entry in results["queries"].items():
        lost = entry["strata"]["rows_lost"] + entry["strata"]["rows_over_produced"]
        text = entry["text"]["rows_lost"] + entry["text"]["rows_over_produced"]
        written = f"{entry['text_events_per_s']:,}, {text}"
        sss = entry.get("sss")
        if sss:
            theirs = f"{entry['sss_events_per_s']:,} | {sss['rows_lost']:,} ({sss['batch_rows']:,})"
        else:
            theirs = f"- | {entry.get('sss_error', 'not expressible')}"
        reads = f"{entry['read_view_ms']:,} / {entry['read_batch_ms']:,}"
        print(
            f"| {name} | {entry['strata_events_per_s']:,} | {lost} | {written} | {reads} "
            f"| {theirs} |"
        )
    for problem in results["problems"]:
        print(f"PROBLEM: {problem}")


def figures(results: dict[str, Any]) -> list[Result]:
    """Per query: the Nexmark project's text against Strata's twin of it (events/s); run
    by both engines: events/s and rows lost, Strata against Spark."""
    late = f"{results['late_events'] / results['events']:.0%} of the events 1-6 h late"
    out = []
    for name, entry in results["queries"].items():
        out.append(
            Result(
                f"Nexmark {name} as written in nexmark/nexmark ({late}): events/s",
                entry["text_events_per_s"],
                entry["strata_events_per_s"],
                "Strata's twin of the query (bench/harness/nexmark_queries.py)",
                "events/s",
                "higher",
                context={"events": entry["events"], "text": entry["text"]},
            )
        )
        if "sss" not in entry:
            continue
        out.append(
            Result(
                f"Nexmark {name} ({late}): events/s (Spark watermark {WATERMARK})",
                entry["strata_events_per_s"],
                entry["sss_events_per_s"],
                SPARK,
                "events/s",
                "higher",
                context={"events": entry["events"]},
            )
        )
        out.append(
            Result(
                f"Nexmark {name}: result rows lost (Spark watermark {WATERMARK})",
                entry["strata"]["rows_lost"],
                entry["sss"]["rows_lost"],
                SPARK,
                "rows",
                "lower",
                context={"batch_rows": entry["sss"]["batch_rows"]},
            )
        )
    return out


def print_texts() -> None:
    """Per query, whether Strata takes the Nexmark project's text as written
    (bench.harness.nexmark_texts; tests/test_nexmark_texts.py checks each one it takes
    against its batch twin under late runs)."""
    report = nexmark_texts.report()
    print(f"Nexmark's texts (nexmark/nexmark {nexmark_texts.SOURCE_COMMIT[:7]}), as written:")
    print("| query | runs as written | why not |")
    print("|---|---|---|")
    for query, problem in report.items():
        print(f"| {query} | {'yes' if problem is None else 'no'} | {problem or ''} |")
    taken = sum(1 for problem in report.values() if problem is None)
    print(f"{taken} of {len(report)} run as written")


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
    parser.add_argument("--threads", type=int, default=4, help="clients; files a step (4)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--only", nargs="*", default=(), help="these queries (all)")
    parser.add_argument(
        "--texts",
        action="store_true",
        help="only say which of the Nexmark project's own texts (bench/nexmark_queries/) "
        "Strata takes as written, and why not the others (no server, no data)",
    )
    args = parser.parse_args(argv)
    if args.texts:
        print_texts()
        return 0
    try:
        results = run(args.scale, threads=args.threads, keep=args.keep, only=tuple(args.only))
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
