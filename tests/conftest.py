"""Fixtures shared by the whole suite: a PostgreSQL server, fresh databases, a SparkSession."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import settings as hypothesis_settings
from psycopg import sql
from pyspark.sql import SparkSession

from server.api.app import create_app
from server.catalog import create_catalog_engine, migrate
from server.engines.backend import SparkBackend
from server.engines.embedded_pg import EmbeddedPostgres
from server.engines.spark import create_spark_session, stop_spark_session
from server.runtime import Runtime, assemble
from server.settings import Settings
from server.workers.backfill import wait_for
from tests.jvm_archive import java_options

# Servers the tests start as subprocesses (the benchmarks' at smoke scale among them) skip
# Spark's start-up warm-up, whose CPU would slow the other tests down; tests/test_warmup.py
# turns it on.
os.environ.setdefault("STRATA_SPARK_WARMUP", "0")

# Every JVM the tests start (the shared Spark session, each `strata up`, a Spark cluster's
# master and workers) compiles with the client compiler only and collects with the serial
# collector, unless JAVA_TOOL_OPTIONS says otherwise. The tests' JVMs live seconds to
# minutes and run small jobs: the optimising compiler's work at every start cost more CPU
# than it saved (on 2 cores, 14-24% of the wall time of the crash, stop and grouping-set
# tests; 6% of the whole suite's). Speed only: the same code runs. `strata up` and the
# benchmarks keep the JVM's defaults. Spark's drivers also start from a class-data archive
# made once per JDK and pyspark (tests/jvm_archive.py): a driver's start and first job take
# 8 s of CPU instead of 14.
if "JAVA_TOOL_OPTIONS" not in os.environ:
    os.environ["JAVA_TOOL_OPTIONS"] = java_options("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Hypothesis profiles. "ci" (the default) is derandomized: CI runs the same examples every
# time, so a red run is reproducible and a green one is not luck. "nightly" draws fresh,
# ten times as many examples: `pytest --hypothesis-profile nightly`. A property test asks
# for `examples(n)` examples: n under "ci", 10n under "nightly".
EXAMPLES_BASE = 100
hypothesis_settings.register_profile(
    "ci", derandomize=True, max_examples=EXAMPLES_BASE, deadline=None, print_blob=True
)
hypothesis_settings.register_profile(
    "nightly", derandomize=False, max_examples=10 * EXAMPLES_BASE, deadline=None
)
hypothesis_settings.load_profile(os.environ.get("STRATA_HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """How many examples a property test that wants ``n`` in CI runs under this profile."""
    return max(n, n * hypothesis_settings.default.max_examples // EXAMPLES_BASE)


def plan_nodes(node: dict) -> Iterator[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, ``node`` first (its "Plan")."""
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def with_database(url: str, dbname: str) -> str:
    """`url` (postgresql://...) pointing at database `dbname` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a PostgreSQL database for the session: $STRATA_TEST_DATABASE_URL if set,
    else the `strata` database of an embedded server started for this test run."""
    external = os.environ.get("STRATA_TEST_DATABASE_URL")
    if external:
        yield external
        return
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("pg"))
    try:
        yield pg.start()
    finally:
        pg.stop()


