"""The four HiBench streaming workloads, Strata against Spark Structured Streaming (SSS).

    python -m bench.hibench [--scale full|smoke] [--threads 4] [--run-rows N]
                            [--runs N] [--latency-runs N] [--keep]

HiBench's streaming suite (identity, repartition, wordcount, fixwindow) over records like
its UserVisits: ip, session, url, visit time ``t`` (the event time), revenue, user agent,
country, language, search word, duration; about 200 bytes a CSV line, generated
deterministically (seeded): 1,000 client ips, a 64-bit random session per record, 10,000
search words of Zipf-like frequency, event time advancing 1 ms per record (1,000 records
per second of event time, runs in event-time order: nothing is late). Each workload is
measured on its own, in one run on one machine, in both engines: one ``strata up``
(bench.harness.server) and one SparkSession in this process for SSS (bench.harness.sss, as
bench/peer_sss.py does). How each engine expresses each workload:

* **identity** — every record passes unchanged into PostgreSQL. Strata: the raw stream
  ``hb_identity`` (its rows archived in PostgreSQL) and over it the projection stream
  ``CREATE STREAM hb_identity_out AS SELECT * FROM hb_identity`` (a stream without
  aggregates: a PostgreSQL view over the raw archive; with no aggregate over the raw stream
  the server runs no Spark job, it archives each run's rows). SSS: the file source,
  ``foreachBatch`` COPYing each micro-batch into a table (append mode).
* **repartition** — HiBench redistributes the records over a different number of
  partitions (a shuffle). Strata's SQL has no repartition, and a derived stream with
  aggregates needs a window, so Strata groups by a key of one record each:
  ``SELECT session, count(*) AS c, window_end AS t FROM TUMBLE(hb_repartition, t,
  INTERVAL '1 day') GROUP BY session, window_end`` — the one-day window holds all the data;
  Spark hash-partitions every record by its session (the shuffle, into
  ``spark.sql.shuffle.partitions`` partitions, one per core) to compute one partial row per record,
  and the raw rows are archived besides. SSS: ``.repartition(n)`` (the same number of
  partitions) of the records, then ``foreachBatch`` COPY of the records, as HiBench does.
  The outputs differ (counts per session against the records), the shuffle is the same.
* **wordcount** — HiBench splits lines into words and counts per word. Strata's SQL has no
  split/explode/unnest (row-level expressions are columns, literals, arithmetic,
  comparisons, CASE, COALESCE, casts, ||, lower/upper/abs), so each record's search-word
  field is its one word, and both engines count per word over one one-day window (Strata
  needs a window; it holds all the data, so the counts are HiBench's running totals):
  ``SELECT word, count(*) AS c, window_end AS t FROM TUMBLE(hb_wordcount, t, INTERVAL
  '1 day') GROUP BY word, window_end``. SSS: ``groupBy(window(t, '1 day'), word).count()``
  with a watermark of 1 minute, update mode, ``foreachBatch`` upsert (COPY into a staging
  table, ``INSERT ... ON CONFLICT DO UPDATE``, as bench/peer_sss.py).
* **fixwindow** — a 10-second tumbling count per ip: ``SELECT ip, count(*) AS c,
  window_end AS t FROM TUMBLE(hb_fixwindow, t, INTERVAL '10 seconds') GROUP BY ip,
  window_end``; SSS: ``groupBy(window(t, '10 seconds'), ip).count()``, watermark 1 minute,
  update mode, ``foreachBatch`` upsert.

For each workload and engine, the same runs (CSV bodies / files of ``run_rows`` records):

1. **latency**: ``latency_runs`` runs one at a time, ``gap`` seconds apart; the first
   ``skip`` are not counted (JVM warm-up). Strata: from the ``POST`` of a run
   (``wait=true``) until the server answers that it is committed (raw rows and every
   stream's rows become visible in PostgreSQL atomically at that commit). SSS: from the
   run file's rename into the watched directory until the ``foreachBatch`` transaction that
   holds its rows commits (the sink runs in this process and notes the time). Both are
   thus taken at the commit, without polling PostgreSQL: polling a count over tables of
   200-byte rows every few milliseconds, as bench/peer_sss.py does over small result
   tables, would take a core of a 2-core machine away from the engines;
2. **throughput**: the next ``runs`` runs, as fast as each engine takes them: Strata from
   ``threads`` clients with ``wait=true`` (bench.harness.api's ``post_runs``; the clock stops
   when every run is committed); SSS reading ``threads`` files per micro-batch, the clock
   from the first file written until the query has processed every file
   (``processAllAvailable``: every row is then in PostgreSQL).

Then the results of both engines are compared with the same query as a batch over a plain
PostgreSQL table holding every input row (COPY of the same bodies): records (identity, SSS
repartition) row for row (``EXCEPT ALL`` both ways), counts window by window and key by key
(rows lost = input rows of a group not counted in its result). Strata must be exact; rows
SSS lost are reported, and rows it over-counted or invented fail the benchmark.

Every figure is Strata against SSS in the same run (ratio = Strata / SSS): throughput
(rows/s, higher is better) and latency p50 and p99 (seconds, lower is better) per
workload, absolute numbers in the context. The scale ``full`` measures throughput over
1,000,000 records per workload (50 runs of 20,000) and latency over 22 runs of 20,000 (20
counted), 3 minutes (186 s) on an idle 2-core machine; ``smoke`` (runs of 500 records) proves only
that everything works, in under a minute: its numbers mean nothing. Prints a table and one
JSON line (the dict ``run`` returns); exits non-zero when Strata's results are wrong or SSS
over-counts.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
from pyspark.sql import types as T  # noqa: N812

from bench.harness.api import HTTP_TIMEOUT, create_stream, post_runs
from bench.harness.data import Dataset, day_timestamp
from bench.harness.database import copy_baseline, fetch_one, scalar
from bench.harness.errors import BenchError
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, latency_results, print_table
from bench.harness.server import Server, clean_up, start_timings, stop_problems, stop_server
from bench.harness.sss import PostgresSink, SparkJob, start_server_and_spark
from server.engines.spark import stop_spark_session

WORKLOADS = ("identity", "repartition", "wordcount", "fixwindow")
FIELDS = "ip, session, url, t, revenue, user_agent, country, language, word, duration"
COLUMNS = (
    "ip text, session text, url text, t timestamptz, revenue numeric(10,2), user_agent text, "
    "country text, language text, word text, duration integer"
)
HEADER = FIELDS.replace(" ", "") + "\n"
SCHEMA = T.StructType(
    [
        T.StructField("ip", T.StringType()),
        T.StructField("session", T.StringType()),
        T.StructField("url", T.StringType()),
        T.StructField("t", T.TimestampType()),
        T.StructField("revenue", T.DecimalType(10, 2)),
        T.StructField("user_agent", T.StringType()),
        T.StructField("country", T.StringType()),
        T.StructField("language", T.StringType()),
        T.StructField("word", T.StringType()),
        T.StructField("duration", T.IntegerType()),
    ]
)
RAW = f"CREATE STREAM {{raw}} ({COLUMNS}) WITH (event_time = 't')"
# The workloads grouped by a key, per engine: (key, window). SSS's repartition keeps records.
STRATA_KEYED = {
    "repartition": ("session", "1 day"),
    "wordcount": ("word", "1 day"),
    "fixwindow": ("ip", "10 seconds"),
}
SSS_KEYED = {w: STRATA_KEYED[w] for w in ("wordcount", "fixwindow")}
IDENTITY = "CREATE STREAM {out} AS SELECT * FROM {raw}"
KEYED = (
    "CREATE STREAM {out} AS SELECT {key}, count(*) AS c, window_end AS t "
    "FROM TUMBLE({raw}, t, INTERVAL '{window}') GROUP BY {key}, window_end"
)
WATERMARK = "1 minute"  # SSS's; the runs come in event-time order, none is late
PLAIN = "hb_plain"  # every input row, the input of the batch queries
# Per group of a keyed result: input rows not counted (lost), counted beyond the input
# (over-counted), and groups whose count differs from the batch query's.
CHECK_KEYED = """
WITH batch AS (
    SELECT {key} AS k, date_bin('{window}', t, '1970-01-01 00:00:00+00') + interval '{window}'
           AS t, count(*) AS c
    FROM {plain} GROUP BY 1, 2)
