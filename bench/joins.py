"""Stream–stream joins with runs hours late, Strata against Spark Structured Streaming.

    python -m bench.joins [--scale full|smoke] [--threads 4] [--keep]

The workload is Nexmark-shaped (bench.harness.nexmark): ``auction`` and ``bid`` rows over
``span_hours`` of event time, each slice of ``run_rows`` events making a run of its
auctions and a run of its bids, with the lateness profile ``HOURS_LATE``
(bench.harness.lateness): 20% of the runs arrive 1 to 6 hours late, and every run's
arrival is jittered by up to 30 minutes. Two joins of them (``JOINS``), in both engines:

* **interval join** (Nexmark q20's shape): each bid with the auction it bids on, if it
  came while the auction was open: ``... FROM bid b JOIN auction a ON a.id = b.auction AND
  b.date_time BETWEEN a.date_time AND a.expires``;
* **window join**: each auction with the bids on it in the same 1-minute tumbling window:
  ``... FROM TUMBLE(auction, date_time, INTERVAL '1 minute') a JOIN TUMBLE(bid, ...) b ON
  a.id = b.auction AND a.window_start = b.window_start``.

What it does, in one process tree:

1. generates the workload, and starts ``strata up`` (bench.harness.server) and, meanwhile,
   a SparkSession in this process (bench.harness.sss); COPYs the same bodies into plain
   tables ``auction_plain`` and ``bid_plain``, the input of the oracle: each join run by
   PostgreSQL as a batch over them;
2. Spark Structured Streaming, once per watermark (10 minutes, 1 hour, on both inputs):
   a file source per input, both joins as streaming queries in append mode (the only mode
   of a stream–stream join) over the same SQL as Strata's, where the interval join also
   says ``b.date_time <= a.date_time + INTERVAL 30 MINUTES`` (implied by ``expires``, but
   Spark needs a bound between the two event times to ever drop state) and the window
   join joins the windows Spark's ``window()`` makes; a ``foreachBatch`` sink COPYs each
   micro-batch's joined rows into a PostgreSQL table. The run files are handed over in
   arrival order, ``threads`` at a time (as many runs as Strata has in flight): written
   into their input's directory, then ``processAllAvailable``, then the next ones. Two
   directories read at their own pace would let one input run ahead of the other;
3. Strata: the raw streams ``auction`` and ``bid`` and the two join streams, then
   ``threads`` clients post the runs in arrival order with ``wait=true``. Strata has no
   watermark that decides what is joined, so it runs once and is compared with Spark
   under each watermark. Then the same runs again, into streams of their own
   (``loader_auction``, ...), posted as ``strata load`` posts them: accepted without
   waiting, polled until committed (many runs in flight, so a batch holds many runs); its
   figure is against the ``wait=true`` phase of the same run, and it is checked against
   the oracle too;
4. rows lost, per join and engine: the oracle's rows the engine's output lacks, as
   multisets (``EXCEPT ALL``); rows the output has beyond the oracle are over-produced.
   Strata must lose and over-produce nothing, Spark must not over-produce;
5. the cost of a late run: with hours of data joined, ``cost_runs`` pairs of runs of
   ``cost_rows`` new bids are posted to Strata one at a time (``wait=true``): one of the
   last minute of event time, one of a minute 3 hours earlier, in alternating order; the
   medians of their latencies, late over on-time. Then both joins are checked again,
   against an oracle that holds those bids too.

Rows/s are input rows over the wall time: for Spark, from the first file written (the
queries started and idle) until every file is processed; for Strata, from the first POST
until every run is committed. The engines take turns on the same CPUs: Spark's phases
first (Strata's server up and idle), then Strata's. At full scale each gets an untimed
warm-up over a small workload of its own first. Prints a table and one JSON line (the
dict ``run`` returns); exits non-zero when Strata loses or over-produces a row (or
Spark over-produces one). The scale ``smoke`` proves only that everything works.
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
from pyspark.sql import SparkSession
from pyspark.sql import types as T  # noqa: N812 - Spark's own convention

from bench.harness.api import HTTP_TIMEOUT, create_stream, post_runs
from bench.harness.data import HOUR_MS, Dataset
from bench.harness.database import copy_baseline, fetch_one, scalar
from bench.harness.errors import BenchError
from bench.harness.lateness import HOURS_LATE
from bench.harness.nexmark import (
    AUCTION,
    BID,
    COLUMNS,
    MAX_OPEN_MS,
    Workload,
    bid_run,
    create_streams,
    generate,
)
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import Server, clean_up, start_timings, stop_problems, stop_server
from bench.harness.sss import PostgresSink, SparkJob, start_server_and_spark
from server.engines.spark import stop_spark_session

WATERMARKS = {"10 minutes": "w10m", "1 hour": "w1h"}
SPARK = "Spark Structured Streaming"
SEED = 2024
LOADER = "loader_"  # the prefix of the streams the runs are posted to without waiting
LATE_BY_MS = 3 * HOUR_MS  # how late the late runs of the cost phase are
COST_SPAN_MS = 60_000  # the event time a run of the cost phase covers
SCHEMAS = {
    AUCTION: T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("seller", T.LongType()),
            T.StructField("category", T.IntegerType()),
            T.StructField("item_name", T.StringType()),
            T.StructField("date_time", T.TimestampType()),
            T.StructField("expires", T.TimestampType()),
        ]
    ),
    BID: T.StructType(
        [
            T.StructField("auction", T.LongType()),
            T.StructField("bidder", T.LongType()),
            T.StructField("price", T.LongType()),
            T.StructField("date_time", T.TimestampType()),
        ]
    ),
}


@dataclass(frozen=True)
class Join:
    """One join, as each engine states it. Placeholders: ``{name}`` (the join stream),
    ``{auction}`` and ``{bid}`` (its inputs: raw streams in Strata, temporary views of the
    streaming inputs in Spark, plain tables in the oracle)."""

    name: str
    title: str
    columns: str  # the output's, with their PostgreSQL types (Spark's sink table)
    strata: str  # CREATE STREAM
    spark: str  # Spark SQL over the streaming inputs
    oracle: str  # PostgreSQL, a batch over every input row

    @property
    def names(self) -> str:
        return ", ".join(column.split()[0] for column in self.columns.split(", "))


JOINS = (
    Join(
        "q20",
        "interval join",
        "auction bigint, price bigint, item_name text, date_time timestamptz",
        "CREATE STREAM {name} AS SELECT b.auction, b.price, a.item_name, b.date_time "
        "FROM {bid} b JOIN {auction} a "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires",
        "SELECT b.auction, b.price, a.item_name, b.date_time FROM {bid} b JOIN {auction} a "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
        f"AND b.date_time <= a.date_time + INTERVAL {MAX_OPEN_MS // 60_000} MINUTES",
        "SELECT b.auction, b.price, a.item_name, b.date_time FROM {bid} b JOIN {auction} a "
        "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires",
    ),
    Join(
        "window_bids",
        "1-minute window join",
        "id bigint, bidder bigint, price bigint, window_start timestamptz",
        "CREATE STREAM {name} AS SELECT a.id, b.bidder, b.price, a.window_start "
        "FROM TUMBLE({auction}, date_time, INTERVAL '1 minute') a "
        "JOIN TUMBLE({bid}, date_time, INTERVAL '1 minute') b "
        "ON a.id = b.auction AND a.window_start = b.window_start",
        "SELECT a.id, b.bidder, b.price, a.window.start AS window_start "
        "FROM (SELECT id, window(date_time, '1 minute') AS window FROM {auction}) a "
        "JOIN (SELECT auction, bidder, price, window(date_time, '1 minute') AS window "
        "FROM {bid}) b ON a.id = b.auction AND a.window = b.window",
        "SELECT a.id, b.bidder, b.price, a.w FROM "
        "(SELECT id, date_bin('1 minute', date_time, '1970-01-01 00:00:00+00') AS w "
        "FROM {auction}) a JOIN "
        "(SELECT auction, bidder, price, "
        "date_bin('1 minute', date_time, '1970-01-01 00:00:00+00') AS w FROM {bid}) b "
        "ON a.id = b.auction AND a.w = b.w",
    ),
)
PLAIN = {AUCTION: "auction_plain", BID: "bid_plain"}
COST_PLAIN = "bid_cost_plain"  # the bids of the cost phase
# An output against its oracle, as multisets: rows of the oracle missing from the output
# (lost), rows of the output beyond the oracle (over-produced), and the oracle's rows.
CHECK = """
WITH oracle AS ({oracle}), output AS (SELECT {names} FROM {output})
SELECT (SELECT count(*) FROM (TABLE oracle EXCEPT ALL TABLE output) lost),
       (SELECT count(*) FROM (TABLE output EXCEPT ALL TABLE oracle) over),
       (SELECT count(*) FROM oracle)
