"""PostgreSQL as the benchmarks use it: a scratch database with Strata's schema, the COPY
baseline of a plain table, scalars, and queries timed by repetition."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.harness.data import Dataset
from bench.harness.percentile import percentile
from bench.harness.results import Timing
from server.catalog import create_catalog_engine, migrate
from server.engines.embedded_pg import EmbeddedPostgres


@dataclass(frozen=True)
class Database:
    url: str
    external: bool  # STRATA_DATABASE_URL's: leave nothing behind in it


@contextmanager
def scratch_database(prefix: str, *, keep: bool = False) -> Iterator[Database]:
    """A database with Strata's migrations applied: ``STRATA_DATABASE_URL``'s when set, else
    an embedded PostgreSQL in a temporary dir named ``prefix...``, stopped on exit and
    removed unless ``keep``."""
    external = os.environ.get("STRATA_DATABASE_URL")
    data_dir: Path | None = None
    server: EmbeddedPostgres | None = None
    try:
        if external:
            url = external
        else:
            data_dir = Path(tempfile.mkdtemp(prefix=prefix))
            server = EmbeddedPostgres(data_dir / "postgres")
            url = server.start()
        engine = create_catalog_engine(url)
        migrate(engine)
        engine.dispose()
        yield Database(url, external is not None)
    finally:
        if server is not None:
            server.stop()
        if data_dir is not None:
            if keep:
                print(f"kept {data_dir} (the embedded PostgreSQL is stopped)", file=sys.stderr)
            else:
                shutil.rmtree(data_dir, ignore_errors=True)


def fetch_one(conn: psycopg.Connection, statement: str) -> tuple[Any, ...]:
    """The one row of ``statement`` (built by the benchmark, no parameters)."""
    row = conn.execute(statement).fetchone()  # type: ignore[arg-type]
    assert row is not None, statement
    return tuple(row)


def scalar(conn: psycopg.Connection, statement: str) -> Any:
    """The one value of ``statement``."""
    return fetch_one(conn, statement)[0]


def copy_baseline(database_url: str, data: Dataset, table: str, columns: str) -> Timing:
    """COPY every body (one COPY, one transaction per body) into a plain table ``table`` of
    ``columns``, made anew: the baseline of ingest, and the input of batch oracles."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {table} ({columns})")  # type: ignore[arg-type]
        started = time.monotonic()
        with conn.cursor() as cursor:
            for body in data.bodies:
                statement = f"COPY {table} FROM STDIN (FORMAT csv, HEADER true)"
                with cursor.copy(statement) as copy:  # type: ignore[arg-type]
                    copy.write(body)
        seconds = time.monotonic() - started
    return Timing("PostgreSQL COPY", data.rows, seconds, f"{len(data.bodies)} COPYs, 1 conn")


@dataclass
class Measurement:
    """A query's result and the seconds of each timed run."""

    result: list[tuple[Any, ...]]
    seconds: list[float]

    @property
    def median_ms(self) -> float:
        return percentile(self.seconds, 0.5) * 1000

    @property
    def min_ms(self) -> float:
        return min(self.seconds) * 1000


def measure(conn: psycopg.Connection, sql: str, repeat: int) -> Measurement:
    """One untimed run (warm cache; its result is the one compared), then ``repeat``."""
    result = conn.execute(sql).fetchall()  # type: ignore[arg-type]
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        conn.execute(sql).fetchall()  # type: ignore[arg-type]
        seconds.append(time.perf_counter() - started)
    return Measurement(result, seconds)
