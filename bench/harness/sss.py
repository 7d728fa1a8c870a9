"""Spark Structured Streaming as a baseline (peer_sss, hibench): what a competent Spark user
builds to get streaming results into PostgreSQL. A SparkSession in the benchmark's process
(local[*], the JVM found the way Strata finds it), streaming queries over a directory of
CSV run files, and ``foreachBatch`` sinks that COPY each micro-batch into PostgreSQL."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow.csv as pa_csv
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from bench.harness.errors import BenchError
from bench.harness.server import Server, start_server, stop_server
from server.engines.spark import create_spark_session, stop_spark_session


class PostgresSink:
    """``foreachBatch`` sink: COPYs each micro-batch's rows into ``table`` (no ``keys``:
    appended), or into a staging table from which they are upserted into ``table`` on
    ``keys`` (``INSERT ... ON CONFLICT DO UPDATE``: a replayed micro-batch overwrites each
    row with Spark's state), in one transaction. Notes the time each non-empty batch
    commits: its rows are then visible in PostgreSQL."""

    def __init__(
        self, database_url: str, table: str, columns: list[str], keys: tuple[str, ...] = ()
    ) -> None:
        self.database_url = database_url
        self.table = table
        self.columns = columns
        self.keys = keys
        self.conn: psycopg.Connection | None = None
        self.batches = 0
        self.rows = 0
        self.commits: list[float] = []  # time.monotonic() of each commit

    def __call__(self, batch: DataFrame, epoch_id: int) -> None:
        rows = batch.toArrow()
        if rows.num_rows == 0:
            return
        body = io.BytesIO()
        pa_csv.write_csv(rows, body, pa_csv.WriteOptions(include_header=False))
        if self.conn is None:
            self.conn = psycopg.connect(self.database_url)
            if self.keys:
                self.conn.execute(
                    f"CREATE TEMP TABLE stage (LIKE {self.table}) ON COMMIT DELETE ROWS"  # type: ignore[arg-type]
                )
                self.conn.commit()
        names = ", ".join(self.columns)
        target = "stage" if self.keys else self.table
        with self.conn.transaction(), self.conn.cursor() as cursor:
            with cursor.copy(f"COPY {target} ({names}) FROM STDIN (FORMAT csv)") as copy:  # type: ignore[arg-type]
                copy.write(body.getvalue())
            if self.keys:
                keys = ", ".join(self.keys)
                updates = ", ".join(
                    f"{c} = EXCLUDED.{c}" for c in self.columns if c not in self.keys
                )
                cursor.execute(
                    f"INSERT INTO {self.table} ({names}) SELECT {names} FROM stage "  # type: ignore[arg-type]
                    f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
                )
        self.commits.append(time.monotonic())
        self.batches += 1
        self.rows += rows.num_rows

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


@dataclass
class SparkJob:
    """Streaming queries and their sinks, watched and stopped together."""

    queries: list[StreamingQuery]
    sinks: list[PostgresSink]

    def check(self) -> None:
        for query in self.queries:
            error = query.exception()
            if error is not None:
                raise BenchError(f"Spark query {query.name} failed: {error}")

    def wait(self) -> None:
        """Until every query has processed every file available (``processAllAvailable``)."""
        for query in self.queries:
            query.processAllAvailable()
        self.check()

    def stop(self) -> None:
        for query in self.queries:
            query.stop()
        for sink in self.sinks:
            sink.close()

    def progress(self) -> dict[str, int]:
        """Rows read by the queries and rows their stateful operators dropped as late (the
        latter counts rows entering the aggregation, which may be partial aggregates)."""
        read = dropped = batches = 0
        for query in self.queries:
            for p in query.recentProgress:
                read += p["numInputRows"]
                batches += 1 if p["numInputRows"] else 0
                dropped += sum(s.get("numRowsDroppedByWatermark", 0) for s in p["stateOperators"])
        return {"rows_read": read, "data_batches": batches, "state_rows_dropped": dropped}


def start_server_and_spark(work: Path, app_name: str) -> tuple[Server, SparkSession, float]:
    """`strata up` with the data dir ``work`` and, meanwhile, a SparkSession in this process
    (local[*], logging errors only): the two start-ups overlap. Returns both and the seconds
    the session took to start; when either fails, the other is stopped."""
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start_server, work)
        started = time.monotonic()
        try:
            spark = create_spark_session(
                "local[*]", app_name=app_name, local_dir=work / "sss-spark"
            )
            spark.sparkContext.setLogLevel("ERROR")
        except BaseException:
            with suppress(Exception):  # the session's failure is the one to report
                stop_server(starting.result())
            raise
        spark_seconds = time.monotonic() - started
        try:
            server = starting.result()
        except BaseException:
            stop_spark_session(spark)
            raise
    return server, spark, spark_seconds
