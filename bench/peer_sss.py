"""Strata against Spark Structured Streaming: the same runs, the same aggregates, into PostgreSQL.

    python -m bench.peer_sss [--scale full|smoke] [--threads 4] [--keep]

The peer is what a competent Spark user would build to get windowed aggregates of files
into PostgreSQL: Spark Structured Streaming (local[*], in this process, the JVM found the
way Strata finds it; bench.harness.sss) reading a directory of CSV run files (the file
source), an event-time watermark, and for each of the two derived streams of the
ad-impression workload (bench.harness.impressions: count and revenue per campaign per
1-minute window; average and maximum price per campaign per 5-minute window) a streaming
aggregation in *update* mode whose ``foreachBatch`` sink COPYs each micro-batch's updated
windows into a staging table and upserts them (``INSERT ... ON CONFLICT DO UPDATE``) into
a PostgreSQL table. Update mode rather than append mode:
append mode writes a window only once the watermark has passed it, so nothing would be
visible until then, and it drops late rows exactly as update mode does. The upsert makes
a replayed micro-batch harmless (each window's row is overwritten with Spark's state).

What it does, in one process tree:

1. generates the ad-impression workload (bench.harness.impressions), profile ``HOURS_LATE``: ad
   impressions over 8 hours of event time in runs (CSV bodies) of ``run_rows`` rows; 20%
   of the rows come in runs that arrive 1 to 6 hours late, and every run's arrival is
   jittered by up to 30 minutes, which shuffles neighbouring runs;
2. starts ``strata up`` as a real subprocess (temporary data dir: embedded PostgreSQL,
   local Spark; bench.harness.server) and, meanwhile, a SparkSession in this process
   (server/engines/spark.py); COPYs the same bodies into a plain table ``impsns_plain``, the
   input of the batch oracle;
3. Spark, once per watermark (10 minutes, 1 hour): the run files, written in arrival
   order (distinct modification times, so Spark takes them in that order), are read
   ``threads`` files per micro-batch (``maxFilesPerTrigger``: as many runs as Strata has
   in flight with ``threads`` clients), trigger ``processingTime = 0``; the clock runs
   from the first file written until both queries have processed every file
   (``processAllAvailable``);
4. Strata, once per watermark (``WITH (event_time = 't', delay = ...)``, which never
   drops rows): ``threads`` clients post the bodies in arrival order with ``wait=true``;
   the clock stops when every run is committed (bench.harness.api's ``post_runs``);
5. rows lost, for each engine and watermark: the 1-minute results in PostgreSQL compared
   window by window with the same aggregate as a batch ``GROUP BY`` over
   ``impsns_plain``: rows lost = the input rows of each window not counted in its result
   (a result higher than the input would count as over-counted). Windows of the 5-minute
   stream whose average or maximum differ from the batch query are counted too;
6. freshness, for runs of 1K and ``large_rows`` rows of on-time data (each run one minute
   of event time), one run at a time, ``gap`` seconds apart: Strata, from the POST of a
   run (``wait=false``) until its rows are counted in the view ``<stream>_1m``; Spark, from
   the file's rename into the source directory until its rows are counted in the
   PostgreSQL table its ``foreachBatch`` writes. Both are observed the same way: a
   ``SELECT sum(c)`` on the PostgreSQL result, repeated every few milliseconds. The first
   ``skip`` runs of each series are not counted. Before it, each engine gets ``warm_up``
   untimed runs of 1,000 rows the same way (a JVM compiles its hot paths over the first
   few micro-batches or jobs).

Every figure is a ratio against Spark measured in the same run; absolute numbers are
printed for context. Prints tables and one JSON line (the dict ``run`` returns). Exits
non-zero when Strata loses, over-counts or mis-aggregates anything, or Spark over-counts.
The scale ``smoke`` finishes in under a minute and proves only that everything works.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
from pyspark.sql import types as T  # noqa: N812

from bench.harness.api import post_runs
from bench.harness.data import HOUR_MS, Dataset
from bench.harness.database import copy_baseline, fetch_one, scalar
from bench.harness.errors import BenchError
from bench.harness.impressions import COLUMNS, PLAIN, create_streams, generate
from bench.harness.lateness import HOURS_LATE, ON_TIME
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, latency_results, print_table
from bench.harness.server import Server, clean_up, start_timings, stop_problems, stop_server
from bench.harness.sss import PostgresSink, SparkJob, start_server_and_spark
from server.engines.spark import stop_spark_session

WATERMARKS = {"10 minutes": "w10m", "1 hour": "w1h"}
SCHEMA = T.StructType(
    [
        T.StructField("campaign", T.StringType()),
        T.StructField("user_id", T.LongType()),
        T.StructField("price", T.DecimalType(12, 4)),
        T.StructField("t", T.TimestampType()),
    ]
)
# The PostgreSQL tables Spark's sinks write: the columns of Strata's views, keyed by window.
SINK_TABLES = {
    "_1m": "campaign text, c bigint, revenue numeric, t timestamptz, PRIMARY KEY (campaign, t)",
    "_5m": "campaign text, avg_price numeric, max_price numeric(12,4), t timestamptz, "
    "PRIMARY KEY (campaign, t)",
}
# Per window of the 1-minute stream: input rows not counted (lost), counted beyond the
# input (over-counted), and windows whose count or revenue differ from the batch query.
CHECK_1M = """
WITH batch AS (
    SELECT campaign, date_bin('1 minute', t, '1970-01-01 00:00:00+00') + interval '1 minute' AS t,
           count(*) AS c, sum(price) AS revenue
    FROM {input} GROUP BY 1, 2)