@pytest.fixture
def pg_conn(pg_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to `pg_url`'s database."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


@contextmanager
def new_database(pg_url: str) -> Iterator[str]:
    """A brand-new empty database on `pg_url`'s server, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(pg_url, name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            # FORCE terminates the connections a test left open, which would block the drop.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def fresh_db(pg_url: str) -> Iterator[str]:
    """URL of a brand-new empty database on `pg_url`'s server, dropped after the test."""
    with new_database(pg_url) as url:
        yield url


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A SparkSession shared by the whole test run: local[2], or a session on the cluster
    $STRATA_TEST_SPARK_MASTER names (tests/test_cluster.py runs tests that way)."""
    master = os.environ.get("STRATA_TEST_SPARK_MASTER") or "local[2]"
    session = create_spark_session(master, local_dir=tmp_path_factory.mktemp("spark"))
    try:
        yield session
    finally:
        stop_spark_session(session)


# The tests run the back-filler (they compare complete views) and drive the other workers
# themselves, at the moments a test chooses.
TEST_WORKERS = ("backfill",)


@contextmanager
def strata_client(
    database_url: str,
    spark: SparkSession,
    data_dir: Path,
    *,
    start: bool = True,
    **settings: object,
) -> Iterator[Strata]:
    """A Strata server (real PostgreSQL, real Spark) behind its HTTP API, in-process,
    wired by the same ``assemble`` as `strata up`; ``settings`` override Settings fields.
    ``start=False`` leaves the ingest pipeline and workers stopped (runs stay pending)."""
    engine = create_catalog_engine(database_url)
    migrate(engine)
    # The SQL port on any free port: tests run side by side.
    # No start-up warm-up of the shared Spark session (tests/test_warmup.py has its own).
    defaults: dict[str, object] = {
        "run_wait_timeout": 120,
        "workers": TEST_WORKERS,
        "pg_port": 0,
        "spark_warmup": 0,
    }
    config = Settings(
        data_dir=data_dir,
        database_url=database_url,
        **(defaults | settings),  # type: ignore[arg-type]
    )
    runtime = assemble(config, database_url, engine, SparkBackend(spark))
    if start:
        runtime.start()
    app = create_app(runtime.service, config, {"database_url": database_url})
    try:
        with TestClient(
            app, raise_server_exceptions=os.environ.get("STRATA_TEST_RAISE") == "1"
        ) as client:
            yield Strata(client, runtime, database_url)
    finally:
        runtime.stop()
        engine.dispose()


class Strata:
    """What a test holds: the HTTP client, the wired runtime (its service and workers), and
    SQL access to the database."""

    def __init__(self, client: TestClient, runtime: Runtime, database_url: str) -> None:
        self.client = client
        self.runtime = runtime
        self.service = runtime.service
        self.database_url = database_url

    @property
    def psql_url(self) -> str:
        """The SQL port's URL (psql, psycopg and the rest connect there)."""
        return self.runtime.sql_port.psql_url

    def create(self, statement: str) -> dict[str, object]:
        response = self.client.post("/streams", json={"sql": statement})
        assert response.status_code == 201, response.text
        # Back-fill over history runs in the background; tests compare complete views.
        wait_for(self.service.engine, response.json()["name"])
        return response.json()  # type: ignore[no-any-return]

    def ingest(
        self, stream: str, body: str | bytes, *, csv: bool = False, run_id: str | None = None
    ) -> dict[str, object]:
        response = self.post_run(stream, body, csv=csv, run_id=run_id, wait=True)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def post_run(
        self,
        stream: str,
        body: str | bytes,
        *,
        csv: bool = False,
        run_id: str | None = None,
        wait: bool = True,
    ):  # type: ignore[no-untyped-def]
        params: dict[str, str] = {"wait": "true" if wait else "false"}
        if run_id is not None:
            params["run_id"] = run_id
        content_type = "text/csv" if csv else "application/x-ndjson"
        return self.client.post(
            f"/streams/{stream}/runs",
            params=params,
            content=body.encode() if isinstance(body, str) else body,
            headers={"content-type": content_type},
        )

    def query(self, statement: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.database_url, autocommit=True) as connection:
            return connection.execute(statement, params or None).fetchall()  # type: ignore[arg-type]


@pytest.fixture
def strata(fresh_db: str, spark: SparkSession, tmp_path: Path) -> Iterator[Strata]:
    """A fresh Strata on a fresh database, for one test."""
    with strata_client(fresh_db, spark, tmp_path) as instance:
        yield instance


@pytest.fixture(scope="module")
def module_strata(
    pg_url: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Strata]:
    """One Strata for a whole module (property tests use fresh stream names per example)."""
    with (
        new_database(pg_url) as url,
        strata_client(url, spark, tmp_path_factory.mktemp("strata")) as instance,
    ):
        yield instance
