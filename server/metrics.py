"""What `GET /metrics` shows, in Prometheus's text format.

Two kinds of figures:

* events, counted where they happen in this process (runs committed or rejected, rows, late
  rows, run latency, items the background workers handled, their failures, HTTP errors):
  counters and a histogram, which start from zero when the server starts, as Prometheus
  expects;
* state kept in PostgreSQL (rows waiting in the spool, partial rows per archive, windows
  awaiting repair, back-fill and serial progress, watermarks), read when /metrics is
  scraped, with a few cheap queries on the catalog.

Every Metrics has a registry of its own (never prometheus_client's global one), so several
servers (tests build many in one process) do not clash.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg import sql

from rewriter.naming import INTERNAL_SCHEMA, partial_archive_table
from rewriter.plan import ParallelAggregatePlan
from server import catalog
from server.catalog import PlanCache
from server.sinks.store import load_sinks

log = logging.getLogger("strata.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# POST -> committed, in seconds: from a small run on an idle server to a large run queued
# behind others.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Partial archives up to this many 8 KiB pages (8 MiB) are counted exactly at each scrape;
# larger ones are estimated from PostgreSQL's statistics.
EXACT_COUNT_PAGES = 1024
# Acceptance times of runs not yet committed: bounded, should runs never finish (their
# stream dropped meanwhile, say).
MAX_TRACKED_RUNS = 100_000


class Metrics:
    """The counters of one Strata server and its registry."""

    def __init__(self, engine: sa.Engine, plans: PlanCache) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.runs_committed = Counter(
            "strata_runs_committed",
            "Runs committed (visible in every archive), by raw stream.",
            ["stream"],
            registry=registry,
        )
        self.rows_ingested = Counter(
            "strata_rows_ingested",
            "Rows of committed runs, by raw stream.",
            ["stream"],
            registry=registry,
        )
        self.late_rows = Counter(
            "strata_late_rows",
            "Rows committed behind their stream's watermark (archived like any other row), "
            "by raw stream.",
            ["stream"],
            registry=registry,
        )
        self.runs_rejected = Counter(
            "strata_runs_rejected",
            "Runs accepted, then rejected (Spark or PostgreSQL refused their rows, or their "
            "spool file was lost); nothing of them is archived. By raw stream.",
            ["stream"],
            registry=registry,
        )
        self.run_latency = Histogram(
            "strata_run_latency_seconds",
            "Seconds from a run's POST to its commit, for runs accepted by this process, "
            "by raw stream.",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_runs = Histogram(
            "strata_batch_runs",
            "Runs committed together in one batch (one Spark job, one transaction), by raw "
            "stream: batches grow while runs wait.",
            ["stream"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=registry,
        )
        self.batch_rows = Histogram(
            "strata_batch_rows",
            "Rows committed together in one batch, by raw stream.",
            ["stream"],
            buckets=(1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_000_000),
            registry=registry,
        )
        self.run_slowdown = Histogram(
            "strata_run_slowdown",
            "A run's response time (POST to commit) divided by the time its batch took to "
            "compute and commit (1: it never waited), by raw stream.",
            ["stream"],
            buckets=(1, 1.5, 2, 3, 5, 10, 20, 50, 100),
            registry=registry,
        )
        self.worker_items = Counter(
            "strata_worker_items",
            "Items background workers handled, by worker and stream: the reducer's (window, "
            "group)s folded, the materializer's windows archived, the repairer's windows "
            "repaired, retention's deletions, the back-filler's chunks.",
            ["worker", "stream"],
            registry=registry,
        )
        self.worker_failures = Counter(
            "strata_worker_failures",
            "Failed steps of background work, retried later (ingest: a batch of runs to "
            "compute or commit; others: one stream's turn, or a whole pass).",
            ["worker"],
            registry=registry,
        )
        self.stage_seconds = Counter(
            "strata_ingest_stage_seconds",
            "Seconds spent in each stage of ingestion, summed over runs and batches: parse "
            "(request body to Arrow, in the request), spool (the durable spool file and "
            "the run's catalog row), spark (the partial rows of a batch), postgres (the "
            "commit transaction: raw rows, partial rows, progress). Stages of different "
            "runs overlap, so the sum can exceed the wall-clock time.",
            ["stage"],
            registry=registry,
        )
        self.http_errors = Counter(
            "strata_http_errors",
            "HTTP error responses (4xx and 5xx), by status and error class.",
            ["status", "error"],
            registry=registry,
        )
        self.warmup_left = Gauge(
            "strata_spark_warmup_batches_left",
            "Batches of Spark's start-up warm-up still to run (STRATA_SPARK_WARMUP); 0 once "
            "it is done.",
            registry=registry,
        )
        registry.register(CatalogCollector(engine, plans))
        self._accepted: dict[int, float] = {}
        self._lock = threading.Lock()

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (reads PostgreSQL)."""
        return generate_latest(self.registry)

    # ---- events ----------------------------------------------------------------------

    def run_accepted(self, seq: int) -> None:
        with self._lock:
            if len(self._accepted) >= MAX_TRACKED_RUNS:
                self._accepted.pop(next(iter(self._accepted)))
            self._accepted[seq] = time.monotonic()

    def runs_done(
        self,
        stream: str,
        seqs: Iterable[int],
        rows: int,
        late_rows: int,
        processing: float | None = None,
    ) -> None:
        """Runs ``seqs`` of ``stream`` committed as one batch, with ``rows`` rows in all,
        which took ``processing`` seconds to compute and commit."""
        now = time.monotonic()
        with self._lock:
            accepted = [self._accepted.pop(seq, None) for seq in seqs]
        self.runs_committed.labels(stream).inc(len(accepted))
        self.rows_ingested.labels(stream).inc(rows)
        self.late_rows.labels(stream).inc(late_rows)
        self.batch_runs.labels(stream).observe(len(accepted))
        self.batch_rows.labels(stream).observe(rows)
        latency = self.run_latency.labels(stream)
        for at in accepted:
            if at is not None:  # runs resumed after a restart have no POST time here
                latency.observe(now - at)
                if processing:
                    self.run_slowdown.labels(stream).observe(max((now - at) / processing, 1.0))

    def run_rejected(self, stream: str, seq: int) -> None:
        with self._lock:
            self._accepted.pop(seq, None)
        self.runs_rejected.labels(stream).inc()

    def stage_took(self, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(stage).inc(seconds)

    def worker_handled(self, worker: str, stream: str, items: int) -> None:
        self.worker_items.labels(worker, stream).inc(items)

    def worker_failed(self, worker: str) -> None:
        self.worker_failures.labels(worker).inc()

    def http_error(self, status: int, error: str) -> None:
        self.http_errors.labels(str(status), error).inc()


# ---- Spark's executors --------------------------------------------------------------------


class ExecutorCollector(Collector):
    """The executors Spark's driver has at each scrape (workers join and leave a
    standalone cluster while Strata runs): how many, and the tasks they run."""

    def __init__(self, executors: Callable[[], list[dict[str, object]]]) -> None:
        self.executors = executors

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        found = self.executors()
        count = GaugeMetricFamily(
            "strata_spark_executors",
            "Executors Spark's driver has (0 with local Spark, where the driver computes).",
        )
        count.add_metric([], len(found))
        tasks = GaugeMetricFamily(
            "strata_spark_running_tasks", "Tasks the executors are running now."
        )
        tasks.add_metric([], sum(int(str(e["running_tasks"])) for e in found))
        yield count
        yield tasks


# ---- state in PostgreSQL -----------------------------------------------------------------


class CatalogCollector(Collector):
    """Gauges read from the catalog at each scrape. If PostgreSQL cannot be reached, the
    scrape still answers, with ``strata_catalog_up 0`` and the in-process figures."""

    def __init__(self, engine: sa.Engine, plans: PlanCache) -> None:
        self.engine = engine
        self.plans = plans

    def describe(self) -> Iterator[Metric]:
        return iter(())  # gauges appear and go with streams: nothing fixed to check

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "strata_catalog_up", "1 if the figures read from PostgreSQL are there, else 0."
        )
        try:
            with self.engine.connect() as connection:
                families = list(self._read(connection))
        except sa.exc.SQLAlchemyError as error:
            log.warning("metrics: cannot read the catalog: %s", str(error).splitlines()[0])
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self, connection: sa.Connection) -> Iterator[Metric]:
        runs = catalog.runs
        spool_rows = GaugeMetricFamily(
            "strata_spool_rows",
            "Rows of accepted runs not committed yet (held in the spool), by raw stream.",
            labels=["stream"],
        )
        spool_runs = GaugeMetricFamily(
            "strata_spool_runs",
            "Accepted runs not committed yet, by raw stream.",
            labels=["stream"],
        )
        for row in connection.execute(
            sa.select(runs.c.stream, sa.func.count(), sa.func.coalesce(sa.func.sum(runs.c.rows), 0))
            .where(runs.c.status == "pending")
            .group_by(runs.c.stream)
        ):
            spool_runs.add_metric([row[0]], row[1])
            spool_rows.add_metric([row[0]], row[2])
        yield spool_rows
        yield spool_runs

        yield self._partial_rows(connection)

        corrections = catalog.corrections
        awaiting = GaugeMetricFamily(
            "strata_repair_windows_pending",
            "Closed windows of serial streams that late data reached and that await repair.",
            labels=["stream"],
        )
        awaiting_rows = GaugeMetricFamily(
            "strata_repair_late_rows_pending",
            "Late rows behind the windows awaiting repair, by serial stream.",
            labels=["stream"],
        )
        for row in connection.execute(
            sa.select(
                corrections.c.stream,
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(corrections.c.late_rows), 0),
            ).group_by(corrections.c.stream)
        ):
            awaiting.add_metric([row[0]], row[1])
            awaiting_rows.add_metric([row[0]], row[2])
        yield awaiting
        yield awaiting_rows

        serial = catalog.serial_progress
        windows = GaugeMetricFamily(
            "strata_serial_windows_materialized",
            "Windows a serial stream has archived.",
            labels=["stream"],
        )
        until = GaugeMetricFamily(
            "strata_serial_materialized_until_seconds",
            "Unix time up to which a serial stream's windows are archived.",
            labels=["stream"],
        )
        for row in connection.execute(
            sa.select(serial.c.stream, serial.c.windows, serial.c.materialized_until)
        ):
            windows.add_metric([row.stream], row.windows or 0)
            if row.materialized_until is not None:
                until.add_metric([row.stream], row.materialized_until.timestamp())
        yield windows
        yield until

        backfills = catalog.backfills
        total = GaugeMetricFamily(
            "strata_backfill_rows",
            "Rows of history a new stream's back-fill covers.",
            labels=["stream"],
        )
        done = GaugeMetricFamily(
            "strata_backfill_rows_done", "Rows of history back-filled so far.", labels=["stream"]
        )
        running = GaugeMetricFamily(
            "strata_backfill_running",
            "1 while a stream's back-fill is not done.",
            labels=["stream"],
        )
        for row in connection.execute(sa.select(backfills)):
            total.add_metric([row.stream], row.total_rows or 0)
            done.add_metric([row.stream], row.done_rows or 0)
            running.add_metric([row.stream], 1 if row.finished_at is None else 0)
        yield total
        yield done
        yield running

        progress = catalog.stream_progress
        watermark = GaugeMetricFamily(
            "strata_watermark_seconds",
            "Unix time of a raw stream's watermark (its latest event time less its delay).",
            labels=["stream"],
        )
        for row in connection.execute(
            sa.select(progress.c.stream, progress.c.watermark).where(
                progress.c.watermark.is_not(None)
            )
        ):
            watermark.add_metric([row.stream], row.watermark.timestamp())
        yield watermark
        yield from self._sinks(connection)

    @staticmethod
    def _sinks(connection: sa.Connection) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "strata_sink_lag_changes",
            "Changes of a sink's stream committed and not yet delivered by the sink (CREATE "
            "SINK), as this server knows its position; absent before its first delivery.",
            labels=["sink", "stream"],
        )
        delivered = GaugeMetricFamily(
            "strata_sink_position",
            "The last change position a sink delivered, as this server knows it.",
            labels=["sink", "stream"],
        )
        failing = GaugeMetricFamily(
            "strata_sink_failing",
            "1 while a sink's last attempt failed (state retrying or broken; the error is in "
            "GET /streams/{name}), else 0.",
            labels=["sink", "stream"],
        )
        for sink in load_sinks(connection):
            labels = [sink.name, sink.stream]
            if sink.lag is not None:
                lag.add_metric(labels, sink.lag)
            if sink.position is not None:
                delivered.add_metric(labels, sink.position)
            failing.add_metric(labels, 1 if sink.state in ("retrying", "broken") else 0)
        yield lag
        yield delivered
        yield failing

    def _partial_rows(self, connection: sa.Connection) -> Metric:
        family = GaugeMetricFamily(
            "strata_partial_rows",
            "Rows in a derived stream's partial archive (what the reducer folds): exact up to "
            f"{EXACT_COUNT_PAGES * 8 // 1024} MiB, above that an estimate, pg_class.reltuples "
            "(PostgreSQL's statistics) scaled to the table's current size.",
            labels=["stream"],
        )
        streams = {
            partial_archive_table(name): name
            for name, record in self.plans.load(connection).items()
            if isinstance(record.plan, ParallelAggregatePlan)
        }
        if not streams:
            return family
        tables = connection.execute(
            sa.text(
                "SELECT c.relname, c.reltuples, c.relpages, "
                "pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relname = ANY(:names)"
            ),
            {"schema": INTERNAL_SCHEMA, "names": sorted(streams)},
        ).all()
        driver = connection.connection.driver_connection
        for table in tables:
            if table.pages > EXACT_COUNT_PAGES and table.reltuples >= 0:
                rows = table.reltuples
                if table.relpages > 0:  # rows per page at the last ANALYZE, times pages now
                    rows = table.reltuples / table.relpages * table.pages
            else:
                name = sql.Identifier(INTERNAL_SCHEMA, table.relname).as_string(driver)
                try:
                    with connection.begin_nested():  # the stream may be dropped meanwhile
                        rows = connection.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar()
                except sa.exc.ProgrammingError:
                    continue
            family.add_metric([streams[table.relname]], round(rows or 0))
        return family