SELECT coalesce(sum(greatest(coalesce(b.c, 0) - coalesce(o.c, 0), 0)), 0)::bigint,
       coalesce(sum(greatest(coalesce(o.c, 0) - coalesce(b.c, 0), 0)), 0)::bigint,
       count(*) FILTER (WHERE o.c IS DISTINCT FROM b.c OR o.revenue IS DISTINCT FROM b.revenue),
       count(*)
FROM batch b FULL JOIN (SELECT campaign, c, revenue, t FROM {output}) o USING (campaign, t)
"""
# Windows of the 5-minute stream missing, extra or different (Spark's average has 8
# decimals, PostgreSQL's more: equal to within 1e-6).
CHECK_5M = """
WITH batch AS (
    SELECT campaign, date_bin('5 minutes', t, '1970-01-01 00:00:00+00') + interval '5 minutes'
           AS t, avg(price) AS avg_price, max(price) AS max_price
    FROM {input} GROUP BY 1, 2)
SELECT count(*) FILTER (WHERE o.t IS NULL OR b.t IS NULL OR o.max_price <> b.max_price
                        OR abs(o.avg_price - b.avg_price) > 0.000001),
       count(*)
FROM batch b FULL JOIN (SELECT campaign, avg_price, max_price, t FROM {output}) o
     ON (b.campaign, b.t) = (o.campaign, o.t)
"""
POLL_INTERVAL = 0.002
VISIBLE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Scale:
    rows: int  # throughput workload
    run_rows: int
    span_hours: int
    small_runs: int  # freshness: runs of 1,000 rows
    large_runs: int  # freshness: runs of large_rows rows
    large_rows: int
    skip: int  # freshness runs not counted (warm-up)
    gap: float  # seconds between freshness runs
    warm_up: int  # untimed runs of 1,000 rows through each engine's freshness path first


SCALES = {
    "full": Scale(1_000_000, 25_000, 8, 22, 10, 50_000, 2, 0.3, 10),
    "smoke": Scale(8_000, 2_000, 8, 2, 1, 5_000, 0, 0.1, 0),
}
SMALL_ROWS = 1_000
WARM_UP = "untimed runs of 1,000 rows, one at a time, as in the freshness series"


# ---- Spark Structured Streaming ------------------------------------------------------------


def create_sink_tables(database_url: str, prefix: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for suffix, columns in SINK_TABLES.items():
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{suffix}")  # type: ignore[arg-type]
            conn.execute(f"CREATE TABLE {prefix}{suffix} ({columns})")  # type: ignore[arg-type]


def start_spark_job(
    spark: SparkSession,
    database_url: str,
    *,
    source: Path,
    prefix: str,
    watermark: str,
    checkpoints: Path,
    files_per_trigger: int | None,
) -> SparkJob:
    """The aggregations of the 1-minute and the 5-minute stream as streaming queries over
    the CSV files in ``source``, upserting into the PostgreSQL tables ``<prefix>_1m`` and
    ``<prefix>_5m``."""
    create_sink_tables(database_url, prefix)
    reader = spark.readStream.schema(SCHEMA).option("header", True)
    if files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    rows = reader.csv(str(source)).withWatermark("t", watermark)
    per_minute = (
        rows.groupBy("campaign", F.window("t", "1 minute"))
        .agg(F.count(F.lit(1)).alias("c"), F.sum("price").alias("revenue"))
        .select("campaign", "c", "revenue", F.col("window.end").alias("t"))
    )
    per_5_minutes = (
        rows.groupBy("campaign", F.window("t", "5 minutes"))
        .agg(F.avg("price").alias("avg_price"), F.max("price").alias("max_price"))
        .select("campaign", "avg_price", "max_price", F.col("window.end").alias("t"))
    )
    queries, sinks = [], []
    for suffix, frame in (("_1m", per_minute), ("_5m", per_5_minutes)):
        sink = PostgresSink(database_url, f"{prefix}{suffix}", frame.columns, ("campaign", "t"))
        query = (
            frame.writeStream.queryName(f"{prefix}{suffix}")
            .outputMode("update")
            .foreachBatch(sink)
            .option("checkpointLocation", str(checkpoints / f"{prefix}{suffix}"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        queries.append(query)
        sinks.append(sink)
    return SparkJob(queries, sinks)


def write_run_files(directory: Path, bodies: list[bytes]) -> None:
    """The bodies as CSV files, in order, with increasing modification times (Spark's file
    source takes the oldest files first)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = time.time_ns() - len(bodies) * 1_000_000_000
    for index, body in enumerate(bodies):
        path = directory / f"run-{index:05d}.csv"
        path.write_bytes(body)
        mtime = base + index * 1_000_000_000
        os.utime(path, ns=(mtime, mtime))


