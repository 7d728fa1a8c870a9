"""The Spark backend: runs the partial queries of plans over batches of runs.

It only executes plans the rewriter made. One long-lived SparkSession is shared; each
thread gets its own child session (``newSession``) so the temporary view holding a
batch's rows never collides between ingestion and back-fill.

When the driver JVM dies (killed, out of memory), the job in flight fails with a py4j
error; the backend then starts a new session (``restart``) and raises SparkRestarted, and
the caller retries the work. Nothing was written: partials are computed before the
PostgreSQL transaction that commits them.

When Strata stops, ``close()`` cancels the jobs in flight and refuses new ones: they raise
SparkStopped, and their runs stay pending for the next start. A job that fails because
the context stopped under it (the JVM was signalled too) counts as the JVM's death, never
as a fault of the data, so no run is rejected for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import suppress

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from rewriter.naming import (
    RUN_ROWS_VIEW,
    join_input_view,
    join_view,
    partial_view,
    projection_view,
)
from rewriter.plan import JoinStreamPlan, ParallelAggregatePlan, ProjectionStreamPlan
from server.catalog import ComputedPlan
from server.engines.cluster import executors_share_disk
from server.engines.spark import (
    discard_spark_session,
    jvm_died,
    kill_driver_jvms,
    stop_spark_session,
)
from server.ingest.joins import JoinProbes, JoinTerm

log = logging.getLogger(__name__)

_PARALLEL_JOBS = 4

# Batches of at most this many rows, for two or more streams, are read as one partition.
# Spark then plans every GROUP BY of the batch without a shuffle (one partition satisfies
# any distribution): each job is one stage of one task instead of a scan stage, shuffle
# files and a reduce stage, and the jobs, side by side, keep the cores busy. In a profile
# of three streams over 50,000-row runs this took 15% of the JVM's CPU time per batch.
# Larger batches (back-fill chunks) and a lone stream keep Spark's parallelism.
SINGLE_TASK_ROWS = 250_000

# Batches of at most this many rows go to Spark from the driver's memory even when the
# executors could read their spooled files: for a few runs of a few hundred rows, listing,
# opening and decoding the files costs more than shipping the rows (a join of 160 rows with
# its probe: 120 ms a batch instead of 148 ms; 10,000 rows: 165-180 ms instead of 170-230).
SHIPPED_ROWS = 10_000


class SparkRestarted(Exception):  # noqa: N818 - names what happened, the caller retries
    """The Spark JVM died during the job and was started again; retry the job."""


class SparkStopped(Exception):  # noqa: N818 - names what happened, the caller gives up
    """Strata is stopping: the job was cancelled or not started; its work waits for the
    next start."""


class SparkBackend:
    def __init__(
        self,
        spark: SparkSession,
        restart: Callable[[], SparkSession] | None = None,
        *,
        shared_spool: bool | None = None,
        single_task_rows: int = SINGLE_TASK_ROWS,
        shipped_rows: int = SHIPPED_ROWS,
    ) -> None:
        self.spark = spark
        self.single_task_rows = single_task_rows
        self.shipped_rows = shipped_rows
        self._restart = restart
        self._generation = 0  # sessions of earlier generations belong to a dead JVM
        self._lock = threading.Lock()
        self._local = threading.local()
        # Executors that share the driver's disk (local mode, a cluster on loopback, or
        # shared storage: STRATA_SHARED_SPOOL) read spooled runs straight from their files;
        # other executors get the rows shipped from the driver.
        self.reads_files = executors_share_disk(spark.sparkContext.master or "", shared_spool)
        # The Spark schema of spooled files, per Arrow schema: inferring it reads the files'
        # footers on the driver for every batch.
        self._file_schemas: dict[pa.Schema, StructType] = {}
        # Each aggregate's partial rows come from one Spark job; the jobs of a batch run side
        # by side, so that one job's scheduling and planning overlap another's tasks.
        self._jobs = ThreadPoolExecutor(max_workers=_PARALLEL_JOBS, thread_name_prefix="strata-job")
        self._closing = threading.Event()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        """Refuse new jobs and cancel those running (Strata is stopping); do not wait."""
        self._closing.set()
        with suppress(Exception):  # a JVM already gone has nothing to cancel
            self.spark.sparkContext.cancelAllJobs()

    def stop(self, timeout: float) -> None:
        """Close, then stop the session and its JVM within about ``timeout`` seconds. A
        restart under way (the JVM died just before the stop) is cut short: the JVM it is
        launching is killed, and the launch fails at once."""
        deadline = time.monotonic() + timeout
        self.close()
        locked = self._lock.acquire(timeout=min(1.0, timeout / 4))
        if not locked:
            log.warning("Spark is being started again; ending its new JVM")
            kill_driver_jvms()
            locked = self._lock.acquire(timeout=max(0.1, deadline - time.monotonic()))
        try:
            stop_spark_session(self.spark, max(0.0, deadline - time.monotonic()))
        finally:
            if locked:
                self._lock.release()

    def collect_garbage(self) -> None:
        """A full garbage collection in the driver's JVM, which then returns the heap it
        no longer needs to the operating system."""
        session, _ = self._session()
        jvm = session.sparkContext._jvm
        assert jvm is not None
        jvm.java.lang.System.gc()

    def _session(self) -> tuple[SparkSession, int]:
        with self._lock:  # waits while a restart is under way
            cached = getattr(self._local, "session", None)
            if cached is None or cached[1] != self._generation:
                cached = self._local.session = (self.spark.newSession(), self._generation)
            return cached  # type: ignore[no-any-return]

    def _recover(self, generation: int, error: Exception) -> None:
        """After a failed job: if Strata is stopping, raise SparkStopped; if the JVM of
        ``generation`` is dead, make sure a new one runs and raise SparkRestarted;
        otherwise let the caller see ``error``."""
        if self.closing:
            raise SparkStopped("Strata is stopping; the job was cancelled") from error
        with self._lock:
            if generation == self._generation:
                # A failing query leaves the JVM running; a lost connection may mean it died.
                grace = 0.0 if isinstance(error, PySparkException) else 1.0
                if not (jvm_died(self.spark, grace) or self._context_stopped()):
                    return
                if self.closing:  # the signal reached the JVM first
                    raise SparkStopped("Strata is stopping; the job was cancelled") from error
                if self._restart is None:
                    raise SparkRestarted("the Spark JVM died, and this backend cannot restart it")
                log.warning("the Spark JVM died (%s); starting a new one", error)
                discard_spark_session(self.spark)
                self.spark = self._restart()
                self._generation += 1
        raise SparkRestarted("the Spark JVM died during the job; it runs again") from error

    def executors(self) -> list[dict[str, object]]:
        """The executors the application has now, as Spark's driver knows them: the
        address of each and the tasks it runs. The driver is not one (local Spark has
        none)."""
        try:
            context = self.spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
            driver = str(context.env().blockManager().blockManagerId().hostPort())
            found = [
                (f"{info.host()}:{info.port()}", int(info.numRunningTasks()))
                for info in context.statusTracker().getExecutorInfos()
            ]
        except Exception:  # noqa: BLE001 - a JVM gone or restarting: nothing to show
            return []
        return [
            {"address": address, "running_tasks": tasks}
            for address, tasks in sorted(found)
            if address != driver
        ]

    def _context_stopped(self) -> bool:
        """Whether the SparkContext stopped under us: its JVM got SIGTERM (Spark's shutdown
        hook stops the context, then the JVM exits) or cannot be reached any more."""
        try:
            jsc = self.spark.sparkContext._jsc
            return jsc is None or bool(jsc.sc().isStopped())
        except Exception:
            return True

    def partials(
        self,
        rows: pa.Table,
        plans: list[ComputedPlan],
        *,
        source: str,
        files: list[str] | None = None,
        probes: JoinProbes | None = None,
        input_view: str = RUN_ROWS_VIEW,
    ) -> dict[str, pa.Table]:
        """Partial rows of every parallel plan over ``rows``, a batch of runs of the raw
        stream ``source`` (with the run column), and the rows the batch adds to every join
        in ``plans`` (computed against ``probes``). Projections in ``plans`` only map the
        rows for the plans after them. ``files``, when given, are Parquet files holding
        ``rows``; ``input_view`` is the view the first plans read them from (a back-fill
        over a join stream's archive reads them as that join's rows).
        """
        aggregates = [p for p in plans if isinstance(p, ParallelAggregatePlan | JoinStreamPlan)]
        if not aggregates or rows.num_rows == 0:
            return {plan.name: pa.table({}) for plan in aggregates}
        if self.closing:
            raise SparkStopped("Strata is stopping; no new Spark job")
        generation = self._generation
        try:
            session, generation = self._session()
            return self._partials(
                session, rows, plans, aggregates, source, files, probes, input_view
            )
        except Exception as error:
            self._recover(generation, error)
            raise

    def _partials(
        self,
        session: SparkSession,
        rows: pa.Table,
        plans: list[ComputedPlan],
        aggregates: list[ParallelAggregatePlan | JoinStreamPlan],
        source: str,
        files: list[str] | None,
        probes: JoinProbes | None,
        input_view: str,
    ) -> dict[str, pa.Table]:
        # One partition only when the batch's jobs, running side by side, keep the cores
        # busy: a lone job keeps Spark's parallel plan.
        frame = self._read(session, rows, files, single=len(aggregates) > 1)
        frame.createOrReplaceTempView(input_view)
        # Plans come in creation order: a roll-up reads the partial rows of the stream below
        # it, an aggregate over a projection reads the projection's rows; both are
        # registered under view names and kept in memory for the batch, so that their
        # rows are computed once. The batch's own rows are read again by each job: reading
        # the spooled Parquet files costs less than caching them.
        read_by_others = {
            p.partial_input for p in aggregates if isinstance(p, ParallelAggregatePlan)
        }
        cached: list[DataFrame] = []
        views: list[str] = []
        outputs: dict[str, DataFrame] = {}
        try:
            for plan in plans:
                if isinstance(plan, ProjectionStreamPlan):
                    branch = plan.branch(source)
                    assert branch is not None, f"{plan.name} reads no runs of {source}"
                    output, view = session.sql(branch.spark_query), projection_view(plan.name)
                elif isinstance(plan, JoinStreamPlan):
                    assert probes is not None, f"{plan.name} was not probed"
                    terms = probes.terms[plan.name]
                    output = _joined(session, plan, terms, frame, source)
                    view = join_view(plan.name)
                else:
                    assert isinstance(plan, ParallelAggregatePlan), f"{plan.name} is serial"
                    output, view = session.sql(plan.partial_query), partial_view(plan.name)
                if view in read_by_others:
                    output.cache()
                    cached.append(output)
                    output.createOrReplaceTempView(view)
                    views.append(view)
                if isinstance(plan, ParallelAggregatePlan | JoinStreamPlan):
                    outputs[plan.name] = output
            # A job that reads a cached frame another job is computing waits for its blocks.
            jobs = {name: self._jobs.submit(output.toArrow) for name, output in outputs.items()}
            wait(jobs.values())  # all of them, even when one fails, before the clean-up
            return {name: job.result() for name, job in jobs.items()}
        finally:
            for frame_ in cached:
                frame_.unpersist()
            for view in [*views, input_view, *_join_input_views(plans)]:
                session.catalog.dropTempView(view)

    def _read(
        self, session: SparkSession, rows: pa.Table, files: list[str] | None, *, single: bool
    ) -> DataFrame:
        frame = self._scan(session, rows, files)
        return frame.coalesce(1) if single and rows.num_rows <= self.single_task_rows else frame

    def _scan(self, session: SparkSession, rows: pa.Table, files: list[str] | None) -> DataFrame:
        if not (files and self.reads_files):
            return session.createDataFrame(rows)
        if rows.num_rows <= self.shipped_rows:
            # With the schema Spark reads the files with (naive timestamps as TIMESTAMP_NTZ),
            # so that a batch means the same whichever way it comes.
            shipped = from_arrow_schema(rows.schema, prefer_timestamp_ntz=True)
            return session.createDataFrame(rows, schema=shipped)
        schema = self._file_schemas.get(rows.schema)
        if schema is None:
            frame = session.read.parquet(*files)
            self._file_schemas[rows.schema] = frame.schema
            return frame
        return session.read.schema(schema).parquet(*files)


def _join_input_views(plans: list[ComputedPlan]) -> list[str]:
    widest = max((len(p.inputs) for p in plans if isinstance(p, JoinStreamPlan)), default=0)
    return [join_input_view(k) for k in range(widest)]


def _joined(
    session: SparkSession,
    plan: JoinStreamPlan,
    terms: list[JoinTerm],
    batch: DataFrame,
    source: str,
) -> DataFrame:
    """The rows the batch adds to the join: the union of its terms (server/ingest/joins.py).
    Each term's query is analysed while its inputs' views hold that term's rows."""
    parts: list[DataFrame] = []
    for term in terms:
        for position, entry in enumerate(plan.inputs):
            if position == term.delta:
                rows = batch
            else:
                rows = session.createDataFrame(term.rows[position])
                if position < term.delta and entry.source == source:
                    rows = rows.unionByName(batch.select(*rows.columns))
            rows.createOrReplaceTempView(join_input_view(position))
        parts.append(session.sql(plan.term_queries[term.delta]))
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.unionByName(part)
    return joined
