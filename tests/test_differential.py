"""Differential tests: the same expressions, evaluated by Spark and by PostgreSQL, agree.

Invariant 4: an expression evaluated by Spark (partials) and by PostgreSQL (views, batch
oracle) gives the same result - integer division, NULLs, time zones, rounding of numerics.
Invariant 5: the consolidated answers have PostgreSQL's own result types.

Every expression is written once, in PostgreSQL syntax. PostgreSQL evaluates it as written
over the raw stream's view; Spark evaluates what ``rewriter.expressions.to_spark`` makes of
it over the same rows - so these tests check our translation, not a hand-written twin. The
rows are loaded the way the service loads a run (Arrow -> Spark; Arrow -> COPY -> raw
archive), and the aggregate tests run real plans end to end: partial query in Spark via
``SparkBackend``, partial rows COPYed into the partial archive, the consolidating view in
PostgreSQL, compared with PostgreSQL's own GROUP BY over the raw rows.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
import sqlglot
from pyspark.sql import SparkSession

from rewriter import ParallelAggregatePlan, RawStreamPlan, rewrite
from rewriter.errors import UnsupportedSQL
from rewriter.expressions import to_spark
from rewriter.naming import RUN_COLUMN, partial_archive_table, raw_archive_table
from rewriter.parse_stream import parse_expression
from rewriter.registry import REGISTRY, rule_for
from rewriter.types import SqlType
from rewriter.window_forms import window_start_spark
from server.catalog import create_catalog_engine, migrate
from server.engines.backend import SparkBackend
from server.ingest.archive import copy_in
from server.ingest.parse import arrow_schema
from server.ingest.spool import Spool
from tests.conftest import new_database

# ---------------------------------------------------------------------------------------
# The rows: one raw stream, loaded into both engines.
# ---------------------------------------------------------------------------------------

SOURCE = "diff_rows"
SOURCE_SQL = (
    f"CREATE STREAM {SOURCE} (id integer, g text, i integer, b bigint, s smallint, "
    "n numeric(12,4), u numeric, f double precision, txt text, ts timestamptz, "
    "flag boolean, t timestamptz) WITH (event_time = 't')"
)
I32 = 2**31 - 1
I64 = 2**63 - 1


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _t(minutes: int) -> dt.datetime:
    """Event times: rows 1-5 fall into the first hour, rows 6-10 into the second."""
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=minutes)


D = Decimal
# id, g, i, b, s, n, u, f, txt, ts, flag, t. Group 'a' holds the extremes and only floats
# that are exact binary fractions (its float sums are exact in any order); 'b' holds the
# others; 'z' is the all-NULL row alone.
ROWS: list[tuple] = [
    (
        1,
        "a",
        7,
        3,
        2,
        D("1.2345"),
        D("1.2345"),
        2.5,
        "abc",
        _ts("2024-03-10T12:34:56.789012+00:00"),
        True,
        _t(10),
    ),
    (
        2,
        "a",
        -7,
        -3,
        -2,
        D("-1.2345"),
        D("-0.0000000001"),
        -2.5,
        "ÄBC déF",
        _ts("1969-12-31T23:59:59.999999+00:00"),
        False,
        _t(20),
    ),
    (3, "a", 0, 0, 0, D("0.0000"), D("0"), 0.0, "", _ts("1970-01-01T00:00:00+00:00"), None, _t(30)),
    (
        4,
        "z",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        _ts("1960-06-15T08:00:00+05:30"),
        None,
        _t(40),
    ),
    (
        5,
        "a",
        -I32,
        I64,
        32767,
        D("99999999.9999"),
        D("12345678901234567890.1234567891"),
        2147483646.5,
        "Zz",
        _ts("9999-12-31T23:59:59.999999+00:00"),
        True,
        _t(50),
    ),
    (
        6,
        "a",
        I32,
        -I64,
        -32767,
        D("-99999999.9999"),
        D("-12345678901234567890.1234567891"),
        -2147483647.5,
        "ß ǅ ﬁ",
        _ts("0001-01-01T00:00:00+00:00"),
        False,
        _t(60),
    ),
    (
        7,
        "b",
        5,
        -10,
        -3,
        D("2.5000"),
        D("2.5"),
        3.5,
        "a",
        _ts("2024-03-10T02:30:00.5-08:00"),
        True,
        _t(70),
    ),
    (
        8,
        "b",
        -5,
        10,
        3,
        D("-2.5000"),
        D("-2.5"),
        -2.7,
        "b",
        _ts("1969-07-20T20:17:40+05:45"),
        None,
        _t(80),
    ),
    (
        9,
        "b",
        1,
        1,
        1,
        D("0.0500"),
        D("0.0000000001"),
        2.7,
        "Äbc",
        _ts("1900-01-01T00:00:00.000001+01:00"),
        False,
        _t(90),
    ),
    (
        10,
        "b",
        None,
        -1,
        None,
        D("-0.0500"),
        D("1"),
        0.5,
        None,
        _ts("2000-02-29T23:59:59.5-03:30"),
        True,
        _t(100),
    ),
]


def _arrow_type(sql_type: SqlType) -> pa.DataType:
    if sql_type.is_numeric:
        return pa.decimal128(sql_type.effective_precision, sql_type.effective_scale)
    return {
        "integer": pa.int32(),
        "bigint": pa.int64(),
        "smallint": pa.int16(),
        "double precision": pa.float64(),
        "text": pa.string(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "boolean": pa.bool_(),
    }[sql_type.name]


def _source_plan() -> RawStreamPlan:
    plan = rewrite(SOURCE_SQL, {})
    assert isinstance(plan, RawStreamPlan)
    return plan


SCHEMA: dict[str, SqlType] = {c.name: c.type for c in _source_plan().columns}


def _arrow_rows() -> pa.Table:
    """ROWS as Arrow, with the declared types and the run column (three runs)."""
    names = list(SCHEMA)
    columns = {
        name: pa.array([row[k] for row in ROWS], _arrow_type(SCHEMA[name]))
        for k, name in enumerate(names)
    }
    columns[RUN_COLUMN] = pa.array([row[0] % 3 + 1 for row in ROWS], pa.int64())
    return pa.table(columns)


# ---------------------------------------------------------------------------------------
# Fixtures: one database and one Spark session (with the rows as a view) per module.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def db_url(pg_url: str) -> Iterator[str]:
    """A fresh database holding the raw stream (loaded like a run) and Strata's functions,
    installed by the migrations as a server installs them."""
    with new_database(pg_url) as url:
        engine = create_catalog_engine(url)
        migrate(engine)
        engine.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in _source_plan().create_statements:
                conn.execute(statement)
            with conn.cursor() as cursor:
                copy_in(cursor, raw_archive_table(SOURCE), _arrow_rows())
        yield url


@pytest.fixture(scope="module")
def session(spark: SparkSession) -> Iterator[SparkSession]:
    """A child session (as SparkBackend uses) with ROWS as the temporary view SOURCE."""
    child = spark.newSession()
    assert child.conf.get("spark.sql.session.timeZone") == "UTC"
    assert child.conf.get("spark.sql.ansi.enabled") == "true"
    child.createDataFrame(_arrow_rows()).createOrReplaceTempView(SOURCE)
    try:
        yield child
    finally:
        child.catalog.dropTempView(SOURCE)


def _micros(value: dt.datetime) -> int:
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def _pg_connect(url: str, timezone: str = "UTC") -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"SET TimeZone = '{timezone}'")
    return conn


# PostgreSQL evaluates row expressions in a session far from UTC: nothing may depend on it.
PG_EXPRESSION_TIMEZONE = "Asia/Kathmandu"


def test_rows_are_the_same_in_both_engines(db_url: str, session: SparkSession) -> None:
    """The ground the other tests stand on: identical values, and Spark holds the declared
    types (numeric(12,4) as decimal(12,4), unbounded numeric as decimal(38,10), ...)."""
    for name, sql_type in SCHEMA.items():
        assert session.table(SOURCE).schema[name].dataType.simpleString() == (
            sql_type.spark().replace(" ", "")
        ), name
    columns = [c for c in SCHEMA if SCHEMA[c].name != "timestamptz"]
    micros = [c for c in SCHEMA if SCHEMA[c].name == "timestamptz"]
    spark_items = [f"`{c}`" for c in columns] + [f"unix_micros(`{c}`)" for c in micros]
    spark_rows = [
        tuple(r.values())
        for r in session.sql(f"SELECT {', '.join(spark_items)} FROM {SOURCE} ORDER BY id")
        .toArrow()
        .to_pylist()
    ]
    with _pg_connect(db_url, PG_EXPRESSION_TIMEZONE) as conn:
        pg_rows = conn.execute(
            "SELECT "
            + ", ".join(
                [f'"{c}"' for c in columns]
                + [f'(extract(epoch FROM "{c}") * 1000000)::bigint' for c in micros]
            )
            + f" FROM {SOURCE} ORDER BY id"
        ).fetchall()
    at = list(SCHEMA).index
    expected = [
        tuple(row[at(c)] for c in columns) + tuple(_micros(row[at(c)]) for c in micros)
        for row in ROWS
    ]
    assert pg_rows == expected
    assert spark_rows == expected


# ---------------------------------------------------------------------------------------
# Row-level expressions.
# ---------------------------------------------------------------------------------------

EXPRESSIONS: list[str] = [
    # integer division truncates toward zero, in every integer type
    "i / 2",
    "i / -2",
    "-i / 2",
    "b / 3",
    "b / -7",
    "s / 2",
    "s / -3",
    "(i + s) / 4",
    "-7 / 2",
    "7 / -2",
    "CASE WHEN s <> 0 THEN i / s END",
    "CASE WHEN i <> 0 THEN b / i END",
    "CASE WHEN s <> 0 THEN s / s END",
    "COALESCE(i / 2, b)",
    # modulo takes the sign of the dividend
    "i % 7",
    "i % -7",
    "-i % 7",
    "b % 1000",
    "b % -1000",
    "s % 7",
    "CASE WHEN s <> 0 THEN i % s END",
    "n % 3",
    "n % 0.7",
    "-7 % 3",
    "7 % -3",
    # mixed integer types
    "i + s",
    "b + i",
    "b - s",
    "s + 1",
    "s * 1000",
    "s - s",
    "CAST(i AS bigint) * s",
    # numeric arithmetic, decimal literals (incl. exponents)
    "i + 1.5",
    "b + n",
    "b * n",
    "i * n",
    "n + 1.5",
    "n - 0.00005",
    "n * 1.5",
    "n * n",
    "n * -2",
    "n + n",
    "n * 0.0001",
    "1.10 + 2.205",
    "0.1 + 0.2 = 0.3",
    "n + 2.5e3",
    "n * 1.5e-3",
    "i + 1e3",
    "n + 99999999999999999999",
    "-n",
    "abs(n)",
    # unbounded numeric: decimal(38,10) in Spark
    "u",
    "-u",
    "abs(u)",
    "u > n",
    "COALESCE(u, 0)",
    "CAST(u AS numeric(30,2))",
    "u + u",
    "u * 2",
    "u - 1",
    # double precision
    "f / 2",
    "f / 3",
    "f * 3",
    "f * f",
    "f + i",
    "f * n",
    "f - b",
    "f + 0.1",
    "-f",
    "abs(f)",
    "CAST(i AS double precision) / 7",
    "CASE WHEN n <> 0 THEN f / n END",
    # unary minus, abs
    "-i",
    "-b",
    "-s",
    "abs(i)",
    "abs(b)",
    "abs(s)",
    # comparisons and three-valued logic
    "i > s",
    "i = b",
    "n >= 1.2345",
    "f < n",
    "i = f",
    "n = f",
    "b = n",
    "i <> s",
    "txt < 'b'",
    "txt > 'Z'",
    "txt = ''",
    "ts < '1970-01-01 00:00:00+00:00'",
    "ts >= '2024-03-10 10:30:00.5+00:00'",
    "ts = '1969-12-31 23:59:59.999999+00:00'",
    "ts > '1969-07-20 20:17:40+05:45'",
    "flag AND i > 0",
    "flag OR i > 0",
    "NOT flag",
    "flag AND NULL",
    "flag OR NULL",
    "NOT (i > 0 AND b > 0)",
    "i <> s OR f IS NULL",
    "flag IS TRUE",
    "flag IS NOT TRUE",
    "flag IS FALSE",
    "flag = false",
    "(i > 0) = flag",
    # IS [NOT] NULL
    "i IS NULL",
    "txt IS NOT NULL",
    "flag IS NULL",
    "n IS NOT NULL",
    "NOT (f IS NULL)",
    "u IS NULL",
    # CASE, COALESCE
    "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' END",
    "CASE WHEN flag THEN n ELSE i END",
    "CASE WHEN i IS NULL THEN -1 ELSE i / 2 END",
    "CASE WHEN f > 0 THEN f ELSE n END",
    "CASE i WHEN 7 THEN 'seven' WHEN -7 THEN 'minus seven' ELSE txt END",
    "CASE WHEN flag THEN 1 END",
    "CASE WHEN flag THEN 1.5 ELSE b END",
    "COALESCE(i, s, 0)",
    "COALESCE(txt, 'none')",
    "COALESCE(n, 0)",
    "COALESCE(f, i)",
    "COALESCE(i, b)",
    "COALESCE(n, i, 0.5)",
    # text
    "txt || '-' || txt",
    "txt || NULL",
    "'x' || txt",
    "COALESCE(txt, '') || '!'",
    "lower(txt)",
    "upper(txt)",
    "upper(txt || 'é')",
    "lower(COALESCE(txt, 'NULL'))",
    # casts between number types
    "CAST(n AS numeric(10,1))",
    "CAST(-n AS numeric(10,1))",
    "CAST(n AS integer)",
    "CAST(n AS bigint)",
    "CAST(n * 3 AS integer)",
    "CAST(f AS integer)",
    "CAST(f AS bigint)",
    "CAST(-f AS bigint)",
    "CAST(i AS numeric(12,2))",
    "CAST(b AS numeric)",
    "CAST(n AS numeric)",
    "CAST(n * n * n AS numeric)",
    "CAST(s AS numeric)",
    # identity casts
    "CAST(txt AS text)",
    "CAST(txt AS varchar)",
    "CAST(flag AS boolean)",
    "CAST(ts AS timestamptz) = ts",
    "CAST(i AS integer)",
    "CAST(n AS double precision)",
    "CAST(u AS double precision)",
    "CAST(i AS double precision)",
    "CAST(b AS double precision)",
    "CAST(s AS integer)",
    "CAST(i AS bigint) * 3",
    "CAST(CAST(f AS real) AS double precision)",
    "CAST(CAST(i AS real) AS double precision)",
    "CAST(n * n AS numeric(24,6))",
    "n::integer + 1",
    "f::bigint",
    # join conditions: BETWEEN (inclusive, NULL as in AND), moments moved by fixed intervals
    "i BETWEEN s AND b",
    "n BETWEEN -1 AND 1.5",
    "NOT (i BETWEEN 0 AND 10)",
    "ts BETWEEN t - INTERVAL '1 hour' AND t + INTERVAL '2 days'",
    "t + INTERVAL '90 minutes'",
    "t - INTERVAL '1 week' < ts",
    "t - INTERVAL '1500 milliseconds'",
    "t + INTERVAL '250 milliseconds' >= t",
    # row functions: numbers (round(double) ties to even, round(numeric) away from zero;
    # integers go through double precision, as PostgreSQL resolves them)
    "round(f)",
    "round(-f)",
    "round(n)",
    "round(u)",
    "round(i)",
    "round(b)",
    "round(n, 2)",
    "round(-n, 1)",
    "round(n, -2)",
    "round(u, 3)",
    "round(i, -1)",
    "round(b, 2)",
    "round(n * 2, 0)",
    "round(n, -20)",
    "round(n, 30)",
    "round(i, 5)",
    "round(f * 1e5)",
    "round(u, -15)",
    "floor(f)",
    "floor(-f)",
    "floor(n)",
    "floor(u)",
    "floor(i)",
    "ceil(f)",
    "ceiling(-f)",
    "ceil(n)",
    "ceil(u)",
    "ceil(s)",
    "mod(i, 7)",
    "mod(b, -1000)",
    "mod(n, 0.7)",
    "mod(-i, 3)",
    "power(f, 2)",
    "power(f, 0.5 * 0 + 3)",
    "power(abs(f), 0.5)",
    "power(2, i % 10)",
    "sqrt(abs(f))",
    "sqrt(abs(i))",
    "sign(f)",
    "sign(n)",
    "sign(u)",
    "sign(i)",
    "greatest(i, s)",
    "greatest(i, b, s)",
    "greatest(n, i)",
    "greatest(n, u)",
    "least(f, n)",
    "least(i, NULL)",
    "greatest(txt, 'a')",
    "least(txt, 'b', g)",
    "greatest(ts, t) AT TIME ZONE 'UTC'",
    "least(ts, t)",
    "nullif(i, 7)",
    "nullif(txt, '')",
    "nullif(n, 0)",
    "nullif(i, n)",
    "nullif(i, f)",
    "nullif(n, f)",
    "nullif(b, i)",
    "nullif(n, u)",
    # row functions: text (characters, not bytes; NULLs as in PostgreSQL)
    "length(txt)",
    "char_length(txt || 'é')",
    "replace(txt, 'b', 'xx')",
    "replace(txt, '', 'x')",
    "replace(txt, 'ß', '')",
    "strpos(txt, 'b')",
    "strpos(txt, '')",
    "strpos(txt, 'é')",
    "position('c' IN txt)",
    "left(txt, 2)",
    "left(txt, -1)",
    "left(txt, 0)",
    "left(txt, -100)",
    "left(txt, i)",
    "right(txt, 2)",
    "right(txt, -1)",
    "right(txt, 100)",
    "right(txt, s)",
    "substring(txt, 2)",
    "substring(txt, 0)",
    "substring(txt, -3)",
    "substring(txt, 2, 2)",
    "substring(txt, 0, 2)",
    "substring(txt, -5, 7)",
    "substring(txt FROM 3 FOR 100)",
    "substr(txt, 4)",
    "substring(g, i)",
    "substring(g, 1, abs(i))",
    "substring(g, i, 2)",
    "substring(g, s, 2)",
    "left(g, i)",
    "right(g, i)",
    "left(g, s)",
    "right(g, -s)",
    "repeat(g, s)",
    "lpad(g, s, 'x')",
    "rpad(g, s, txt)",
    "strpos(g, txt)",
    "replace(g, txt, 'x')",
    "starts_with(g, txt)",
    "split_part(g, txt, 1)",
    "btrim(g, '')",
    "btrim(txt, txt)",
    "substring(txt, 2147483647, 2147483647)",
    "split_part(txt, ' ', 1)",
    "split_part(txt, ' ', 2)",
    "split_part(txt, ' ', -1)",
    "split_part(txt, ' ', 5)",
    "split_part(txt, '', 1)",
    "split_part(txt, '', -1)",
    "split_part(txt, '', 2)",
    "split_part(txt, 'b', 1)",
    "trim(' ' || txt || '  ')",
    "btrim(txt, 'aZ')",
    "ltrim(txt, 'aÄ')",
    "rtrim(txt, 'cF')",
    "ltrim('  ' || txt)",
    "rtrim(txt || ' ')",
    "trim(BOTH 'ß' FROM txt)",
    "trim(LEADING 'Z' FROM txt)",
    "concat(txt, '-', g)",
    "concat(txt, i, NULL, b)",
    "concat(NULL, txt)",
    "reverse(txt)",
    "repeat(txt, 2)",
    "repeat(txt, s)",
    "repeat(txt, 0)",
    "lpad(txt, 5, 'xy')",
    "lpad(txt, 2)",
    "lpad(txt, -1, 'x')",
    "lpad(txt, 5, '')",
    "rpad(txt, 6, 'é')",
    "rpad(txt, 1)",
    "starts_with(txt, 'a')",
    "starts_with(txt, '')",
    "starts_with(txt, 'Ä')",
    "txt LIKE 'a%'",
    "txt LIKE '%b%'",
    "txt LIKE '_'",
    "txt LIKE '__'",
    "txt LIKE ''",
    "txt LIKE '%'",
    "txt NOT LIKE '%c'",
    "txt LIKE 'Ä%'",
    "txt || '%_' LIKE '%\\%\\_'",
    "txt LIKE 'a\\_c'",
    "txt LIKE '%\\\\%'",
    "i IN (7, -7, 5)",
    "i NOT IN (7, -7)",
    "i IN (7, NULL)",
    "i NOT IN (7, NULL)",
    "txt IN ('a', 'b', '')",
    "n IN (2.5, 1.2345, 0)",
    "b IN (i, s)",
    # row functions: time, in UTC whatever PostgreSQL's session time zone
    "date_trunc('day', ts, 'UTC')",
    "date_trunc('hour', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('minute', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('second', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('milliseconds', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('microseconds', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('week', t, 'UTC')",
    "date_trunc('week', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('quarter', ts, 'UTC') AT TIME ZONE 'UTC'",
    "date_trunc('month', ts, 'UTC')",
    "date_trunc('quarter', t, 'UTC')",
    "date_trunc('year', ts, 'UTC')",
    "date_trunc('hours', t, 'UTC')",
    "date_trunc('MONTHS', t, 'UTC')",
    "date_trunc('day', ts AT TIME ZONE 'UTC')",
    "date_trunc('month', ts AT TIME ZONE 'UTC')",
    "ts AT TIME ZONE 'UTC'",
    "CAST(ts AT TIME ZONE 'UTC' AS date)",
    "(t AT TIME ZONE 'UTC')::date",
    "extract(year FROM ts AT TIME ZONE 'UTC')",
    "extract(isoyear FROM ts AT TIME ZONE 'UTC')",
    "extract(quarter FROM ts AT TIME ZONE 'UTC')",
    "extract(month FROM ts AT TIME ZONE 'UTC')",
    "extract(week FROM ts AT TIME ZONE 'UTC')",
    "extract(day FROM ts AT TIME ZONE 'UTC')",
    "extract(doy FROM ts AT TIME ZONE 'UTC')",
    "extract(dow FROM ts AT TIME ZONE 'UTC')",
    "extract(isodow FROM ts AT TIME ZONE 'UTC')",
    "extract(hour FROM ts AT TIME ZONE 'UTC')",
    "extract(minute FROM ts AT TIME ZONE 'UTC')",
    "extract(second FROM ts AT TIME ZONE 'UTC')",
    "extract(milliseconds FROM ts AT TIME ZONE 'UTC')",
    "extract(microseconds FROM ts AT TIME ZONE 'UTC')",
    "extract(epoch FROM ts AT TIME ZONE 'UTC')",
    "extract(epoch FROM ts)",
    "extract(seconds FROM t AT TIME ZONE 'UTC')",
    "extract('day' FROM t AT TIME ZONE 'UTC')",
    "extract(epoch FROM t)",
    "extract(year FROM CAST(ts AT TIME ZONE 'UTC' AS date))",
    # casts from text (what PostgreSQL reads), to text, between boolean and integer
    "CAST(CAST(i AS text) AS integer)",
    "CAST(CAST(b AS text) AS bigint)",
    "CAST(' ' || CAST(s AS text) || ' ' AS smallint)",
    "CAST(CASE WHEN flag THEN ' Yes' ELSE 'oFf ' END AS boolean)",
    "CAST(CASE WHEN flag THEN 't' ELSE '0' END AS boolean)",
    "CAST(to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS date)",
    "CAST(ts AT TIME ZONE 'UTC' AS text)",
    "CAST(t AT TIME ZONE 'UTC' AS text)",
    "CAST(CAST(ts AT TIME ZONE 'UTC' AS text) AS timestamp)",
    "CAST(to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI') AS timestamp)",
    "CAST(CAST(ts AT TIME ZONE 'UTC' AS date) AS timestamp)",
    "CAST(flag AS integer)",
    "CAST(i AS boolean)",
    # date_part: extract in double precision
    "date_part('hour', ts AT TIME ZONE 'UTC')",
    "date_part('second', ts AT TIME ZONE 'UTC')",
    "date_part('milliseconds', ts AT TIME ZONE 'UTC')",
    "date_part('microseconds', ts AT TIME ZONE 'UTC')",
    "date_part('epoch', ts)",
    "date_part('epoch', ts AT TIME ZONE 'UTC')",
    "date_part('dow', CAST(ts AT TIME ZONE 'UTC' AS date))",
    "date_part('year', t AT TIME ZONE 'UTC')",
    # to_char of a timestamp (UTC wall clock) or a date
    "to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "to_char(ts AT TIME ZONE 'UTC', 'HH24:MI')",
    "to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')",
    "to_char(ts AT TIME ZONE 'UTC', 'YY/MM/DD HH12 AM US')",
    "to_char(ts AT TIME ZONE 'UTC', 'Mon MON mon Dy DY dy')",
    "to_char(ts AT TIME ZONE 'UTC', 'Month|Day|MONTH|day|')",
    "to_char(ts AT TIME ZONE 'UTC', 'FMMonth FMDay FMDD FMMM FMHH24 FMMI FMSS')",
    "to_char(ts AT TIME ZONE 'UTC', 'D DDD Q PM hh12 mi ss')",
    "to_char(t AT TIME ZONE 'UTC', '\"week of\" YYYY-MM-DD\"T\"HH24')",
    "to_char(CAST(ts AT TIME ZONE 'UTC' AS date), 'YYYY/MM/DD Dy HH24')",
    # regular expressions
    "substring(txt FROM 'b(.)')",
    "substring(txt FROM '[a-z]+')",
    "substring(txt FROM '^(.)')",
    "substring(txt FROM 'c$')",
    "substring(txt FROM '(?:[A-Z]b)')",
    "substring(txt FROM '\\s(\\w+)')",
    "substring(g FROM '(a)')",
    "(regexp_match(txt, '([A-Za-z])([a-z]*)'))[2]",
    "(regexp_match(txt, '([A-Za-z])([a-z]*)'))[1]",
    "(regexp_match(txt, 'b.'))[1]",
    "txt ~ 'b|z'",
    "txt ~ '^[A-Z]'",
    "txt ~ 'c$'",
    "txt !~ 'c'",
    "txt ~ 'a.*?c'",
    "regexp_replace(txt, '[a-c]', 'x', 'g')",
    "regexp_replace(txt, '(b)(c)', '\\2\\1', 'g')",
    "regexp_replace(txt, 'b', '$&\\&', 'g')",
    "regexp_replace(txt, '\\s', '', 'g')",
    # ILIKE folds ASCII letters only (the "C" collation)
    "txt ILIKE 'a%'",
    "txt ILIKE '%C%'",
    "txt ILIKE 'äbc'",
    "txt NOT ILIKE 'ABC'",
    "extract(dow FROM CAST(ts AT TIME ZONE 'UTC' AS date))",
    "extract(week FROM CAST(t AT TIME ZONE 'UTC' AS date))",
    "extract(epoch FROM CAST(ts AT TIME ZONE 'UTC' AS date))",
    # casts to text
    "CAST(i AS text)",
    "b::text",
    "s::text",
    "flag::text",
    "n::text",
    "CAST(n AS numeric(20,6))::text",
    "CAST(ts AT TIME ZONE 'UTC' AS date)::text",
    "i::text || '!'",
]

# Known divergences the translation cannot fix; strict, so fixing them shows up here.
KNOWN_DIVERGENCES: dict[str, str] = {}


def _spark_sql(expression: str) -> str:
    return to_spark(parse_expression(expression), SCHEMA).sql("spark")


@dataclass
class Outcome:
    values: list[object] | None = None  # one value per row, by id
    error: str | None = None


def _evaluate(run_batch, run_one, expressions: list[str]) -> dict[str, Outcome]:  # type: ignore[no-untyped-def]
    """All expressions in one query; if that fails, one query each, to tell which failed."""
    try:
        rows = run_batch(expressions)
        return {e: Outcome([r[k] for r in rows]) for k, e in enumerate(expressions)}
    except Exception:  # noqa: BLE001 - some expression failed; find out which
        outcomes = {}
        for e in expressions:
            try:
                outcomes[e] = Outcome([r[0] for r in run_one(e)])
            except Exception as error:  # noqa: BLE001
                outcomes[e] = Outcome(error=f"{type(error).__name__}: {str(error).splitlines()[0]}")
        return outcomes


@pytest.fixture(scope="module")
def spark_outcomes(session: SparkSession) -> dict[str, Outcome]:
    translated: dict[str, str] = {}
    outcomes: dict[str, Outcome] = {}
    for e in EXPRESSIONS:
        try:
            translated[e] = _spark_sql(e)
        except UnsupportedSQL as error:
            outcomes[e] = Outcome(error=f"UnsupportedSQL: {error}")

    def run(expressions: list[str]) -> list[list[object]]:
        items = ", ".join(f"{translated[e]} AS `e{k}`" for k, e in enumerate(expressions))
        table = session.sql(f"SELECT {items} FROM {SOURCE} ORDER BY id").toArrow()
        return [list(r.values()) for r in table.to_pylist()]

    outcomes |= _evaluate(run, lambda e: run([e]), [e for e in EXPRESSIONS if e in translated])
    return outcomes


@pytest.fixture(scope="module")
def pg_outcomes(db_url: str) -> dict[str, Outcome]:
    with _pg_connect(db_url, PG_EXPRESSION_TIMEZONE) as conn:

        def run(expressions: list[str]) -> list[tuple[object, ...]]:
            items = ", ".join(f"({e}) AS e{k}" for k, e in enumerate(expressions))
            return conn.execute(f"SELECT {items} FROM {SOURCE} ORDER BY id").fetchall()

        return _evaluate(run, lambda e: run([e]), EXPRESSIONS)


def _same(pg: object, spark: object, rel_tol: float = 0.0) -> bool:
    """Equal values of corresponding types; numerics compare by value (Spark's decimals
    have a fixed scale, PostgreSQL's numeric a scale per value)."""
    if pg is None or spark is None:
        return pg is None and spark is None
    if isinstance(pg, bool) or isinstance(spark, bool):
        return type(pg) is type(spark) and pg == spark
    for kind in (Decimal, float, int, str, dt.datetime, dt.date):
        if isinstance(pg, kind):
            if not isinstance(spark, kind):
                return False
            if kind is float and rel_tol:
                return math.isclose(pg, spark, rel_tol=rel_tol)  # type: ignore[arg-type]
            return pg == spark
    raise AssertionError(f"unexpected value {pg!r}")


def _params(expressions: list[str], known: dict[str, str]) -> list[object]:
    return [
        pytest.param(e, marks=pytest.mark.xfail(reason=known[e], strict=True)) if e in known else e
        for e in expressions
    ]


@pytest.mark.parametrize("expression", _params(EXPRESSIONS, KNOWN_DIVERGENCES))
def test_expression_agrees(
    expression: str, spark_outcomes: dict[str, Outcome], pg_outcomes: dict[str, Outcome]
) -> None:
    pg, spark = pg_outcomes[expression], spark_outcomes[expression]
    spark_sql = _spark_sql(expression)
    assert pg.error is None, f"PostgreSQL failed on {expression!r}: {pg.error}"
    assert spark.error is None, f"Spark failed on {spark_sql!r}: {spark.error}"
    assert pg.values is not None and spark.values is not None
    differ = [
        (row[0], p, s)
        for row, p, s in zip(ROWS, pg.values, spark.values, strict=True)
        if not _same(p, s)
    ]
    assert not differ, (
        f"{expression!r} (Spark: {spark_sql!r}) differs; (id, PostgreSQL, Spark): {differ}"
    )


# Expressions that must fail in both engines on this row: overflow, division by zero.
EDGE_ROW = {
    "i": (-(2**31), pa.int32()),
    "s": (-(2**15), pa.int16()),
    "b": (-(2**63), pa.int64()),
    "n": (D("99999999.9999"), pa.decimal128(12, 4)),
    "f": (3e9, pa.float64()),
}
EDGE_SCHEMA = {k: SCHEMA[k] for k in EDGE_ROW}
ERRORS_IN_BOTH = [
    "i / -1",
    "s / CAST(-1 AS smallint)",
    "b / -1",
    "-i",
    "-s",
    "abs(i)",
    "i - 1",
    "b - 1",
    "s * s",
    "i * 2",
    "b + b",
    "i / (s + 32768)",
    "i % (s + 32768)",
    "b / (s + 32768)",
    "f / (s + 32768)",
    "CAST(f AS integer)",
    "CAST(n AS smallint)",
    "CAST(i AS smallint)",
    "CAST(n AS numeric(4,2))",
    "CAST(b AS integer)",
    "sqrt(-f)",
    "power(-f, 0.5)",
    "power(f - f, -1)",
    "power(f, 1000)",
    "power(f, -1000)",
    "mod(i, s + 32768)",
    "substring('abc', 1, i)",
]


@pytest.fixture(scope="module")
def edge_engines(db_url: str, session: SparkSession) -> Iterator[tuple[psycopg.Connection, str]]:
    view = "diff_edge"
    session.createDataFrame(
        pa.table({k: pa.array([v], t) for k, (v, t) in EDGE_ROW.items()})
    ).createOrReplaceTempView(view)
    with _pg_connect(db_url) as conn:
        columns = ", ".join(f"{k} {EDGE_SCHEMA[k].pg()}" for k in EDGE_ROW)
        conn.execute(f"CREATE TABLE {view} ({columns})")
        conn.execute(
            f"INSERT INTO {view} VALUES ({', '.join(['%s'] * len(EDGE_ROW))})",
            [v for v, _ in EDGE_ROW.values()],
        )
        yield conn, view
    session.catalog.dropTempView(view)


@pytest.mark.parametrize("expression", ERRORS_IN_BOTH)
def test_expression_fails_in_both(
    expression: str, session: SparkSession, edge_engines: tuple[psycopg.Connection, str]
) -> None:
    conn, view = edge_engines
    spark_sql = to_spark(sqlglot.parse_one(expression, read="postgres"), EDGE_SCHEMA).sql("spark")
    with pytest.raises(psycopg.DataError):
        conn.execute(f"SELECT {expression} FROM {view}")
    try:
        result = session.sql(f"SELECT {spark_sql} FROM {view}").collect()
    except Exception as error:  # noqa: BLE001 - any Spark arithmetic error will do
        assert (
            "ARITHMETIC" in str(error)
            or "DIVIDE_BY_ZERO" in str(error)
            or ("OUT_OF_RANGE" in str(error) or "OVERFLOW" in str(error))
            # raise_error(): where a translation raises as PostgreSQL does
            or "USER_RAISED_EXCEPTION" in str(error)
        ), str(error).splitlines()[0]
    else:
        pytest.fail(f"PostgreSQL raises on {expression!r} but Spark ({spark_sql!r}) gives {result}")


REFUSED: list[tuple[str, str]] = [
    ("n / 2", "division of numeric values"),
    ("i / 2.0", "division of numeric values"),
    ("n / i", "division of numeric values"),
    ("i / 1e3", "division of numeric values"),
    ("u / u", "division of numeric values"),
    ("99999999999999999999 / 2", "division of numeric values"),
    ("f % 2", "%"),
    ("CAST(f AS numeric(10,2))", "15 significant digits"),
    ("CAST(f AS numeric)", "15 significant digits"),
    ("CAST(txt AS timestamptz)", "CAST of text to timestamptz is not supported"),
    ("CAST(b AS boolean)", "CAST of bigint to boolean is not supported"),
    ("'x' || i", "|| joins text values only"),
    ("lower(i)", "lower() and upper() take text"),
    ("txt > 5", "compares text with integer"),
    ("ts = 5", "compares timestamptz with integer"),
    ("i AND flag", "boolean"),
    ("NOT i", "boolean"),
    ("CASE WHEN i THEN 1 END", "boolean"),
    ("1e40 + n", "38 digits"),
    ("round(f, 2)", "round(double precision, n) does not exist"),
    ("round(n, i)", "whole-number literal"),
    ("round(n, 39)", "from -38 to 38"),
    ("round(txt)", "round() takes a number"),
    ("sqrt(n)", "sqrt() of numeric"),
    ("power(n, 2)", "power() of numeric"),
    ("power(txt, 2)", "power() takes numbers"),
    ("greatest(i, txt)", "greatest() mixes integer and text"),
    ("nullif(txt, 1)", "nullif() mixes text and integer"),
    ("length(i)", "length() takes text"),
    ("strpos(i, 'a')", "strpos() takes text"),
    ("left(txt, b)", "left() takes an integer"),
    ("substring(txt, 1.5)", "substring() takes an integer"),
    ("repeat(txt, b)", "repeat() takes an integer"),
    ("concat(txt, f)", "concat() takes text and integers"),
    ("to_char(ts, 'YYYY')", "to_char(ts AT TIME ZONE 'UTC', pattern)"),
    ("to_char(ts AT TIME ZONE 'UTC', 'YYYY WW')", "field 'WW'"),
    ("to_char(i, '999')", "to_char() takes a timestamp or a date"),
    ("substring(txt FROM 'a|ab')", "alternatives of 'a|ab'"),
    ("substring(txt FROM '(a)?')", "quantified group"),
    ("substring(txt FROM 'a+?')", "lazy quantifier"),
    ("substring(txt FROM '[[:alpha:]]')", "[:alpha:]"),
    ("substring(txt FROM 'x' FOR '#')", "SQL regular expressions"),
    ("txt ~ '\\mabc'", "escape \\m"),
    ("txt ~ '(a)\\1'", "back references"),
    ("txt ~ '(?i)a'", "(?i"),
    ("txt ~* 'a'", "~* (case-insensitive"),
    ("txt ~ g", "string literal"),
    ("regexp_replace(txt, 'a', 'b')", "flag 'g'"),
    ("regexp_match(txt, 'a')", "returns an array"),
    ("(regexp_match(txt, '(a)'))[2]", "from 1 to 1"),
    ("txt[1]", "the subscript"),
    ("foo(txt)", "foo() is not supported"),
    ("date_part('century', ts AT TIME ZONE 'UTC')", "field 'century'"),
    ("date_part('hour', ts)", "session time zone"),
    ("txt LIKE g", "string literal"),
    ("txt LIKE 'a\\b'", "backslash escapes"),
    ("i LIKE 'a'", "LIKE() takes text"),
    ("txt IN (1, 2)", "IN compares text with integer"),
    ("date_trunc('day', ts)", "date_trunc('day', ts, 'UTC')"),
    ("date_trunc('day', ts, 'Asia/Kathmandu')", "date_trunc('day', ts, 'UTC')"),
    ("date_trunc('decade', ts, 'UTC')", "unit 'decade'"),
    ("date_trunc('day', i)", "date_trunc() takes timestamptz"),
    ("CAST(ts AS date)", "CAST(ts AT TIME ZONE 'UTC' AS date)"),
    ("ts AT TIME ZONE 'Asia/Kathmandu'", "AT TIME ZONE 'UTC' only"),
    ("CAST(f AS text)", "CAST of double precision to text"),
    ("CAST(u AS text)", "CAST of numeric to text"),
    ("CAST(n * n AS text)", "CAST of numeric to text"),
    ("CAST(ts AS text)", "CAST of timestamptz to text"),
    ("extract(year FROM ts)", "extract(year FROM ts AT TIME ZONE 'UTC')"),
    ("extract(hour FROM CAST(ts AT TIME ZONE 'UTC' AS date))", "does not exist for a date"),
    ("extract(century FROM ts AT TIME ZONE 'UTC')", "field 'century'"),
    ("extract(year FROM i)", "extract() takes a timestamp"),
]


@pytest.mark.parametrize("expression,fragment", REFUSED)
def test_translator_refuses(expression: str, fragment: str) -> None:
    with pytest.raises(UnsupportedSQL) as caught:
        _spark_sql(expression)
    assert fragment in str(caught.value)


# ---------------------------------------------------------------------------------------
# Window start: Spark's arithmetic vs strata_window_start vs date_bin vs Python.
# ---------------------------------------------------------------------------------------

WINDOW_SIZES_US = {
    "1us": 1,
    "7us": 7,
    "1s": 1_000_000,
    "1min": 60_000_000,
    "90s": 90_000_000,
    "5min": 300_000_000,
    "1h": 3_600_000_000,
    "1day": 86_400_000_000,
    "7days": 604_800_000_000,
}


@pytest.fixture(scope="module")
def window_starts(db_url: str, session: SparkSession) -> dict[str, list[tuple[int, ...]]]:
    """Per size: (input micros, Spark, strata_window_start, date_bin) per row, in micros."""
    spark_items = ", ".join(
        f"unix_micros({window_start_spark('ts', size).sql('spark')}) AS `w_{name}`"
        for name, size in WINDOW_SIZES_US.items()
    )
    spark_rows = (
        session.sql(f"SELECT unix_micros(ts) AS micros, {spark_items} FROM {SOURCE} ORDER BY id")
        .toArrow()
        .to_pylist()
    )

    def micros(value: str) -> str:
        return f"(extract(epoch FROM {value}) * 1000000)::bigint"

    pg_items = []
    for size in WINDOW_SIZES_US.values():
        pg_items.append(micros(f"strata_window_start(ts, {size})"))
        pg_items.append(
            micros(f"date_bin(interval '{size} microseconds', ts, timestamptz 'epoch')")
        )
    # Window starts are absolute instants: the session time zone must not matter.
    with _pg_connect(db_url, "America/St_Johns") as conn:
        pg_rows = conn.execute(
            f"SELECT {micros('ts')}, {', '.join(pg_items)} FROM {SOURCE} ORDER BY id"
        ).fetchall()
    result: dict[str, list[tuple[int, ...]]] = {}
    for k, name in enumerate(WINDOW_SIZES_US):
        result[name] = [
            (s["micros"], s[f"w_{name}"], p[1 + 2 * k], p[2 + 2 * k])
            for s, p in zip(spark_rows, pg_rows, strict=True)
        ]
        assert [s["micros"] for s in spark_rows] == [p[0] for p in pg_rows]
    return result


@pytest.mark.parametrize("size_name", list(WINDOW_SIZES_US))
def test_window_start_in_spark_floors(
    size_name: str, window_starts: dict[str, list[tuple[int, ...]]]
) -> None:
    """Spark's window start (what the partials carry) = date_bin in PostgreSQL = the floor."""
    size = WINDOW_SIZES_US[size_name]
    for micros, spark, _, date_bin in window_starts[size_name]:
        floor = micros // size * size  # Python floors: before 1970 too
        assert (spark, date_bin) == (floor, floor), (
            f"ts={micros}us, size={size}us: Spark {spark}, date_bin {date_bin}, floor {floor}"
        )
        assert floor <= micros < floor + size


@pytest.mark.parametrize(
    "size_name",
    list(WINDOW_SIZES_US),
)
def test_strata_window_start_floors(
    size_name: str, window_starts: dict[str, list[tuple[int, ...]]]
) -> None:
    """PostgreSQL's strata_window_start (the batch oracle's window) = the floor."""
    size = WINDOW_SIZES_US[size_name]
    wrong = [
        (micros, strata_fn, micros // size * size)
        for micros, _, strata_fn, _ in window_starts[size_name]
        if strata_fn != micros // size * size
    ]
    assert not wrong, f"size={size}us: (ts, strata_window_start, floor) in us: {wrong}"


def test_window_rows_cover_edge_timestamps() -> None:
    micros = sorted(_micros(row[9]) for row in ROWS)
    assert micros[0] == -62135596800000000  # 0001-01-01
    assert -1 in micros and 0 in micros  # just before, at the epoch
    assert micros[-1] == 253402300799999999  # 9999-12-31 23:59:59.999999


# ---------------------------------------------------------------------------------------
# Aggregates: partials in Spark, final in the view, vs PostgreSQL over the raw rows.
# ---------------------------------------------------------------------------------------

AGGREGATES: dict[str, str] = {
    "c_star": "count(*)",
    "c_i": "count(i)",
    "c_txt": "count(txt)",
    "c_ts": "count(ts)",
    "c_flag": "count(flag)",
    **{f"sum_{c}": f"sum({c})" for c in "ibsnuf"},
    **{f"min_{c}": f"min({c})" for c in ("i", "b", "s", "n", "u", "f", "txt", "ts")},
    **{f"max_{c}": f"max({c})" for c in ("i", "b", "s", "n", "u", "f", "txt", "ts")},
    **{f"avg_{c}": f"avg({c})" for c in "ibsnuf"},
    # aggregates over translated expressions
    "sum_i_div_2": "sum(i / 2)",
    "max_lower_txt": "max(lower(txt))",
    "avg_n_times_2": "avg(n * 2)",
    "c_case": "count(CASE WHEN flag THEN 1 END)",
    "sum_f_int": "sum(CAST(f AS integer))",
    # casts to unbounded numeric keep every digit
    "sum_n3": "sum(CAST(n * n * n AS numeric))",
    "min_n3": "min(CAST(n * n * n AS numeric))",
    "sum_i_num": "sum(CAST(i AS numeric))",
    "max_b_num": "max(CAST(b AS numeric))",
    "max_txt_id": "max(CAST(txt AS text))",
    # merged by sql/002 (tests/test_aggregates.py covers them in depth)
    **{f"sd_{c}": f"stddev({c})" for c in "ibsnuf"},
    "sds_n": "stddev_samp(n)",
    "sdp_b": "stddev_pop(b)",
    "var_u": "variance(u)",
    "vp_f": "var_pop(f)",
    "band": "bool_and(flag)",
    "bor": "bool_or(flag)",
    "every": "every(flag)",
    **{f"cd_{c}": f"count(DISTINCT {c})" for c in ("i", "n", "f", "txt", "ts", "flag")},
    "c_filter": "count(*) FILTER (WHERE flag)",
    "sd_filter": "stddev(n) FILTER (WHERE i > 0)",
}
# Invariant 5: PostgreSQL's result types.
EXPECTED_TYPES = {
    "count": "bigint",
    "sum(i)": "bigint",
    "sum(s)": "bigint",
    "sum(b)": "numeric",
    "sum(n)": "numeric",
    "sum(u)": "numeric",
    "sum(f)": "double precision",
    "avg(i)": "numeric",
    "avg(s)": "numeric",
    "avg(b)": "numeric",
    "avg(n)": "numeric",
    "avg(u)": "numeric",
    "avg(f)": "double precision",
    "min(i)": "integer",
    "min(b)": "bigint",
    "min(s)": "smallint",
    "min(n)": "numeric",
    "min(f)": "double precision",
    "min(txt)": "text",
    "min(ts)": "timestamp with time zone",
}
# Float sums and averages depend on summation order; everything else is exact.
FLOAT_REL_TOL = 1e-12


def _derived(name: str, select: str, group: str, where: str = "") -> str:
    return (
        f"CREATE STREAM {name} AS SELECT {select} "
        f"FROM TUMBLE({SOURCE}, t, INTERVAL '1 hour') {where} GROUP BY {group}"
    )


AGG_STREAM = "diff_aggs"
AGG_SELECT = ", ".join(f"{call} AS {alias}" for alias, call in AGGREGATES.items())
AGG_SQL = _derived(AGG_STREAM, f"window_start, g, {AGG_SELECT}", "window_start, g")
AGG_ORACLE = (
    f"SELECT strata_window_start(t, 3600000000) AS window_start, g, {AGG_SELECT} "
    f"FROM {SOURCE} GROUP BY 1, 2"
)
KEY_STREAM = "diff_keys"
KEY_SELECT = (
    "i / 3 AS k_div, upper(txt) AS k_up, CAST(f AS integer) AS k_fint, "
    "CAST(n AS integer) AS k_nint, count(*) AS c, sum(n * 2) AS s2"
)
KEY_GROUP = "i / 3, upper(txt), CAST(f AS integer), CAST(n AS integer)"
KEY_WHERE = "WHERE COALESCE(n, 1) <> 0"
KEY_SQL = _derived(KEY_STREAM, f"window_end, {KEY_SELECT}", f"window_end, {KEY_GROUP}", KEY_WHERE)
KEY_ORACLE = (
    f"SELECT strata_window_start(t, 3600000000) + interval '1 hour' AS window_end, "
    f"{KEY_SELECT} FROM {SOURCE} {KEY_WHERE} GROUP BY 1, {KEY_GROUP}"
)


@dataclass
class Consolidated:
    keys: int  # the first `keys` columns are the window and the group keys
    columns: list[str]
    view_rows: list[tuple[object, ...]]
    oracle_rows: list[tuple[object, ...]]
    view_types: dict[str, str]
    oracle_types: dict[str, str]


def _column_types(conn: psycopg.Connection, relation: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
        (relation,),
    ).fetchall()
    return dict(rows)


@pytest.fixture(scope="module")
def consolidated(db_url: str, spark: SparkSession) -> dict[str, Consolidated]:
    """Both derived streams planned, partials by SparkBackend over three runs, COPYed into
    the partial archives; each view and its oracle (a view too, for its column types)."""
    source = _source_plan()
    plans = {}
    for sql_text in (AGG_SQL, KEY_SQL):
        plan = rewrite(sql_text, {SOURCE: source})
        assert isinstance(plan, ParallelAggregatePlan)
        plans[plan.name] = plan
    partials = SparkBackend(spark).partials(_arrow_rows(), list(plans.values()), source=SOURCE)
    result = {}
    with _pg_connect(db_url) as conn:
        for name, oracle, keys in ((AGG_STREAM, AGG_ORACLE, 2), (KEY_STREAM, KEY_ORACLE, 5)):
            plan = plans[name]
            for statement in plan.create_statements:
                conn.execute(statement)
            assert partials[name].num_rows > 0
            with conn.cursor() as cursor:
                copy_in(cursor, partial_archive_table(name), partials[name])
            conn.execute(f"CREATE VIEW {name}_oracle AS {oracle}")
            columns = [o.name for o in plan.outputs]
            order = ", ".join(f'"{c}"' for c in columns)
            select = f"SELECT {order} FROM {{}} ORDER BY {order}"
            result[name] = Consolidated(
                keys=keys,
                columns=columns,
                view_rows=conn.execute(select.format(name)).fetchall(),
                oracle_rows=conn.execute(select.format(f"{name}_oracle")).fetchall(),
                view_types=_column_types(conn, name),
                oracle_types=_column_types(conn, f"{name}_oracle"),
            )
    return result


def test_small_batches_are_one_task_with_the_same_partials(spark: SparkSession) -> None:
    """A batch of at most ``single_task_rows`` rows for several streams is read as one
    partition, so that its GROUP BYs need no shuffle; the partial rows are those of the
    shuffled plan."""
    source = _source_plan()
    plans = [rewrite(text, {SOURCE: source}) for text in (AGG_SQL, KEY_SQL)]
    rows = _arrow_rows()
    single = SparkBackend(spark)
    shuffled = SparkBackend(spark, single_task_rows=0)
    one = single.partials(rows, plans, source=SOURCE)  # type: ignore[arg-type]
    other = shuffled.partials(rows, plans, source=SOURCE)  # type: ignore[arg-type]
    for plan in plans:
        a, b = one[plan.name], other[plan.name]
        assert a.num_rows > 1
        assert sorted(a.to_pylist(), key=repr) == sorted(b.to_pylist(), key=repr)

    def physical(backend: SparkBackend) -> str:
        frame = backend._read(spark, rows, None, single=True)  # noqa: SLF001 - the plan is the point
        grouped = frame.groupBy(RUN_COLUMN, "g").count()
        return str(grouped._jdf.queryExecution().executedPlan().toString())  # noqa: SLF001

    assert "Exchange" not in physical(single)
    assert "Exchange" in physical(shuffled)


def test_a_small_batch_shipped_from_memory_means_what_its_spooled_file_means(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A batch of at most ``shipped_rows`` rows goes to Spark from the driver's memory, not
    from its spooled Parquet file: with the same Spark types (a timestamp without time zone
    is TIMESTAMP_NTZ either way) and the same partial rows."""
    source = rewrite(
        "CREATE STREAM diff_shipped (k text, s smallint, n numeric(12,4), d date, "
        "lt timestamp, t timestamptz) WITH (event_time = 't')",
        {},
    )
    assert isinstance(source, RawStreamPlan)
    plan = rewrite(
        "CREATE STREAM diff_shipped_agg AS SELECT k, count(*) AS c, sum(n) AS n, sum(s) AS s, "
        "min(d) AS d, max(lt) AS lt, min(CAST(lt AS date)) AS lt_day, window_start "
        "FROM TUMBLE(diff_shipped, t, INTERVAL '1 hour') GROUP BY k, window_start",
        {"diff_shipped": source},
    )
    base = dt.datetime(2024, 3, 31, 0, 30)
    rows = pa.table(
        {
            "k": pa.array(["a", "b", None, "a"]),
            "s": pa.array([1, 2, None, -3], pa.int16()),
            "n": pa.array([Decimal("1.5"), None, Decimal("-2.25"), Decimal("0.0001")]),
            "d": pa.array([dt.date(2024, 3, 31), None, dt.date(2024, 1, 1), dt.date(2023, 2, 28)]),
            "lt": pa.array([base, base + dt.timedelta(hours=3), None, base]),
            "t": pa.array(
                [base.replace(tzinfo=dt.UTC) + dt.timedelta(minutes=m) for m in (0, 50, 70, 130)]
            ),
            RUN_COLUMN: pa.array([1, 1, 2, 2], pa.int64()),
        }
    ).cast(arrow_schema(source.columns).append(pa.field(RUN_COLUMN, pa.int64())))
    spooled = Spool(tmp_path).write(1, rows)
    shipped, read = SparkBackend(spark), SparkBackend(spark, shipped_rows=0)
    frames = [b._scan(spark, rows, [str(spooled)]) for b in (shipped, read)]  # noqa: SLF001
    assert frames[0].schema == frames[1].schema
    assert "LocalTableScan" in frames[0]._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001
    assert "FileScan" in frames[1]._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001
    one, other = (
        b.partials(rows, [plan], source="diff_shipped", files=[str(spooled)])[plan.name]  # type: ignore[list-item]
        for b in (shipped, read)
    )
    assert one.schema == other.schema
    assert one.num_rows == 4
    assert sorted(one.to_pylist(), key=repr) == sorted(other.to_pylist(), key=repr)


def test_every_registry_aggregate_is_covered() -> None:
    calls = [*AGGREGATES.values(), "approx_count_distinct(i)", "approx_percentile(f, 0.5)"]
    used = {rule_for(sqlglot.parse_one(call, read="postgres")).name for call in calls}
    # The approximate aggregates have no PostgreSQL twin: tests/test_aggregates.py checks them
    # against count(DISTINCT x) and percentile_disc within their documented bounds.
    assert used == set(REGISTRY)


def test_partials_span_several_runs_per_group() -> None:
    runs: dict[tuple[str, int], set[int]] = {}
    for row, run in zip(ROWS, _arrow_rows()[RUN_COLUMN].to_pylist(), strict=True):
        runs.setdefault((row[1], row[11].hour), set()).add(run)
    assert max(len(r) for r in runs.values()) == 3


def _check_column(result: Consolidated, column: str, rel_tol: float) -> None:
    k, n = result.columns.index(column), result.keys
    view_groups = [v[:n] for v in result.view_rows]
    oracle_groups = [o[:n] for o in result.oracle_rows]
    if k < n or view_groups != oracle_groups:
        assert view_groups == oracle_groups, f"{column}: the groups (window, keys) differ"
    differ = [
        (v[:n], v[k], o[k])
        for v, o in zip(result.view_rows, result.oracle_rows, strict=True)
        if not _same(o[k], v[k], rel_tol)
    ]
    assert not differ, f"{column}: (group, view, PostgreSQL over raw rows): {differ}"
    assert result.view_types[column] == result.oracle_types[column]


@pytest.mark.parametrize("alias", ["window_start", "g", *AGGREGATES])
def test_aggregate_agrees(alias: str, consolidated: dict[str, Consolidated]) -> None:
    result = consolidated[AGG_STREAM]
    call = AGGREGATES.get(alias, "")
    is_float = result.oracle_types[alias] == "double precision" and call[:3] in (
        "sum",
        "avg",
        "std",
        "var",
    )
    _check_column(result, alias, FLOAT_REL_TOL if is_float else 0.0)
    rule = call.split("(")[0]
    expected = EXPECTED_TYPES.get("count" if rule == "count" else call.replace("max(", "min("))
    if expected is not None:
        assert result.view_types[alias] == expected


@pytest.mark.parametrize("column", ["window_end", "k_div", "k_up", "k_fint", "k_nint", "c", "s2"])
def test_expression_keys_and_where_agree(
    column: str, consolidated: dict[str, Consolidated]
) -> None:
    _check_column(consolidated[KEY_STREAM], column, 0.0)


@pytest.mark.parametrize("alias", ["sum_n3", "min_n3", "sum_i_num", "max_b_num", "sum_n"])
def test_unbounded_numeric_keeps_postgresqls_scale(
    alias: str, consolidated: dict[str, Consolidated]
) -> None:
    """A cast to unbounded numeric keeps every digit and PostgreSQL's scale: the view prints
    what PostgreSQL prints (1.000000000343, not 1.0000000003; 9.9003, not 9.9003000000)."""
    result = consolidated[AGG_STREAM]
    k = result.columns.index(alias)
    view = [str(v[k]) for v in result.view_rows]
    oracle = [str(o[k]) for o in result.oracle_rows]
    assert view == oracle