def spark_throughput(
    spark: SparkSession,
    database_url: str,
    data: Dataset,
    work: Path,
    watermark: str,
    files_per_trigger: int,
    prefix: str,
) -> tuple[Timing, dict[str, int]]:
    source = work / f"{prefix}-source"
    started = time.monotonic()
    write_run_files(source, data.bodies)
    job = start_spark_job(
        spark,
        database_url,
        source=source,
        prefix=prefix,
        watermark=watermark,
        checkpoints=work / "checkpoints",
        files_per_trigger=files_per_trigger,
    )
    try:
        job.wait()
        seconds = time.monotonic() - started
        progress = job.progress()
    finally:
        job.stop()
    notes = (
        f"watermark {watermark}, {files_per_trigger} files/micro-batch, "
        f"{progress['data_batches']} data batches"
    )
    return Timing(f"Spark SSS, {watermark}", data.rows, seconds, notes), progress


def spark_freshness(
    spark: SparkSession, database_url: str, data: Dataset, work: Path, prefix: str, gap: float
) -> list[float]:
    """Seconds from each file's landing in the source directory to its rows in PostgreSQL."""
    source, staging = work / f"{prefix}-source", work / f"{prefix}-staging"
    source.mkdir(parents=True)
    staging.mkdir(parents=True)
    job = start_spark_job(
        spark,
        database_url,
        source=source,
        prefix=prefix,
        watermark="10 minutes",
        checkpoints=work / "checkpoints",
        files_per_trigger=None,
    )
    try:
        job.wait()  # the (empty) first batch is behind us

        def land(index: int) -> float:
            name = f"run-{index:05d}.csv"
            (staging / name).write_bytes(data.bodies[index])
            started = time.monotonic()
            os.rename(staging / name, source / name)
            return started

        latencies = _freshness(database_url, f"{prefix}_1m", data, land, job.check, gap)
        job.wait()  # stopping a query amid a micro-batch fails it
        return latencies
    finally:
        job.stop()


def _freshness(
    database_url: str,
    table: str,
    data: Dataset,
    send: Callable[[int], float],
    check: Callable[[], None],
    gap: float,
) -> list[float]:
    """Send run after run (``send`` returns when it began); for each, the seconds from its
    sending until ``sum(c)`` of ``table`` counts its rows."""
    latencies = []
    expected = 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        for index, rows in enumerate(data.rows_per_body):
            expected += rows
            started = send(index)
            deadline = started + VISIBLE_TIMEOUT
            polls = 0
            while True:
                counted = scalar(conn, f"SELECT coalesce(sum(c), 0) FROM {table}")
                if counted >= expected:
                    latencies.append(time.monotonic() - started)
                    break
                polls += 1
                if polls % 500 == 0:
                    check()
                if time.monotonic() > deadline:
                    raise BenchError(f"run {index} not visible in {table} after {VISIBLE_TIMEOUT}s")
                time.sleep(POLL_INTERVAL)
            if counted != expected:
                raise BenchError(f"{table} counts {counted} rows, expected {expected}")
            time.sleep(gap)
    return latencies


