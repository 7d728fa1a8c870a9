"""Assembling a running Strata: ``assemble`` wires the service, the ingest pipeline and the
background workers from ``Settings``; ``running`` also starts PostgreSQL (embedded or
external), migrations and Spark around it. `strata up` and the tests wire through the same
``assemble``; a test that wants fewer workers says so in its Settings."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from pyspark.sql import SparkSession

from server import faults
from server.catalog import PlanCache, create_catalog_engine, migrate
from server.comments import comment_all
from server.engines.backend import SparkBackend
from server.engines.embedded_pg import EmbeddedPostgres, Supervisor, stored_url
from server.engines.spark import Starting, create_spark_session, jvm_pid, kill_driver_jvms
from server.engines.warmup import Warmup
from server.ingest.pipeline import IngestPipeline
from server.ingest.spool import Spool
from server.metrics import ExecutorCollector, Metrics
from server.pgwire.server import SqlPort
from server.replication.metrics import ClusterCollector
from server.replication.node import Node
from server.replication.puller import DdlFollower, Puller, Settler
from server.security import configure_reader, secret, write_private_file
from server.service import StrataService
from server.settings import ALL_WORKERS, Settings
from server.sharing.membership import LeaseCollector, Membership, new_server_id
from server.sharing.runs import SharedRuns
from server.shutdown import SPARK_SHARE, WORK_SHARE, Shutdown
from server.sinks.worker import SinkWorker
from server.workers.backfill import Backfiller
from server.workers.loop import Background, Worker
from server.workers.reducer import Reducer
from server.workers.retention import Retention
from server.workers.serial import Materializer, Repairer
from server.workers.swapper import Swapper

log = logging.getLogger("strata")
INFO_FILE = "info.json"


@dataclass
class Runtime:
    """Everything of one Strata server that runs in this process, wired, not yet started."""

    settings: Settings
    database_url: str
    engine: sa.Engine
    backend: SparkBackend
    service: StrataService
    sql_port: SqlPort
    warmup: Warmup
    workers: dict[str, Worker] = field(default_factory=dict)  # by name, as in Settings.workers
    # In a cluster: the threads that pull peers' runs and follow the owner's DDL.
    replication: list[Background] = field(default_factory=list)
    # With servers sharing the database: this one's heartbeat, leases and claims.
    membership: Membership | None = None

    def info(self) -> dict[str, object]:
        return {
            "database_url": self.database_url,
            # The SQL port's URL once it listens: psql there runs Strata's statements too.
            "psql_url": self.sql_port.psql_url if self.sql_port.port is not None else None,
            "spark_master": self.settings.spark_master or "local[*]",
            # Whether executors read spooled runs from their files (see STRATA_SHARED_SPOOL).
            "shared_spool": self.backend.reads_files,
            "data_dir": str(self.settings.data_dir.resolve()),
            "http": f"http://{self.settings.host}:{self.settings.port}",
            "embedded_postgres": self.settings.database_url is None,
            # With servers sharing the database, this one's id among them (GET /info adds
            # the servers and the leases' holders).
            "server_id": self.membership.server_id if self.membership else None,
        }

    @property
    def background(self) -> list[Background]:
        """The threads that stop alike: the workers, then Spark's warm-up."""
        return [*self.workers.values(), *self.replication, self.warmup]

    def start(self) -> None:
        """Resume pending runs, start the ingest pipeline and the workers, open the SQL
        port, and warm Spark up while no run waits. With servers sharing the database,
        this one first announces itself and claims the runs of servers no longer alive:
        those are the pending runs it resumes, and its workers run under leases."""
        membership = self.membership
        if membership is None:
            self.service.pipeline.start()
        else:
            self.service.pipeline.start(resume=membership.join())
            membership.start()
        if self.service.cluster is not None:
            self.service.cluster.seed_ddl_log()
        for name, worker in self.workers.items():
            if membership is None:
                worker.start()
            else:
                worker.start(
                    functools.partial(membership.holds, name),
                    functools.partial(membership.fence, job=name),
                )
        for thread in self.replication:
            thread.start()
        self.sql_port.start()
        self.warmup.start()

    def begin_stop(self) -> None:
        """Ask everything to stop, without waiting: workers finish their step, the
        pipeline takes no new batch and wakes the clients waiting for runs, Spark jobs in
        flight are cancelled (their runs stay pending)."""
        # Every worker finishes its current step at the same time, not one after another.
        for thread in self.background:
            thread.request_stop()
        self.service.pipeline.request_stop()
        self.backend.close()

    def stop(self, deadline: float | None = None) -> None:
        """Stop the SQL port, the workers and the pipeline; a commit still running at
        ``deadline`` (a time.monotonic() value; None: a minute) is cancelled and rolls
        back."""
        self.begin_stop()
        self.sql_port.stop()  # no new statements while the rest stops
        end = time.monotonic() + 60 if deadline is None else deadline
        pipeline = self.service.pipeline
        while time.monotonic() < end and (
            pipeline.running or any(thread.running for thread in self.background)
        ):
            time.sleep(0.2)
            # Spark cancels the jobs running when asked, not those a step or a batch starts
            # a moment later (a batch runs several): cancel again until they are all done.
            self.backend.close()
        for thread in self.background:
            thread.stop(0.0)
        pipeline.stop(end)
        if self.membership is not None:  # last: the leases cover the steps in flight
            self.membership.leave()


