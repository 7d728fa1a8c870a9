"""Moving Arrow tables in and out of PostgreSQL archives with COPY, the fast path: in
PostgreSQL's binary format where every column's type allows (pgpq writes it from Arrow),
as CSV text otherwise."""

from __future__ import annotations

import io

import pgpq
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from psycopg import sql

from rewriter.naming import INTERNAL_SCHEMA, RUN_COLUMN

_CHUNK = 1 << 20


def internal_table(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(INTERNAL_SCHEMA), sql.Identifier(name))


def copy_in(cursor: psycopg.Cursor, table: str, data: pa.Table, *, binary: bool = True) -> int:
    """COPY ``data`` (columns by name) into the internal table ``table``; returns rows.
    ``binary=False`` writes CSV even where the binary format fits (bench/copy_format.py)."""
    if data.num_rows == 0:
        return 0
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in data.column_names)
    if binary and _binary_fits(cursor, table, data.schema):
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
            internal_table(table), columns
        )
        encoder = pgpq.ArrowToPostgresBinaryEncoder(data.schema)
        with cursor.copy(statement) as copy:
            copy.write(encoder.write_header())
            for batch in data.to_batches():
                copy.write(encoder.write_batch(batch))
            copy.write(encoder.finish())
        return data.num_rows
    buffer = io.BytesIO()
    # Nulls are written as unquoted empty fields and empty strings as "" - exactly the
    # distinction PostgreSQL's CSV COPY makes.
    pa_csv.write_csv(utc_text(data), buffer, pa_csv.WriteOptions(include_header=False))
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        internal_table(table), columns
    )
    payload = buffer.getbuffer()
    with cursor.copy(statement) as copy:
        for start in range(0, len(payload), _CHUNK):
            copy.write(payload[start : start + _CHUNK])
    return data.num_rows


# The column types each Arrow type's binary form (as pgpq writes it) is read into: binary
# COPY has no type on the wire, so a table goes as binary only when each of its columns
# goes to one of these.
_BINARY_TYPES: dict[pa.DataType, frozenset[str]] = {
    pa.bool_(): frozenset({"boolean"}),
    pa.int16(): frozenset({"smallint"}),
    pa.int32(): frozenset({"integer"}),
    pa.int64(): frozenset({"bigint"}),
    pa.float32(): frozenset({"real"}),
    pa.float64(): frozenset({"double precision"}),
    pa.string(): frozenset({"text"}),
    pa.large_string(): frozenset({"text"}),
    pa.binary(): frozenset({"bytea"}),
    pa.date32(): frozenset({"date"}),
    pa.timestamp("us"): frozenset({"timestamp without time zone"}),
}
_ZONED = frozenset({"timestamp with time zone"})


def _binary_fits(cursor: psycopg.Cursor, table: str, schema: pa.Schema) -> bool:
    """Whether every column of ``schema`` can go to ``table``'s column of its name in
    PostgreSQL's binary COPY format."""
    cursor.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
        [f'"{INTERNAL_SCHEMA}"."{table}"'],
    )
    types: dict[str, str] = {str(name): str(kind) for name, kind in cursor.fetchall()}
    for field in schema:
        given = field.type
        target = types.get(field.name, "")
        if pa.types.is_decimal(given):
            # numeric's binary form holds any precision; its typmod rounds it on the way in
            # as it rounds text.
            if target.split("(")[0] != "numeric":
                return False
            continue
        if pa.types.is_timestamp(given) and given.tz is not None:
            accepted = _ZONED if given.unit == "us" else frozenset()
        else:
            accepted = _BINARY_TYPES.get(given, frozenset())
        if target not in accepted:
            return False
    return True


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