# ---- Strata ------------------------------------------------------------------------------


def strata_freshness(server: Server, data: Dataset, raw: str, gap: float) -> list[float]:
    """Seconds from each run's POST (wait=false) to its rows in the view ``<raw>_1m``."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        create_streams(client, raw)

        def post(index: int) -> float:
            started = time.monotonic()
            response = client.post(
                f"/streams/{raw}/runs",
                params={"run_id": f"{raw}-{index:05d}"},
                content=data.bodies[index],
                headers={"content-type": "text/csv"},
            )
            if response.status_code != 202:
                raise BenchError(f"{raw} run {index}: {response.status_code} {response.text}")
            return started

        def check() -> None:
            if server.process.poll() is not None:
                raise BenchError(f"strata up exited with {server.process.returncode}")

        return _freshness(server.database_url, f"{raw}_1m", data, post, check, gap)


# ---- checks --------------------------------------------------------------------------------


@dataclass
class Accuracy:
    rows_lost: int
    rows_over_counted: int
    windows_wrong_1m: int
    windows_1m: int
    windows_wrong_5m: int
    windows_5m: int


def accuracy(database_url: str, prefix: str) -> Accuracy:
    """The results ``<prefix>_1m`` and ``<prefix>_5m`` against batch queries over the input."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        one = fetch_one(conn, CHECK_1M.format(input=PLAIN, output=f"{prefix}_1m"))
        five = fetch_one(conn, CHECK_5M.format(input=PLAIN, output=f"{prefix}_5m"))
    return Accuracy(*(int(v) for v in (*one, *five)))