def assemble(
    settings: Settings, database_url: str, engine: sa.Engine, backend: SparkBackend
) -> Runtime:
    """Wire the service, its ingest pipeline, the workers ``settings.workers`` names and
    the SQL port, over a migrated database (``engine``) and a Spark backend. Nothing starts
    yet."""
    plans = PlanCache()
    metrics = Metrics(engine, plans)
    metrics.registry.register(ExecutorCollector(backend.executors))
    spool = Spool(settings.spool_dir)
    shared = SharedRuns(engine, new_server_id(), spool) if settings.shared_database else None
    reducer = Reducer(
        engine,
        plans,
        min_rows=settings.reduce_min_rows,
        interval=settings.reduce_interval,
        concurrency=settings.reduce_concurrency,
        metrics=metrics,
    )
    repairer = Repairer(engine, plans, interval=settings.serial_interval, metrics=metrics)

    def late_committed() -> None:
        """Late rows reopened windows, merged on read until folded, and corrected serial
        windows, computed on read until repaired: both workers start now, side by side,
        not at the end of their intervals. (A repair reads its source as it is, folded or
        not: either is exact, and waiting for a long fold would keep every read of the
        serial view computing the corrected windows meanwhile.)"""
        reducer.wake()
        repairer.wake()

    pipeline = IngestPipeline(
        engine,
        plans,
        backend,
        spool,
        metrics,
        batch_max_rows=settings.batch_max_rows,
        batch_linger=settings.batch_linger,
        feed_retention=settings.feed_retention,
        late_committed=late_committed,
        shared=shared,
    )
    service = StrataService(engine, plans, spool, pipeline, metrics, shared)
    every: list[Worker] = [
        Backfiller(
            engine,
            plans,
            backend,
            scratch=settings.backfill_dir,
            chunk_rows=settings.backfill_chunk_rows,
            metrics=metrics,
        ),
        reducer,
        Retention(engine, plans, metrics=metrics),
        Materializer(engine, plans, interval=settings.serial_interval, metrics=metrics),
        repairer,
        Swapper(engine, plans, metrics=metrics),
        SinkWorker(
            engine,
            plans,
            interval=settings.sink_interval,
            batch=settings.sink_batch,
            timeout=settings.sink_timeout,
            backoff_max=settings.sink_backoff_max,
            metrics=metrics,
        ),
    ]
    # Every name Settings accepts is a worker's: a name that wires nothing would leave a
    # worker silently off.
    assert {w.name for w in every} == set(ALL_WORKERS), "Settings.workers names every worker"
    workers: dict[str, Worker] = {w.name: w for w in every if w.name in settings.workers}
    sql_port = SqlPort(service, settings, database_url)
    warmup = Warmup(
        backend,
        settings.spark_dir / "warmup",
        batches=settings.spark_warmup,
        idle=lambda: pipeline.idle,
        gauge=metrics.warmup_left,
    )
    replication: list[Background] = []
    if settings.clustered:
        node = Node(settings, service, secret(settings, "api_token"))
        service.cluster = node
        metrics.registry.register(ClusterCollector(node))
        replication = [Puller(node, peer, settings.replicate_interval) for peer in node.peers]
        replication.append(DdlFollower(node, settings.replicate_interval))
        replication.append(Settler(node, settings.replicate_interval))
    membership = None
    if shared is not None:

        def resume(seqs: list[int]) -> None:
            for seq in seqs:
                pipeline.submit(seq)

        membership = Membership(
            engine,
            shared,
            http=f"http://{settings.host}:{settings.port}",
            jobs=workers,
            lease_duration=settings.lease_duration,
            resume=resume,
            taken=lambda job: workers[job].wake(),
        )
        metrics.registry.register(LeaseCollector(membership))
    return Runtime(
        settings,
        database_url,
        engine,
        backend,
        service,
        sql_port,
        warmup,
        workers,
        replication,
        membership,
    )


