"""Fixtures shared by the whole suite: a PostgreSQL server, fresh databases, a SparkSession."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import SparkSession

from server.embedded_pg import EmbeddedPostgres
from server.spark import create_spark_session, stop_spark_session


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


@pytest.fixture
def fresh_db(pg_url: str) -> Iterator[str]:
    """URL of a brand-new empty database on `pg_url`'s server, dropped after the test."""
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


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] SparkSession shared by the whole test run."""
    session = create_spark_session("local[2]", local_dir=tmp_path_factory.mktemp("spark"))
    try:
        yield session
    finally:
        stop_spark_session(session)
