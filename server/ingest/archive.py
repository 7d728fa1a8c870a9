"""Moving Arrow tables in and out of PostgreSQL archives with COPY (CSV), the fast path."""

from __future__ import annotations

import io

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from psycopg import sql

from rewriter.naming import INTERNAL_SCHEMA, RUN_COLUMN

_CHUNK = 1 << 20


def internal_table(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(INTERNAL_SCHEMA), sql.Identifier(name))


def copy_in(cursor: psycopg.Cursor, table: str, data: pa.Table) -> int:
    """COPY ``data`` (columns by name) into the internal table ``table``; returns rows."""
    if data.num_rows == 0:
        return 0
    buffer = io.BytesIO()
    # Nulls are written as unquoted empty fields and empty strings as "" - exactly the
    # distinction PostgreSQL's CSV COPY makes.
    pa_csv.write_csv(utc_text(data), buffer, pa_csv.WriteOptions(include_header=False))
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        internal_table(table), sql.SQL(", ").join(sql.Identifier(c) for c in data.column_names)
    )
    payload = buffer.getbuffer()
    with cursor.copy(statement) as copy:
        for start in range(0, len(payload), _CHUNK):
            copy.write(payload[start : start + _CHUNK])
    return data.num_rows


def utc_text(data: pa.Table) -> pa.Table:
    """``data`` with its zoned timestamps as UTC text (``2024-01-01 00:00:00.000000+00``).
    Arrow's CSV writer formats a zoned timestamp through a time-zone lookup per value,
    which made it most of the time of writing a run; the zone-less cast keeps the UTC
    value, so the same instants are written thirty times faster."""
    for index, field in enumerate(data.schema):
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            wall = data.column(index).cast(pa.timestamp(field.type.unit)).cast(pa.string())
            text = pc.binary_join_element_wise(wall, pa.scalar("+00"), "")
            data = data.set_column(index, pa.field(field.name, pa.string()), text)
    return data


def copy_out(
    cursor: psycopg.Cursor,
    table: str,
    schema: pa.Schema,
    runs: list[int] | None = None,
    *,
    where: sql.Composable | None = None,
) -> pa.Table:
    """Read the named columns of an internal table into Arrow with the given schema
    (only the rows of ``runs``, and those meeting ``where``, when given)."""
    conditions = [] if where is None else [where]
    if runs is not None:
        conditions.append(
            sql.SQL("{} = ANY({})").format(sql.Identifier(RUN_COLUMN), sql.Literal(runs))
        )
    statement = sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT csv)").format(
        sql.SQL(", ").join(sql.Identifier(n) for n in schema.names),
        internal_table(table),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
    )
    buffer = io.BytesIO()
    with cursor.copy(statement) as copy:
        for block in copy:
            buffer.write(block)
    if buffer.tell() == 0:
        return schema.empty_table()
    buffer.seek(0)
    return pa_csv.read_csv(
        buffer,
        read_options=pa_csv.ReadOptions(column_names=schema.names),
        convert_options=pa_csv.ConvertOptions(
            column_types=schema,
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            # PostgreSQL's CSV spells booleans t and f.
            true_values=["t"],
            false_values=["f"],
        ),
    )