@contextmanager
def running(settings: Settings, shutdown: Shutdown | None = None) -> Iterator[Runtime]:
    """Start everything Strata needs; stop it all (in reverse order) on exit, within
    ``shutdown``'s deadlines (server/shutdown.py), counted from its request - a signal's,
    or the end of the ``with`` block."""
    shutdown = shutdown or Shutdown(settings.shutdown_timeout)
    # py4j logs a traceback on the root logger for a call the JVM's exit cut short, then
    # raises an error Strata reports itself. A stop signal reaches the JVM (under systemd)
    # before Strata's handler runs, so the filter is on from the start, not from the stop.
    logging.getLogger().addFilter(_quiet_py4j)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedPostgres | None = None
    supervisor: Supervisor | None = None
    engine: sa.Engine | None = None
    backend: SparkBackend | None = None
    runtime: Runtime | None = None
    spark: Starting | None = None

    def start_spark() -> SparkSession:
        return create_spark_session(
            settings.spark_master,
            local_dir=settings.spark_dir,
            driver_memory=settings.spark_driver_memory,
        )

    try:
        # Spark's JVM starts while PostgreSQL starts and the catalog migrates: about 3 s of
        # the 10 a start took, on 2 cores.
        log.info("starting Spark (%s)", settings.spark_master or "local")
        spark = Starting(start_spark)
        if settings.database_url:
            database_url = settings.database_url
        else:
            embedded = EmbeddedPostgres(settings.postgres_dir, linger=settings.postgres_linger)
            log.info("starting embedded PostgreSQL in %s", settings.postgres_dir)
            database_url = embedded.start()
            supervisor = Supervisor(embedded)
            supervisor.start()
            shutdown.on_request(supervisor.request_stop)
            faults.register("postgres", lambda: embedded.pid if embedded else None)
        engine = create_catalog_engine(database_url)
        migrate(engine)
        configure_reader(engine, secret(settings, "reader_password"))
        comment_all(engine)
        # The backend starts Spark again with the same settings when its JVM dies.
        backend = SparkBackend(
            spark.result(), restart=start_spark, shared_spool=settings.shared_spool
        )
        faults.register("spark", lambda: jvm_pid(backend.spark) if backend else None)
        runtime = assemble(settings, database_url, engine, backend)
        runtime.start()
        shutdown.on_request(runtime.begin_stop)
        # Owner-only from the first byte: database_url holds the owner's password.
        write_private_file(settings.data_dir / INFO_FILE, json.dumps(runtime.info(), indent=2))
        yield runtime
    finally:
        shutdown.request("the server stopped")  # starts the clock if no signal did
        if backend is None and spark is not None:  # Spark's start, cut short
            spark.abandon(shutdown.left(SPARK_SHARE))
        failed = _stop(shutdown, runtime, backend, engine, supervisor, embedded)
        if failed:  # logged already; `strata up` must not exit 0 then
            raise RuntimeError(f"stopping {', '.join(failed)} failed")


def _stop(
    shutdown: Shutdown,
    runtime: Runtime | None,
    backend: SparkBackend | None,
    engine: sa.Engine | None,
    supervisor: Supervisor | None,
    embedded: EmbeddedPostgres | None,
) -> list[str]:
    """Stop what ``running`` started, each part within its share of the shutdown timeout;
    a part that fails is logged, and the next one is stopped all the same. Returns the
    parts that failed."""
    steps: list[tuple[str, Callable[[], None]]] = []
    if supervisor is not None:
        steps.append(("the PostgreSQL supervisor", supervisor.request_stop))
    if runtime is not None:
        steps.append(("workers and ingest", lambda: runtime.stop(shutdown.until(WORK_SHARE))))
    if backend is not None:
        steps.append(("Spark", lambda: backend.stop(shutdown.left(SPARK_SHARE))))
    steps.append(("Spark's JVM", kill_driver_jvms))
    if engine is not None:
        steps.append(("connections", engine.dispose))
    if supervisor is not None:
        steps.append(("the PostgreSQL supervisor", lambda: supervisor.stop(shutdown.left())))
    if embedded is not None:
        steps.append(("PostgreSQL", lambda: embedded.stop(shutdown.left())))
    failed = []
    for what, step in steps:
        try:
            step()
        except Exception:
            log.exception("stopping %s failed", what)
            failed.append(what)
    log.info("stopped in %.1fs (%s)", shutdown.elapsed(), shutdown.reason)
    return failed


def _quiet_py4j(record: logging.LogRecord) -> bool:
    return "py4j" not in record.pathname


def stored_info(settings: Settings) -> dict[str, object]:
    """What `strata info` prints: the last `strata up` on this data dir, or the settings."""
    path = settings.data_dir / INFO_FILE
    details: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    if settings.database_url:
        details["database_url"] = settings.database_url
    elif details.get("embedded_postgres", True):
        # From the embedded PostgreSQL's own files, for whoever may read its password file
        # (None before the first start, or for whoever may not).
        details["database_url"] = stored_url(settings.postgres_dir) or details.get("database_url")
    details.setdefault("data_dir", str(Path(settings.data_dir).resolve()))
    return details
