"""Assembling a running Strata: ``assemble`` wires the service, the ingest pipeline and the
background workers from ``Settings``; ``running`` also starts PostgreSQL (embedded or
external), migrations and Spark around it. `strata up` and the tests wire through the same
``assemble``; a test that wants fewer workers says so in its Settings."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from pyspark.sql import SparkSession

from server import faults
from server.catalog import PlanCache, create_catalog_engine, migrate
from server.engines.backend import SparkBackend
from server.engines.embedded_pg import EmbeddedPostgres, Supervisor
from server.engines.spark import create_spark_session, jvm_pid, stop_spark_session
from server.ingest.pipeline import IngestPipeline
from server.ingest.spool import Spool
from server.metrics import Metrics
from server.pgwire.server import SqlPort
from server.security import configure_reader, secret
from server.service import StrataService
from server.settings import ALL_WORKERS, Settings
from server.workers.backfill import Backfiller
from server.workers.loop import Worker
from server.workers.reducer import Reducer
from server.workers.retention import Retention
from server.workers.serial import Materializer, Repairer

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
    workers: dict[str, Worker] = field(default_factory=dict)  # by name, as in Settings.workers

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
        }

    def start(self) -> None:
        """Resume pending runs, start the ingest pipeline and the workers, and open the
        SQL port."""
        self.service.pipeline.start()
        for worker in self.workers.values():
            worker.start()
        self.sql_port.start()

    def stop(self) -> None:
        self.sql_port.stop()  # no new statements while the rest stops
        # Every worker finishes its current step at the same time, not one after another.
        for worker in self.workers.values():
            worker.request_stop()
        for worker in reversed(self.workers.values()):
            worker.stop()
        self.service.pipeline.stop()


def assemble(
    settings: Settings, database_url: str, engine: sa.Engine, backend: SparkBackend
) -> Runtime:
    """Wire the service, its ingest pipeline, the workers ``settings.workers`` names and
    the SQL port, over a migrated database (``engine``) and a Spark backend. Nothing starts
    yet."""
    plans = PlanCache()
    metrics = Metrics(engine, plans)
    spool = Spool(settings.spool_dir)
    pipeline = IngestPipeline(
        engine, plans, backend, spool, metrics, batch_max_rows=settings.batch_max_rows
    )
    service = StrataService(engine, plans, spool, pipeline, metrics)
    every: list[Worker] = [
        Backfiller(
            engine,
            plans,
            backend,
            scratch=settings.backfill_dir,
            chunk_rows=settings.backfill_chunk_rows,
            metrics=metrics,
        ),
        Reducer(
            engine,
            plans,
            min_rows=settings.reduce_min_rows,
            interval=settings.reduce_interval,
            metrics=metrics,
        ),
        Retention(engine, plans, metrics=metrics),
        Materializer(engine, plans, interval=settings.serial_interval, metrics=metrics),
        Repairer(engine, plans, interval=settings.serial_interval, metrics=metrics),
    ]
    # Every name Settings accepts is a worker's: a name that wires nothing would leave a
    # worker silently off.
    assert {w.name for w in every} == set(ALL_WORKERS), "Settings.workers names every worker"
    workers: dict[str, Worker] = {w.name: w for w in every if w.name in settings.workers}
    sql_port = SqlPort(service, settings, database_url)
    return Runtime(settings, database_url, engine, backend, service, sql_port, workers)


@contextmanager
def running(settings: Settings) -> Iterator[Runtime]:
    """Start everything Strata needs; stop it all (in reverse order) on exit."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedPostgres | None = None
    supervisor: Supervisor | None = None
    if settings.database_url:
        database_url = settings.database_url
    else:
        embedded = EmbeddedPostgres(settings.postgres_dir)
        log.info("starting embedded PostgreSQL in %s", settings.postgres_dir)
        database_url = embedded.start()
        supervisor = Supervisor(embedded)
        supervisor.start()
        faults.register("postgres", lambda: embedded.pid if embedded else None)
    engine = create_catalog_engine(database_url)
    backend: SparkBackend | None = None
    runtime: Runtime | None = None
    try:
        migrate(engine)
        configure_reader(engine, secret(settings, "reader_password"))
        log.info("starting Spark (%s)", settings.spark_master or "local")

        def start_spark() -> SparkSession:
            return create_spark_session(
                settings.spark_master,
                local_dir=settings.spark_dir,
                driver_memory=settings.spark_driver_memory,
            )

        # The backend starts Spark again with the same settings when its JVM dies.
        backend = SparkBackend(
            start_spark(), restart=start_spark, shared_spool=settings.shared_spool
        )
        faults.register("spark", lambda: jvm_pid(backend.spark) if backend else None)
        runtime = assemble(settings, database_url, engine, backend)
        runtime.start()
        info_file = settings.data_dir / INFO_FILE
        info_file.write_text(json.dumps(runtime.info(), indent=2))
        info_file.chmod(0o600)  # database_url may hold a password
        yield runtime
    finally:
        if runtime is not None:
            runtime.stop()
        if backend is not None:
            stop_spark_session(backend.spark)
        engine.dispose()
        if supervisor is not None:
            supervisor.stop()
        if embedded is not None:
            embedded.stop()


def stored_info(settings: Settings) -> dict[str, object]:
    """What `strata info` prints: the last `strata up` on this data dir, or the settings."""
    path = settings.data_dir / INFO_FILE
    details: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    if settings.database_url:
        details["database_url"] = settings.database_url
    elif "database_url" not in details:
        details["database_url"] = None  # not started yet on this data dir
    details.setdefault("data_dir", str(Path(settings.data_dir).resolve()))
    return details
