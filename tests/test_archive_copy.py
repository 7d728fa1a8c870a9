"""Arrow tables go into archives by COPY in PostgreSQL's binary format when every column's
type allows, as CSV otherwise (server/ingest/archive.py): both give the same rows back,
whatever the values - nulls, empty and non-ASCII text, extreme integers, infinities,
instants before 2000 and far ahead."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewriter.naming import INTERNAL_SCHEMA
from server.ingest.archive import _binary_fits, copy_in, copy_out

SCHEMA = pa.schema(
    [
        ("k", pa.string()),
        ("n", pa.int64()),
        ("i", pa.int32()),
        ("x", pa.float64()),
        ("ok", pa.bool_()),
        ("d", pa.date32()),
        ("t", pa.timestamp("us", tz="UTC")),
        ("w", pa.timestamp("us")),
        ("p", pa.decimal128(12, 4)),
        ("strata_run", pa.int64()),
    ]
)
COLUMNS = (
    "k text, n bigint, i integer, x double precision, ok boolean, d date, t timestamptz, "
    "w timestamp, p numeric(12,4), strata_run bigint"
)
EPOCH = datetime(1970, 1, 1)

rows = st.lists(
    st.tuples(
        st.none() | st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=12),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.integers(-(2**31), 2**31 - 1),
        st.none() | st.floats(allow_nan=False),
        st.none() | st.booleans(),
        st.none() | st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)),
        st.none() | st.integers(-(2**52), 2**52),  # µs from 1970: ± 142 years
        st.none() | st.integers(-(2**52), 2**52),
        st.none()
        | st.decimals(min_value=-(10**8) + 1, max_value=10**8 - 1, places=4, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


def table(values: list[tuple]) -> pa.Table:
    columns = list(zip(*values, strict=True))
    arrays = [
        pa.array(columns[0], pa.string()),
        pa.array(columns[1], pa.int64()),
        pa.array(columns[2], pa.int32()),
        pa.array(columns[3], pa.float64()),
        pa.array(columns[4], pa.bool_()),
        pa.array(columns[5], pa.date32()),
        pa.array(columns[6], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(columns[7], pa.int64()).cast(pa.timestamp("us")),
        pa.array(columns[8], pa.decimal128(12, 4)),
        pa.array([7] * len(values), pa.int64()),
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


@pytest.fixture(scope="module")
def archives(pg_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA IF NOT EXISTS {INTERNAL_SCHEMA}")
        for name, extra in (("copy_binary", ""), ("copy_csv", ", m text")):
            connection.execute(f"DROP TABLE IF EXISTS {INTERNAL_SCHEMA}.{name}")
            connection.execute(f"CREATE TABLE {INTERNAL_SCHEMA}.{name} ({COLUMNS}{extra})")
        yield connection


@given(values=rows)
def test_binary_and_csv_copies_give_the_rows_back(
    archives: psycopg.Connection, values: list[tuple]
) -> None:
    data = table(values)
    cursor = archives.cursor()
    # A double going to a text column has no binary form: the table goes as CSV.
    csv = data.append_column("m", pa.array([1.5] * data.num_rows, pa.float64()))
    assert _binary_fits(cursor, "copy_binary", data.schema)
    assert not _binary_fits(cursor, "copy_csv", csv.schema)
    for name in ("copy_binary", "copy_csv"):
        cursor.execute(f"TRUNCATE {INTERNAL_SCHEMA}.{name}")
    assert copy_in(cursor, "copy_binary", data) == data.num_rows
    assert copy_in(cursor, "copy_csv", csv) == data.num_rows
    for name in ("copy_binary", "copy_csv"):
        back = copy_out(cursor, name, SCHEMA)
        assert _rows(back) == _rows(data), name
    # The instants PostgreSQL holds are the ones sent (not shifted by an epoch or a zone).
    cursor.execute(f"SELECT t, w FROM {INTERNAL_SCHEMA}.copy_binary")
    held = sorted(cursor.fetchall(), key=repr)
    sent = (
        (
            None if t is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=t),
            None if w is None else EPOCH + timedelta(microseconds=w),
        )
        for *_, t, w, _p in values
    )
    assert held == sorted(sent, key=repr)


def _rows(data: pa.Table) -> list[tuple]:
    """The rows in a comparable order; floats by their bits (-0.0 and 0.0 differ)."""
    rows = []
    for row in data.to_pylist():
        x = row["x"]
        row["x"] = None if x is None else (math.copysign(1, x), abs(x))
        rows.append(tuple(row.values()))
    return sorted(rows, key=repr)