def raw_archived(database_url: str, raw: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return int(scalar(conn, f"SELECT count(*) FROM {raw}"))


# ---- the benchmark ---------------------------------------------------------------------------


def run(scale: str = "full", *, threads: int = 4, keep: bool = False) -> dict[str, Any]:
    """The whole comparison at ``scale`` ("full" or "smoke"); returns the figures, with
    ``problems`` listing what was wrong (empty when all is right)."""
    size = SCALES[check_scale(scale)]
    started = time.monotonic()
    data = generate(size.rows, size.run_rows, 2024, HOURS_LATE, size.span_hours * HOUR_MS)
    late_rows = sum(data.rows_per_body[i] for i in data.late_runs)
    fresh = {
        SMALL_ROWS: generate(
            SMALL_ROWS * size.small_runs, SMALL_ROWS, 7, ON_TIME, size.small_runs * 60_000
        ),
        size.large_rows: generate(
            size.large_rows * size.large_runs, size.large_rows, 8, ON_TIME, size.large_runs * 60_000
        ),
    }
    warm = size.warm_up and generate(
        SMALL_ROWS * size.warm_up, SMALL_ROWS, 9, ON_TIME, size.warm_up * 60_000
    )
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            f"{len(data.bodies)} runs, {data.size / 1e6:.1f} MB, {late_rows:,} rows in "
            f"{len(data.late_runs)} runs 1-6 h late",
        )
    ]
    work = Path(tempfile.mkdtemp(prefix="strata-peer-"))
    server: Server | None = None
    spark: SparkSession | None = None
    problems: list[str] = []
    results: dict[str, Any] = {
        "scale": scale,
        "rows": data.rows,
        "runs": len(data.bodies),
        "late_rows": late_rows,
        "cpus": os.cpu_count(),
    }
    failed = True
    try:
        server, spark, spark_seconds = start_server_and_spark(work, "peer-sss")
        timings.append(Timing("Spark session", 0, spark_seconds))
        timings += start_timings(server, server.database_url)
        url = server.database_url
        copy = copy_baseline(url, data, PLAIN, COLUMNS)
        timings.append(copy)
        results["load_average_before"] = os.getloadavg()[0]

        # Spark: freshness, then throughput once per watermark.
        if warm:  # the JVM compiles the hot paths over the first few micro-batches
            phase = time.monotonic()
            spark_freshness(spark, url, warm, work, "sss_warmup", 0.0)
            timings.append(Timing("Spark warm-up", 0, time.monotonic() - phase, WARM_UP))
        sss_fresh = {}
        for rows, runs in fresh.items():
            phase = time.monotonic()
            sss_fresh[rows] = spark_freshness(spark, url, runs, work, f"sss_fresh_{rows}", size.gap)
            timings.append(_freshness_timing("Spark", rows, sss_fresh[rows], phase))
        sss: dict[str, tuple[Timing, dict[str, int], Accuracy]] = {}
        for watermark, tag in WATERMARKS.items():
            timing, progress = spark_throughput(
                spark, url, data, work, watermark, threads, f"sss_{tag}"
            )
            timings.append(timing)
            sss[watermark] = (timing, progress, accuracy(url, f"sss_{tag}"))
        stop_spark_session(spark)
        spark = None

        # Strata: the same.
        if warm:
            phase = time.monotonic()
            strata_freshness(server, warm, "warmup", 0.0)
            timings.append(Timing("Strata warm-up", 0, time.monotonic() - phase, WARM_UP))
        strata_fresh = {}
        for rows, runs in fresh.items():
            phase = time.monotonic()
            strata_fresh[rows] = strata_freshness(server, runs, f"fresh_{rows}", size.gap)
            timings.append(_freshness_timing("Strata", rows, strata_fresh[rows], phase))
        strata: dict[str, tuple[Timing, Accuracy]] = {}
        for watermark, tag in WATERMARKS.items():
            raw = f"impsns_{tag}"
            with httpx.Client(base_url=server.url, timeout=60) as client:
                create_streams(client, raw, watermark)
            timing = post_runs(server, data, threads, "wait", raw=raw)
            timing.name = f"Strata, {watermark}"
            timing.notes = f"watermark {watermark}, {threads} clients, wait=true"
            timings.append(timing)
            strata[watermark] = (timing, accuracy(url, raw))
            archived = raw_archived(url, raw)
            if archived != data.rows:
                problems.append(f"{raw} archived {archived} rows of {data.rows}")
        results["load_average_after"] = os.getloadavg()[0]

        # Figures and checks.
        results["copy_rows_per_s"] = round(copy.rows_per_s)
        throughput = {}
        for watermark in WATERMARKS:
            s_timing, s_acc = strata[watermark]
            p_timing, p_progress, p_acc = sss[watermark]
            throughput[watermark] = {
                "strata_rows_per_s": round(s_timing.rows_per_s),
                "sss_rows_per_s": round(p_timing.rows_per_s),
                "ratio": round(s_timing.rows_per_s / p_timing.rows_per_s, 2),
                "strata_seconds": round(s_timing.seconds, 2),
                "sss_seconds": round(p_timing.seconds, 2),
                "strata": asdict(s_acc),
                "sss": asdict(p_acc),
                "sss_progress": p_progress,
            }
            if s_acc.rows_lost or s_acc.rows_over_counted or s_acc.windows_wrong_1m:
                problems.append(f"Strata ({watermark}), 1-minute stream: {s_acc}")
            if s_acc.windows_wrong_5m:
                problems.append(f"Strata ({watermark}), 5-minute stream: {s_acc}")
            if p_acc.rows_over_counted:
                problems.append(f"Spark ({watermark}) over-counted: {p_acc}")
            if p_progress["rows_read"] != 2 * data.rows:
                problems.append(f"Spark ({watermark}) read {p_progress} of {data.rows} rows x 2")
        results["throughput"] = throughput
        freshness = {}
        for rows in fresh:
            ours, theirs = strata_fresh[rows][size.skip :], sss_fresh[rows][size.skip :]
            series: dict[str, Any] = {
                "samples": len(ours),
                "strata_p50_s": round(percentile(ours, 0.5), 3),
                "strata_p99_s": round(percentile(ours, 0.99), 3),
                "sss_p50_s": round(percentile(theirs, 0.5), 3),
                "sss_p99_s": round(percentile(theirs, 0.99), 3),
            }
            series["p50_ratio"] = round(series["strata_p50_s"] / series["sss_p50_s"], 2)
            series["p99_ratio"] = round(series["strata_p99_s"] / series["sss_p99_s"], 2)
            # every run, in order, the first ``skip`` included
            series["strata_seconds"] = [round(x, 3) for x in strata_fresh[rows]]
            series["sss_seconds"] = [round(x, 3) for x in sss_fresh[rows]]
            freshness[str(rows)] = series
        results["freshness"] = freshness

        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        results["problems"] = problems
        results["seconds"] = round(time.monotonic() - started, 1)
        print_table(timings, phase_width=24)
        print_report(results)
        failed = bool(problems)
    finally:
        if spark is not None:
            stop_spark_session(spark)
        clean_up(server, work, failed=failed, keep=keep)
    return results