SELECT coalesce(sum(greatest(coalesce(b.c, 0) - coalesce(o.c, 0), 0)), 0)::bigint,
       coalesce(sum(greatest(coalesce(o.c, 0) - coalesce(b.c, 0), 0)), 0)::bigint,
       count(*) FILTER (WHERE o.c IS DISTINCT FROM b.c),
       count(*)
FROM batch b FULL JOIN (SELECT {key} AS k, c, t FROM {output}) o USING (k, t)
"""
# Records: input rows missing from the output, and output rows not in the input.
CHECK_RECORDS = """
SELECT (SELECT count(*) FROM (SELECT {fields} FROM {plain} EXCEPT ALL
                              SELECT {fields} FROM {output}) d),
       (SELECT count(*) FROM (SELECT {fields} FROM {output} EXCEPT ALL
                              SELECT {fields} FROM {plain}) d),
       0, (SELECT count(*) FROM {output})
"""
SEED = 2024
COMMIT_TIMEOUT = 300.0  # most seconds a latency run may take to commit in SSS
IPS = 1_000
URLS = 5_000
WORDS = 10_000
MS_PER_ROW = 1  # event time advances 1 ms per record
AGENTS = (  # no commas: plain CSV
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/120.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 Version/17.1",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 Chrome/120.0 Mobile",
    "Opera/9.80 (Windows NT 6.1; U; en) Presto/2.12.388 Version/12.16",
)
COUNTRIES = ("USA", "DEU", "FRA", "JPN", "BRA", "IND", "CHN", "GBR", "CAN", "MEX", "ITA", "ESP")
LANGUAGES = ("en-US", "de-DE", "fr-FR", "ja-JP", "pt-BR", "hi-IN", "zh-CN", "en-GB", "es-ES")


@dataclass(frozen=True)
class Scale:
    run_rows: int
    runs: int  # throughput runs
    latency_runs: int
    skip: int  # latency runs not counted (warm-up)
    gap: float  # seconds between latency runs


SCALES = {
    "full": Scale(20_000, 50, 22, 2, 0.2),
    "smoke": Scale(500, 2, 2, 0, 0.0),
}


# ---- data ----------------------------------------------------------------------------------


def _name(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(low, high)))


def generate_visits(runs: int, run_rows: int, seed: int = SEED) -> Dataset:
    """``runs`` CSV bodies of ``run_rows`` UserVisits-like records each, in event-time order."""
    rng = random.Random(seed)
    ips = [
        f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        for _ in range(IPS)
    ]
    urls = [
        f"http://www.{_name(rng, 5, 12)}.com/{_name(rng, 3, 9)}/{rng.randrange(100_000)}.html"
        for _ in range(URLS)
    ]
    vocabulary: dict[str, None] = {}
    while len(vocabulary) < WORDS:
        vocabulary[_name(rng, 3, 10)] = None
    words = list(vocabulary)
    weights, total = [], 0.0
    for rank in range(1, WORDS + 1):  # Zipf-like: the k-th word 1/k as often as the first
        total += 1 / rank
        weights.append(total)
    bodies = []
    for run in range(runs):
        first = run * run_rows
        picks = zip(
            rng.choices(ips, k=run_rows),
            rng.choices(urls, k=run_rows),
            rng.choices(AGENTS, k=run_rows),
            rng.choices(COUNTRIES, k=run_rows),
            rng.choices(LANGUAGES, k=run_rows),
            rng.choices(words, cum_weights=weights, k=run_rows),
            strict=True,
        )
        lines = [HEADER]
        for i, (ip, url, agent, country, language, word) in enumerate(picks):
            cents = rng.randrange(1, 100_000)
            lines.append(
                f"{ip},{rng.getrandbits(64):016x},{url},{day_timestamp((first + i) * MS_PER_ROW)},"
                f"{cents // 100}.{cents % 100:02d},{agent},{country},{language},{word},"
                f"{rng.randrange(1, 1000)}\n"
            )
        bodies.append("".join(lines).encode())
    return Dataset(bodies, [run_rows] * runs, [])


def split(data: Dataset, first: int) -> tuple[Dataset, Dataset]:
    """The first ``first`` runs and the others."""
    return (
        Dataset(data.bodies[:first], data.rows_per_body[:first], []),
        Dataset(data.bodies[first:], data.rows_per_body[first:], []),
    )


# ---- one engine's measurements ---------------------------------------------------------------


@dataclass
class Measured:
    """One workload in one engine."""

    latencies: list[float]  # seconds, every latency run in order (the skipped ones included)
    throughput: Timing
    extra: dict[str, Any] = field(default_factory=dict)
    lost: int = 0  # input rows missing from the results
    over: int = 0  # rows counted beyond the input (or records not in the input)
    wrong_groups: int = 0
    groups: int = 0  # result rows


# ---- Spark Structured Streaming ------------------------------------------------------------


def sss_frame(
    spark: SparkSession, workload: str, source: Path, files_per_trigger: int, partitions: int
) -> tuple[DataFrame, tuple[str, ...]]:
    """The workload's streaming query over the CSV files of ``source``, and the keys its sink
    upserts on (none: it appends records)."""
    rows = (
        spark.readStream.schema(SCHEMA)
        .option("header", True)
        .option("maxFilesPerTrigger", files_per_trigger)
        .csv(str(source))
    )
    if workload == "identity":
        return rows, ()
    if workload == "repartition":
        return rows.repartition(partitions), ()
    key, window = SSS_KEYED[workload]
    counts = rows.withWatermark("t", WATERMARK).groupBy(key, F.window("t", window)).count()
    return counts.select(key, F.col("count").alias("c"), F.col("window.end").alias("t")), (key, "t")


def sss_workload(
    spark: SparkSession,
    database_url: str,
    workload: str,
    latency: Dataset,
    throughput: Dataset,
    work: Path,
    *,
    threads: int,
    gap: float,
) -> Measured:
    table = f"sss_{workload}"
    source, staging = work / f"{table}-source", work / f"{table}-staging"
    source.mkdir(parents=True)
    staging.mkdir(parents=True)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or "4")
    frame, keys = sss_frame(spark, workload, source, threads, partitions)
    with psycopg.connect(database_url, autocommit=True) as conn:
        _execute(conn, f"DROP TABLE IF EXISTS {table}")
        if keys:
            key = keys[0]
            _execute(
                conn,
                f"CREATE TABLE {table} ({key} text, c bigint, t timestamptz, "
                f"PRIMARY KEY ({key}, t))",
            )
        else:
            _execute(conn, f"CREATE TABLE {table} ({COLUMNS})")
    sink = PostgresSink(database_url, table, frame.columns, keys)
    query = (
        frame.writeStream.queryName(table)
        .outputMode("update" if keys else "append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoints" / table))
        .trigger(processingTime="0 seconds")
        .start()
    )
    job = SparkJob([query], [sink])

    def land(name: str, body: bytes) -> float:
        (staging / name).write_bytes(body)
        started = time.monotonic()
        os.rename(staging / name, source / name)
        return started

    try:
        job.wait()  # the (empty) first batch is behind us
        latencies = []
        for index, body in enumerate(latency.bodies):
            before = len(sink.commits)
            started = land(f"latency-{index:05d}.csv", body)
            polls = 0
            while len(sink.commits) == before:
                polls += 1
                if polls % 1000 == 0:
                    job.check()
                if time.monotonic() > started + COMMIT_TIMEOUT:
                    raise BenchError(f"{table}: run {index} not committed in {COMMIT_TIMEOUT}s")
                time.sleep(0.001)
            latencies.append(sink.commits[before] - started)
            time.sleep(gap)
        job.wait()
        started = time.monotonic()
        for index, body in enumerate(throughput.bodies):
            land(f"run-{index:05d}.csv", body)
        job.wait()
        seconds = time.monotonic() - started
        progress = job.progress()
    finally:
        job.stop()
    notes = f"{threads} files/micro-batch, {progress['data_batches']} data batches in all"
    timing = Timing(f"SSS {workload}", throughput.rows, seconds, notes)
    return Measured(latencies, timing, {"rows_read": progress["rows_read"], "table": table})


# ---- Strata --------------------------------------------------------------------------------


def strata_workload(
    server: Server,
    workload: str,
    latency: Dataset,
    throughput: Dataset,
    *,
    threads: int,
    gap: float,
) -> Measured:
    raw, out = f"hb_{workload}", f"hb_{workload}_out"
    if workload == "identity":
        derived = IDENTITY.format(out=out, raw=raw)
    else:
        key, window = STRATA_KEYED[workload]
        derived = KEYED.format(out=out, raw=raw, key=key, window=window)
    latencies = []
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
        for sql in (RAW.format(raw=raw), derived):
            create_stream(client, sql)
        for index, body in enumerate(latency.bodies):
            started = time.monotonic()
            response = client.post(
                f"/streams/{raw}/runs",
                params={"wait": "true", "run_id": f"{raw}-latency-{index:05d}"},
                content=body,
                headers={"content-type": "text/csv"},
            )
            latencies.append(time.monotonic() - started)
            if (
                response.status_code != 200
                or response.json().get("rows") != latency.rows_per_body[index]
            ):
                raise BenchError(
                    f"{raw} latency run {index}: {response.status_code} {response.text}"
                )
            time.sleep(gap)
    timing = post_runs(server, throughput, threads, "wait", raw=raw)
    timing.name = f"Strata {workload}"
    timing.notes = f"{threads} clients, wait=true"
    return Measured(latencies, timing, {"raw": raw, "table": out})


# ---- checks --------------------------------------------------------------------------------


def _execute(conn: psycopg.Connection, statement: str) -> None:
    conn.execute(statement)  # type: ignore[arg-type]


def check(database_url: str, measured: Measured, keyed: tuple[str, str] | None) -> None:
    """Fill in ``measured``'s rows lost, over-counted and groups wrong against the batch
    query over ``hb_plain``."""
    output = measured.extra["table"]
    if keyed is None:
        statement = CHECK_RECORDS.format(fields=FIELDS, plain=PLAIN, output=output)
    else:
        key, window = keyed
        statement = CHECK_KEYED.format(key=key, window=window, plain=PLAIN, output=output)
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = fetch_one(conn, statement)
    measured.lost, measured.over, measured.wrong_groups, measured.groups = (int(v) for v in row)


# ---- the benchmark ---------------------------------------------------------------------------


def run(
    scale: str = "full",
    *,
    threads: int = 4,
    keep: bool = False,
    **overrides: int,
) -> dict[str, Any]:
    """The whole comparison at ``scale`` ("full" or "smoke"; ``overrides`` replace fields of
    its Scale); returns the figures, with ``problems`` listing what was wrong."""
    size = dataclasses.replace(SCALES[check_scale(scale)], **overrides)
    started = time.monotonic()
    data = generate_visits(size.latency_runs + size.runs, size.run_rows)
    latency, throughput = split(data, size.latency_runs)
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            f"{len(data.bodies)} runs of {size.run_rows:,} records, {data.size / 1e6:.1f} MB, "
            f"{data.size / data.rows:.0f} bytes a record",
        )
    ]
    work = Path(tempfile.mkdtemp(prefix="strata-hibench-"))
    server: Server | None = None
    spark: SparkSession | None = None
    problems: list[str] = []
    results: dict[str, Any] = {
        "scale": scale,
        "run_rows": size.run_rows,
        "throughput_rows": throughput.rows,
        "latency_runs": size.latency_runs,
        "latency_skip": size.skip,
        "record_bytes": round(data.size / data.rows, 1),
        "threads": threads,
        "cpus": os.cpu_count(),
    }
    failed = True
    try:
        server, spark, spark_seconds = start_server_and_spark(work, "hibench-sss")
        timings.append(Timing("Spark session", 0, spark_seconds))
        timings += start_timings(server, server.database_url)
        url = server.database_url
        # Every body into the plain table the checks compare with.
        copy = copy_baseline(url, data, PLAIN, COLUMNS)
        timings.append(copy)
        results["copy_rows_per_s"] = round(copy.rows_per_s)
        results["load_average_before"] = os.getloadavg()[0]

        sss: dict[str, Measured] = {}
        for workload in WORKLOADS:
            phase = time.monotonic()
            sss[workload] = sss_workload(
                spark, url, workload, latency, throughput, work, threads=threads, gap=size.gap
            )
            timings += _timings(sss[workload], phase)
        stop_spark_session(spark)
        spark = None
        strata: dict[str, Measured] = {}
        for workload in WORKLOADS:
            phase = time.monotonic()
            strata[workload] = strata_workload(
                server, workload, latency, throughput, threads=threads, gap=size.gap
            )
            timings += _timings(strata[workload], phase)
        results["load_average_after"] = os.getloadavg()[0]

        phase = time.monotonic()
        for workload in WORKLOADS:
            ours, theirs = strata[workload], sss[workload]
            check(url, ours, STRATA_KEYED.get(workload))
            check(url, theirs, SSS_KEYED.get(workload))
            if ours.lost or ours.over or ours.wrong_groups:
                problems.append(
                    f"Strata {workload}: {ours.lost} rows lost, {ours.over} over-counted, "
                    f"{ours.wrong_groups} groups wrong"
                )
            with psycopg.connect(url, autocommit=True) as conn:
                archived = scalar(conn, f"SELECT count(*) FROM {ours.extra['raw']}")
            if archived != data.rows:
                problems.append(f"Strata {workload}: {archived} raw rows archived of {data.rows}")
            if theirs.over:
                problems.append(f"SSS {workload}: {theirs.over} rows over-counted or invented")
            if theirs.extra["rows_read"] != data.rows:
                problems.append(f"SSS {workload} read {theirs.extra['rows_read']} of {data.rows}")
        timings.append(Timing("checks", 0, time.monotonic() - phase, "both engines, batch SQL"))

        results["workloads"] = {w: _figures(strata[w], sss[w], size.skip) for w in WORKLOADS}
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


def _timings(measured: Measured, started: float) -> list[Timing]:
    engine = measured.throughput.name.split()[0]
    shown = ", ".join(f"{s:.2f}" for s in measured.latencies[:12])
    more = ", ..." if len(measured.latencies) > 12 else ""
    latency = Timing(
        f"{measured.throughput.name} (phase)",
        0,
        time.monotonic() - started,
        f"{engine} latency runs: {shown}{more} s",
    )
    return [latency, measured.throughput]


def _figures(ours: Measured, theirs: Measured, skip: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for engine, m in (("strata", ours), ("sss", theirs)):
        counted = m.latencies[skip:] or m.latencies
        figures |= {
            f"{engine}_rows_per_s": round(m.throughput.rows_per_s),
            f"{engine}_seconds": round(m.throughput.seconds, 2),
            f"{engine}_p50_s": round(percentile(counted, 0.5), 3),
            f"{engine}_p99_s": round(percentile(counted, 0.99), 3),
            f"{engine}_latencies_s": [round(x, 3) for x in m.latencies],
            f"{engine}_rows_lost": m.lost,
            f"{engine}_rows_over": m.over,
            f"{engine}_groups_wrong": m.wrong_groups,
            f"{engine}_result_rows": m.groups,
        }
    figures["latency_samples"] = len(ours.latencies[skip:] or ours.latencies)
    return figures


def print_report(results: dict[str, Any]) -> None:
    print(
        f"\n{results['throughput_rows']:,} records per workload for throughput, runs of "
        f"{results['run_rows']:,} ({results['record_bytes']:.0f} bytes a record); latency over "
        f"{results['latency_runs']} runs one at a time (first {results['latency_skip']} not "
        f"counted); PostgreSQL COPY {results['copy_rows_per_s']:,} rows/s"
    )
    print(
        f"\n{'workload':<12} {'Strata rows/s':>13} {'SSS rows/s':>11} {'ratio':>6}  "
        f"{'Strata p50':>10} {'p99':>7} {'SSS p50':>8} {'p99':>7}  {'SSS rows lost':>13}"
    )
    for workload, f in results["workloads"].items():
        print(
            f"{workload:<12} {f['strata_rows_per_s']:>13,} {f['sss_rows_per_s']:>11,} "
            f"{f['strata_rows_per_s'] / f['sss_rows_per_s']:>6.2f}  "
            f"{f['strata_p50_s']:>9.3f}s {f['strata_p99_s']:>6.3f}s {f['sss_p50_s']:>7.3f}s "
            f"{f['sss_p99_s']:>6.3f}s  {f['sss_rows_lost']:>13,}"
        )
    print(
        f"\n{results['cpus']} CPUs; load average (1 min) {results['load_average_before']:.2f} "
        f"before, {results['load_average_after']:.2f} after; {results['seconds']}s in all"
    )
    if results["problems"]:
        print("\nWRONG:\n  " + "\n  ".join(results["problems"]), file=sys.stderr)
    print(json.dumps(results))


def figures(results: dict[str, Any]) -> list[Result]:
    """The figures of ``run`` for bench/run.py: Strata against SSS, same run."""
    spark = "Spark Structured Streaming"
    rows = results["throughput_rows"]
    out = []
    for workload, f in results["workloads"].items():
        context = {k: v for k, v in f.items() if not isinstance(v, list)} | {
            "records": rows,
            "run_rows": results["run_rows"],
        }
        out.append(
            Result(
                f"HiBench {workload}: throughput into PostgreSQL ({rows:,} records of "
                f"{results['record_bytes']:.0f} bytes, runs of {results['run_rows']:,})",
                f["strata_rows_per_s"],
                f["sss_rows_per_s"],
                spark,
                "rows/s",
                "higher",
                context=context,
            )
        )
        out += latency_results(
            f"HiBench {workload}: latency {{q}}, runs of {results['run_rows']:,} records "
            "(arrival to committed in PostgreSQL)",
            f,
            spark,
            f["latency_samples"],
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
        "--threads", type=int, default=4, help="Strata clients; SSS files per micro-batch (4)"
    )
    parser.add_argument("--run-rows", type=int, help="records per run (the scale's)")
    parser.add_argument("--runs", type=int, help="throughput runs per workload (the scale's)")
    parser.add_argument("--latency-runs", type=int, help="latency runs per workload (the scale's)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (server log, PostgreSQL)"
    )
    args = parser.parse_args(argv)
    overrides = {
        name: value
        for name, value in (
            ("run_rows", args.run_rows),
            ("runs", args.runs),
            ("latency_runs", args.latency_runs),
        )
        if value is not None
    }
    if any(v <= 0 for v in overrides.values()) or args.threads <= 0:
        parser.error("--threads, --run-rows, --runs and --latency-runs must be positive")
    try:
        results = run(args.scale, threads=args.threads, keep=args.keep, **overrides)
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    return 1 if results["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
