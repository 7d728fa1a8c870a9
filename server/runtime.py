"""Assembling a running Strata: PostgreSQL (embedded or external), migrations, Spark, service."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from pyspark.sql import SparkSession

from server import faults
from server.catalog import create_catalog_engine, migrate
from server.engines.backend import SparkBackend
from server.engines.embedded_pg import EmbeddedPostgres, Supervisor
from server.engines.spark import create_spark_session, jvm_pid, stop_spark_session
from server.ingest.spool import Spool
from server.security import configure_reader, secret
from server.service import StrataService
from server.settings import Settings
from server.workers.loop import Worker
from server.workers.reducer import Reducer
from server.workers.retention import Retention
from server.workers.serial import Materializer, Repairer

log = logging.getLogger("strata")
INFO_FILE = "info.json"


@dataclass
class Runtime:
    settings: Settings
    database_url: str
    engine: sa.Engine
    service: StrataService

    def info(self) -> dict[str, object]:
        return {
            "database_url": self.database_url,
            "spark_master": self.settings.spark_master or "local[*]",
            # Whether executors read spooled runs from their files (see STRATA_SHARED_SPOOL).
            "shared_spool": self.service.backend.reads_files,
            "data_dir": str(self.settings.data_dir.resolve()),
            "http": f"http://{self.settings.host}:{self.settings.port}",
            "embedded_postgres": self.settings.database_url is None,
        }


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
    service = None
    workers: list[Worker] = []
    try:
        migrate(engine)
        configure_reader(engine, secret(settings, "reader_password"))
        log.info("starting Spark (%s)", settings.spark_master or "local")

        def start_spark() -> SparkSession:
            return create_spark_session(
                settings.spark_master,
                local_dir=settings.spark_dir,
                extra_conf={"spark.driver.memory": settings.spark_driver_memory},
            )

        # The backend starts Spark again with the same settings when its JVM dies.
        backend = SparkBackend(
            start_spark(), restart=start_spark, shared_spool=settings.shared_spool
        )
        faults.register("spark", lambda: jvm_pid(backend.spark) if backend else None)
        service = StrataService(engine, backend, Spool(settings.spool_dir))
        service.batch_max_rows = settings.batch_max_rows
        service.backfiller.chunk_rows = settings.backfill_chunk_rows
        service.start()
        workers = [
            Reducer(
                engine,
                service.plans,
                min_rows=settings.reduce_min_rows,
                interval=settings.reduce_interval,
            ),
            Retention(engine, service.plans),
            Materializer(engine, service.plans, interval=settings.serial_interval),
            Repairer(engine, service.plans, interval=settings.serial_interval),
        ]
        for worker in workers:
            worker.metrics = service.metrics
            worker.start()
        runtime = Runtime(settings, database_url, engine, service)
        info_file = settings.data_dir / INFO_FILE
        info_file.write_text(json.dumps(runtime.info(), indent=2))
        info_file.chmod(0o600)  # database_url may hold a password
        yield runtime
    finally:
        # Every worker finishes its current step at the same time, not one after another.
        for worker in workers:
            worker.request_stop()
        for worker in reversed(workers):
            worker.stop()
        if service is not None:
            service.stop()
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