def print_report(results: dict[str, Any]) -> None:
    rows = results["rows"]
    print(
        f"\n{rows:,} rows in {results['runs']} runs, {results['late_rows']:,} of them "
        f"({results['late_rows'] / rows:.0%}) in runs 1-6 hours late; "
        f"PostgreSQL COPY {results['copy_rows_per_s']:,} rows/s"
    )
    print(
        f"\n{'watermark':<11} {'Strata rows/s':>14} {'SSS rows/s':>11} {'ratio':>6}  "
        f"{'Strata lost':>11} {'SSS lost':>16} {'SSS 5m windows wrong':>21}"
    )
    for watermark, f in results["throughput"].items():
        lost = f["sss"]["rows_lost"]
        print(
            f"{watermark:<11} {f['strata_rows_per_s']:>14,} {f['sss_rows_per_s']:>11,} "
            f"{f['ratio']:>6.2f}  {f['strata']['rows_lost']:>11,} "
            f"{f'{lost:,} ({lost / rows:.1%})':>16} "
            f"{f['sss']['windows_wrong_5m']:>12,} of {f['sss']['windows_5m']:,}"
        )
    print(
        f"\n{'run rows':>9} {'samples':>8} {'Strata p50':>11} {'p99':>7} {'SSS p50':>8} "
        f"{'p99':>7} {'p50 ratio':>10} {'p99 ratio':>10}"
    )
    for run_rows, f in results["freshness"].items():
        print(
            f"{int(run_rows):>9,} {f['samples']:>8} {f['strata_p50_s']:>10.3f}s "
            f"{f['strata_p99_s']:>6.3f}s {f['sss_p50_s']:>7.3f}s {f['sss_p99_s']:>6.3f}s "
            f"{f['p50_ratio']:>10.2f} {f['p99_ratio']:>10.2f}"
        )
    print(
        f"\n{results['cpus']} CPUs; load average (1 min) {results['load_average_before']:.2f} "
        f"before, {results['load_average_after']:.2f} after; {results['seconds']}s in all"
    )
    if results["problems"]:
        print("\nWRONG:\n  " + "\n  ".join(results["problems"]), file=sys.stderr)
    print(json.dumps(results))


def _freshness_timing(engine: str, rows: int, latencies: list[float], started: float) -> Timing:
    shown = ", ".join(f"{s:.2f}" for s in latencies[:12])
    more = ", ..." if len(latencies) > 12 else ""
    return Timing(
        f"{engine} freshness {rows:,}",
        0,
        time.monotonic() - started,
        f"{len(latencies)} runs; seconds to visible: {shown}{more}",
    )


def figures(results: dict[str, Any]) -> list[Result]:
    """The figures of ``run`` for bench/run.py: Strata against Spark, same run."""
    spark = "Spark Structured Streaming"
    workload = f"{results['rows']:,} rows, {results['late_rows'] / results['rows']:.0%} 1-6 h late"
    out = []
    for watermark, f in results["throughput"].items():
        context = {
            "strata_seconds": f["strata_seconds"],
            "sss_seconds": f["sss_seconds"],
            "strata_rows_lost": f["strata"]["rows_lost"],
            "sss_rows_lost": f["sss"]["rows_lost"],
            "rows": results["rows"],
        }
        out.append(
            Result(
                f"end-to-end ingest into PostgreSQL ({workload}; watermark {watermark})",
                f["strata_rows_per_s"],
                f["sss_rows_per_s"],
                spark,
                "rows/s",
                "higher",
                context=context,
            )
        )
        out.append(
            Result(
                f"rows missing from the final results (watermark {watermark})",
                f["strata"]["rows_lost"],
                f["sss"]["rows_lost"],
                spark,
                "rows",
                "lower",
                context=context,
            )
        )
    for run_rows, f in results["freshness"].items():
        out += latency_results(
            f"freshness {{q}}, runs of {int(run_rows):,} rows (arrival to visible in PostgreSQL)",
            f,
            spark,
            f["samples"],
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
    parser.add_argument(
        "--threads",
        type=int,
        default=4,
        help="Strata client threads; Spark files per micro-batch (4)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (server log, PostgreSQL)"
    )
    args = parser.parse_args(argv)
    try:
        results = run(args.scale, threads=args.threads, keep=args.keep)
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