"""


@dataclass(frozen=True)
class Scale:
    rows: int  # events (auctions and bids) of the throughput workload
    run_rows: int  # events per slice: a run of its auctions and a run of its bids
    span_hours: int
    cost_rows: int  # bids per run of the cost phase
    cost_runs: int  # runs of each kind (on time, late) counted in the cost phase
    warm_up: int  # events of each engine's untimed warm-up (0: none)


SCALES = {
    "full": Scale(400_000, 10_000, 6, 10_000, 5, 4_000),
    "smoke": Scale(4_000, 500, 6, 200, 1, 0),
}


@dataclass(frozen=True)
class Accuracy:
    rows_lost: int
    rows_over_produced: int
    oracle_rows: int


def accuracy(database_url: str, join: Join, output: str, bid: str = PLAIN[BID]) -> Accuracy:
    """The rows of ``output`` (a table or view of the join's columns) against the join as a
    batch over the plain tables (``bid``: the bids' table, or a query of them)."""
    oracle = join.oracle.format(auction=PLAIN[AUCTION], bid=bid)
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = fetch_one(conn, CHECK.format(oracle=oracle, names=join.names, output=output))
    return Accuracy(*(int(v) for v in row))


# ---- Spark Structured Streaming ------------------------------------------------------------


def start_spark_job(
    spark: SparkSession,
    database_url: str,
    *,
    sources: dict[str, Path],
    prefix: str,
    watermark: str,
    checkpoints: Path,
) -> SparkJob:
    """Both joins as streaming queries over the CSV files of ``sources`` (a directory per
    input), with ``watermark`` on both inputs' event time, appending to the PostgreSQL
    tables ``<prefix>_<join name>``."""
    inputs = {}
    for stream, directory in sources.items():
        frame = (
            spark.readStream.schema(SCHEMAS[stream])
            .option("header", True)
            .csv(str(directory))
            .withWatermark("date_time", watermark)
        )
        inputs[stream] = f"{prefix}_{stream}"
        frame.createOrReplaceTempView(inputs[stream])
    queries, sinks = [], []
    with psycopg.connect(database_url, autocommit=True) as conn:
        for join in JOINS:
            table = f"{prefix}_{join.name}"
            conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
            conn.execute(f"CREATE TABLE {table} ({join.columns})")  # type: ignore[arg-type]
            frame = spark.sql(join.spark.format(auction=inputs[AUCTION], bid=inputs[BID]))
            sink = PostgresSink(database_url, table, frame.columns)
            query = (
                frame.writeStream.queryName(table)
                .outputMode("append")
                .foreachBatch(sink)
                .option("checkpointLocation", str(checkpoints / table))
                .trigger(processingTime="0 seconds")
                .start()
            )
            queries.append(query)
            sinks.append(sink)
    return SparkJob(queries, sinks)


def spark_throughput(
    spark: SparkSession,
    database_url: str,
    workload: Workload,
    work: Path,
    watermark: str,
    step: int,
    prefix: str,
) -> tuple[Timing, dict[str, int]]:
    """Hand the run files to both queries ``step`` at a time in arrival order, each step
    once the previous one is processed; the seconds from the first file written until the
    last is processed, and the queries' progress."""
    sources = {stream: work / f"{prefix}-{stream}" for stream in (AUCTION, BID)}
    staging = work / f"{prefix}-staging"
    for directory in (*sources.values(), staging):
        directory.mkdir(parents=True)
    job = start_spark_job(
        spark,
        database_url,
        sources=sources,
        prefix=prefix,
        watermark=watermark,
        checkpoints=work / "checkpoints",
    )
    runs = workload.runs
    try:
        job.wait()  # the (empty) first batch is behind us
        started = time.monotonic()
        for first in range(0, len(runs.bodies), step):
            for index in range(first, min(first + step, len(runs.bodies))):
                name = f"run-{index:05d}.csv"
                (staging / name).write_bytes(runs.bodies[index])
                os.rename(staging / name, sources[workload.streams[index]] / name)
            job.wait()
        seconds = time.monotonic() - started
        progress = job.progress()
    finally:
        job.stop()
    notes = (
        f"watermark {watermark}, {step} files a step, {progress['data_batches']} data "
        f"batches, {progress['state_rows_dropped']:,} rows dropped as late"
    )
    return Timing(f"Spark SSS, {watermark}", runs.rows, seconds, notes), progress


# ---- Strata ------------------------------------------------------------------------------


def create_joins(client: httpx.Client, prefix: str = "") -> None:
    """The raw streams and both join streams over them, named with ``prefix``."""
    create_streams(client, prefix)
    for join in JOINS:
        create_stream(
            client,
            join.strata.format(
                name=f"{prefix}{join.name}", auction=f"{prefix}{AUCTION}", bid=f"{prefix}{BID}"
            ),
        )


def late_run_cost(
    server: Server, workload: Workload, rows: int, runs: int
) -> tuple[list[float], list[float], Dataset]:
    """Seconds of ``POST ... ?wait=true`` for ``runs`` runs of ``rows`` bids of the last
    minute of event time and as many of a minute 3 hours earlier, alternating (which kind
    goes first alternates too), after one untimed run of each; and the bodies posted."""
    on_time: list[float] = []
    late: list[float] = []
    bodies: list[bytes] = []
    head = workload.span_ms - COST_SPAN_MS
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
        for pair in range(runs + 1):
            kinds = [("on-time", head, on_time), ("late", head - LATE_BY_MS, late)]
            for kind, start, latencies in kinds if pair % 2 else kinds[::-1]:
                body = bid_run(
                    workload.auctions, SEED + len(bodies), start, start + COST_SPAN_MS, rows
                )
                started = time.monotonic()
                response = client.post(
                    f"/streams/{BID}/runs",
                    params={"wait": "true", "run_id": f"cost-{kind}-{pair}"},
                    content=body,
                    headers={"content-type": "text/csv"},
                )
                seconds = time.monotonic() - started
                if response.status_code != 200 or response.json().get("rows") != rows:
                    raise BenchError(f"{kind} run {pair}: {response.status_code} {response.text}")
                bodies.append(body)
                if pair:  # the first pair warms up
                    latencies.append(seconds)
    return on_time, late, Dataset(bodies, [rows] * len(bodies), [])


def raw_rows(database_url: str, stream: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return int(scalar(conn, f"SELECT count(*) FROM {stream}"))


# ---- the benchmark ---------------------------------------------------------------------------


def run(scale: str = "full", *, threads: int = 4, keep: bool = False) -> dict[str, Any]:
    """The whole comparison at ``scale``; returns the figures, with ``problems`` listing
    what was wrong (empty when all is right)."""
    size = SCALES[check_scale(scale)]
    started = time.monotonic()
    workload = generate(size.rows, size.run_rows, SEED, HOURS_LATE, size.span_hours * HOUR_MS)
    data = workload.runs
    warm = (
        generate(size.warm_up, size.warm_up // 2, SEED + 1, HOURS_LATE, HOUR_MS)
        if size.warm_up
        else None
    )
    late_rows = sum(data.rows_per_body[i] for i in data.late_runs)
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            f"{len(data.bodies)} runs, {data.size / 1e6:.1f} MB, {late_rows:,} rows in "
            f"{len(data.late_runs)} runs 1-6 h late",
        )
    ]
    work = Path(tempfile.mkdtemp(prefix="strata-joins-"))
    server: Server | None = None
    spark: SparkSession | None = None
    problems: list[str] = []
    results: dict[str, Any] = {
        "scale": scale,
        "rows": data.rows,
        "runs": len(data.bodies),
        "late_rows": late_rows,
        "span_hours": size.span_hours,
        "cpus": os.cpu_count(),
        "threads": threads,
    }
    failed = True
    try:
        server, spark, spark_seconds = start_server_and_spark(work, "joins-sss")
        # Every micro-batch's progress, for the rows read and dropped (100 by default).
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        timings.append(Timing("Spark session", 0, spark_seconds))
        timings += start_timings(server, server.database_url)
        url = server.database_url
        for stream in (AUCTION, BID):
            copy = copy_baseline(url, workload.of(stream), PLAIN[stream], COLUMNS[stream])
            copy.name = f"COPY {PLAIN[stream]}"
            timings.append(copy)
        results["load_average_before"] = os.getloadavg()[0]

        # Spark, once per watermark.
        if warm:
            phase = time.monotonic()
            spark_throughput(spark, url, warm, work, "1 hour", threads, "sss_warmup")
            timings.append(Timing("Spark warm-up", 0, time.monotonic() - phase))
        sss: dict[str, tuple[Timing, dict[str, int], dict[str, Accuracy]]] = {}
        for watermark, tag in WATERMARKS.items():
            prefix = f"sss_{tag}"
            timing, progress = spark_throughput(
                spark, url, workload, work, watermark, threads, prefix
            )
            timings.append(timing)
            checked = {j.name: accuracy(url, j, f"{prefix}_{j.name}") for j in JOINS}
            sss[watermark] = (timing, progress, checked)
        stop_spark_session(spark)
        spark = None

        # Strata, once: no watermark decides what it joins.
        with httpx.Client(base_url=server.url, timeout=60) as client:
            if warm:
                create_joins(client, "warmup_")
            create_joins(client)
        if warm:
            phase = time.monotonic()
            post_runs(server, warm.runs, threads, "wait", [f"warmup_{s}" for s in warm.streams])
            timings.append(Timing("Strata warm-up", 0, time.monotonic() - phase))
        strata_timing = post_runs(server, data, threads, "wait", workload.streams)
        strata_timing.name = "Strata"
        strata_timing.notes = f"{threads} clients, wait=true"
        timings.append(strata_timing)
        strata = {j.name: accuracy(url, j, j.name) for j in JOINS}
        for stream in (AUCTION, BID):
            archived, expected = raw_rows(url, stream), workload.of(stream).rows
            if archived != expected:
                problems.append(f"{stream} archived {archived} rows of {expected}")

        # The same runs posted the way a loader posts them (`strata load`: accepted, not
        # waited for), into streams of their own: batches then hold many runs.
        with httpx.Client(base_url=server.url, timeout=60) as client:
            create_joins(client, LOADER)
        loader = post_runs(server, data, threads, "async", [LOADER + s for s in workload.streams])
        loader.name = "Strata, no wait"
        loader.notes = f"{threads} clients, wait=false, then polled until committed"
        timings.append(loader)
        for join in JOINS:
            exact = accuracy(url, join, LOADER + join.name)
            if exact.rows_lost or exact.rows_over_produced:
                problems.append(f"Strata without waiting, {join.name}: {exact}")

        # The cost of a late run, then every join checked again.
        phase = time.monotonic()
        on_time, late, cost_bids = late_run_cost(server, workload, size.cost_rows, size.cost_runs)
        timings.append(
            Timing(
                "late-run cost",
                cost_bids.rows,
                time.monotonic() - phase,
                f"{len(cost_bids.bodies)} runs of {size.cost_rows:,} bids, one at a time",
            )
        )
        copy_baseline(url, cost_bids, COST_PLAIN, COLUMNS[BID])
        every_bid = f"(SELECT * FROM {PLAIN[BID]} UNION ALL SELECT * FROM {COST_PLAIN})"
        after_cost = {j.name: accuracy(url, j, j.name, every_bid) for j in JOINS}
        results["load_average_after"] = os.getloadavg()[0]

        # Figures and checks.
        results["strata_rows_per_s"] = round(strata_timing.rows_per_s)
        results["strata_seconds"] = round(strata_timing.seconds, 2)
        results["loader_rows_per_s"] = round(loader.rows_per_s)
        results["loader_seconds"] = round(loader.seconds, 2)
        results["strata"] = {name: vars(a) for name, a in strata.items()}
        after = {f"{name} after the cost phase": a for name, a in after_cost.items()}
        for name, exact in (strata | after).items():
            if exact.rows_lost or exact.rows_over_produced:
                problems.append(f"Strata, {name}: {exact}")
        throughput = {}
        for watermark, (timing, progress, checked) in sss.items():
            throughput[watermark] = {
                "sss_rows_per_s": round(timing.rows_per_s),
                "sss_seconds": round(timing.seconds, 2),
                "ratio": round(strata_timing.rows_per_s / timing.rows_per_s, 2),
                "sss": {name: vars(a) for name, a in checked.items()},
                "sss_progress": progress,
            }
            for name, a in checked.items():
                if a.rows_over_produced:
                    problems.append(f"Spark ({watermark}), {name} over-produced: {a}")
            if progress["rows_read"] != len(JOINS) * data.rows:
                problems.append(
                    f"Spark ({watermark}) read {progress['rows_read']} rows of "
                    f"{data.rows} x {len(JOINS)}"
                )
        results["throughput"] = throughput
        results["late_cost"] = {
            "rows": size.cost_rows,
            "runs": size.cost_runs,
            "on_time_p50_s": round(percentile(on_time, 0.5), 3),
            "late_p50_s": round(percentile(late, 0.5), 3),
            "ratio": round(percentile(late, 0.5) / percentile(on_time, 0.5), 2),
            "on_time_seconds": [round(s, 3) for s in on_time],
            "late_seconds": [round(s, 3) for s in late],
        }

        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        results["problems"] = problems
        results["seconds"] = round(time.monotonic() - started, 1)
        print_table(timings, phase_width=22)
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
        f"\n{rows:,} auction and bid rows in {results['runs']} runs over "
        f"{results['span_hours']} h of event time, {results['late_rows']:,} of them "
        f"({results['late_rows'] / rows:.0%}) in runs 1-6 hours late"
    )
    print(
        f"\n{'watermark':<11} {'Strata rows/s':>14} {'SSS rows/s':>11} {'ratio':>6}  "
        + "  ".join(f"{j.name + ' lost: Strata':>22} {'SSS':>16}" for j in JOINS)
    )
    for watermark, f in results["throughput"].items():
        lost = []
        for j in JOINS:
            theirs = f["sss"][j.name]
            share = theirs["rows_lost"] / max(theirs["oracle_rows"], 1)
            shown = f"{theirs['rows_lost']:,} ({share:.1%})"
            lost.append(f"{results['strata'][j.name]['rows_lost']:>22,} {shown:>16}")
        print(
            f"{watermark:<11} {results['strata_rows_per_s']:>14,} {f['sss_rows_per_s']:>11,} "
            f"{f['ratio']:>6.2f}  " + "  ".join(lost)
        )
    cost = results["late_cost"]
    print(
        f"\nruns of {cost['rows']:,} bids, {cost['runs']} of each: on time p50 "
        f"{cost['on_time_p50_s']:.3f}s, 3 hours late p50 {cost['late_p50_s']:.3f}s, "
        f"ratio {cost['ratio']:.2f}"
    )
    print(
        f"\n{results['cpus']} CPUs; load average (1 min) {results['load_average_before']:.2f} "
        f"before, {results['load_average_after']:.2f} after; {results['seconds']}s in all"
    )
    if results["problems"]:
        print("\nWRONG:\n  " + "\n  ".join(results["problems"]), file=sys.stderr)
    print(json.dumps(results))


def figures(results: dict[str, Any]) -> list[Result]:
    """The figures of ``run`` for bench/run.py: Strata against Spark, same run."""
    rows = results["rows"]
    workload = (
        f"{rows:,} auction and bid rows, {results['late_rows'] / rows:.0%} in runs 1-6 h late"
    )
    out = []
    for watermark, f in results["throughput"].items():
        context = {"strata_seconds": results["strata_seconds"], "sss_seconds": f["sss_seconds"]}
        out.append(
            Result(
                f"interval and window join ({workload}): input rows/s (Spark watermark "
                f"{watermark})",
                results["strata_rows_per_s"],
                f["sss_rows_per_s"],
                SPARK,
                "rows/s",
                "higher",
                context=context | {"rows": rows},
            )
        )
        for join in JOINS:
            ours, theirs = results["strata"][join.name], f["sss"][join.name]
            out.append(
                Result(
                    f"{join.title}: joined rows missing (Spark watermark {watermark})",
                    ours["rows_lost"],
                    theirs["rows_lost"],
                    SPARK,
                    "rows",
                    "lower",
                    context={
                        "oracle_rows": theirs["oracle_rows"],
                        "strata_rows_over_produced": ours["rows_over_produced"],
                        "sss_rows_over_produced": theirs["rows_over_produced"],
                    },
                )
            )
    out.append(
        Result(
            f"interval and window join ({workload}): input rows/s, runs posted without waiting "
            "as a loader posts them",
            results["loader_rows_per_s"],
            results["strata_rows_per_s"],
            f"Strata, the same runs with wait=true from {results['threads']} clients",
            "rows/s",
            "higher",
            context={"loader_seconds": results["loader_seconds"], "rows": rows},
        )
    )
    cost = results["late_cost"]
    out.append(
        Result(
            f"a run of {cost['rows']:,} bids 3 h late, after {results['span_hours']} h of "
            f"joined data (POST wait=true, median of {cost['runs']})",
            cost["late_p50_s"],
            cost["on_time_p50_s"],
            f"an on-time run of {cost['rows']:,} bids",
            "s",
            "lower",
            context={"runs": cost["runs"]},
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
    parser.add_argument(
        "--threads",
        type=int,
        default=4,
        help="Strata client threads; run files handed to Spark a step (4)",
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
