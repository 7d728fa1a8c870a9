"""The rows of an INSERT into a stream as field texts, the form a COPY's rows take, so that
the same value rules apply (server/ingest/parse.py): the VALUES constants, and the Bind
parameters of the extended protocol in text or binary format."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from rewriter.errors import InvalidSQL, UnsupportedSQL
from rewriter.types import ColumnSpec, SqlType
from server.pgwire.statements import Insert, Refused

# Type oids of PostgreSQL's catalog (pg_type), for the column types a stream declares.
TYPE_OIDS = {
    "boolean": 16,
    "bigint": 20,
    "smallint": 21,
    "integer": 23,
    "text": 25,
    "real": 700,
    "double precision": 701,
    "date": 1082,
    "timestamp": 1114,
    "timestamptz": 1184,
    "numeric": 1700,
}
TEXT_OID = 25
_BY_OID = {oid: name for name, oid in TYPE_OIDS.items()} | {1043: "text"}
_UNSPECIFIED = (0, 705)  # no type given, or "unknown": the column's type decides

_EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)
_DATE_2000 = date(2000, 1, 1)


def type_oid(sql_type: SqlType) -> int:
    return TYPE_OIDS.get(sql_type.name, TEXT_OID)


def target_columns(insert: Insert, columns: Sequence[ColumnSpec]) -> list[ColumnSpec]:
    """The stream columns the INSERT's values go to, in order."""
    if insert.columns is None:
        return list(columns)
    by_name = {c.name: c for c in columns}
    chosen = []
    for name in insert.columns:
        if name not in by_name:
            raise Refused(
                InvalidSQL(f"column {name!r} of stream {insert.target.name!r} does not exist"),
                insert.target.at,
            )
        chosen.append(by_name[name])
    return chosen


def parameter_types(insert: Insert, columns: Sequence[ColumnSpec]) -> list[int]:
    """The type oid of each $n: the type of the column it is inserted into."""
    oids = [TEXT_OID] * insert.parameters
    targets = target_columns(insert, columns)
    for row in insert.rows:
        for value, column in zip(row, targets, strict=False):
            if value.parameter is not None:
                oids[value.parameter - 1] = type_oid(column.type)
    return oids


def insert_records(
    insert: Insert,
    columns: Sequence[ColumnSpec],
    parameters: Sequence[str | None] = (),
) -> tuple[list[str], list[tuple[int, list[str | None]]]]:
    """(column names, records) of the INSERT: one record per VALUES row, numbered from 1,
    each with a field per named column (a row may be shorter when no column list is given:
    the rest is NULL, as PostgreSQL fills in defaults)."""
    targets = target_columns(insert, columns)
    names = [c.name for c in targets]
    records = []
    for number, row in enumerate(insert.rows, start=1):
        if len(row) > len(targets):
            raise Refused(
                InvalidSQL("INSERT has more expressions than target columns"), row[len(targets)].at
            )
        if insert.columns is not None and len(row) < len(targets):
            raise Refused(InvalidSQL("INSERT has more target columns than expressions"), row[-1].at)
        fields: list[str | None] = []
        for value in row:
            if value.parameter is None:
                fields.append(value.text)
            elif value.parameter > len(parameters):
                raise Refused(InvalidSQL(f"there is no parameter ${value.parameter}"), value.at)
            else:
                fields.append(parameters[value.parameter - 1])
        fields += [None] * (len(targets) - len(row))
        records.append((number, fields))
    return names, records


def parameter_text(
    value: bytes | None, binary: bool, declared_oid: int, column_type: str, encoding: str
) -> str | None:
    """A Bind parameter as the text of a field. Text-format parameters are their text;
    binary ones are decoded by the type the client declared (else the column's)."""
    if value is None:
        return None
    if not binary:
        return value.decode(encoding, "surrogateescape")
    kind = column_type if declared_oid in _UNSPECIFIED else _BY_OID.get(declared_oid, "")
    decoder = _BINARY.get(kind)
    if decoder is None:
        raise UnsupportedSQL(
            f"a binary parameter of type oid {declared_oid} cannot be inserted into a stream; "
            "send it in text format"
        )
    try:
        return decoder(value)
    except (struct.error, ValueError, OverflowError) as exc:
        raise InvalidSQL(f"malformed binary parameter of type {kind}: {exc}") from None


def _numeric(value: bytes) -> str:
    count, weight, sign, scale = struct.unpack_from("!hhHh", value)
    digits = struct.unpack_from(f"!{count}h", value, 8)
    if sign == 0xC000:
        return "NaN"
    if sign in (0xD000, 0xF000):
        return "Infinity" if sign == 0xD000 else "-Infinity"
    number = Decimal(0)
    for index, digit in enumerate(digits):
        number += Decimal(digit).scaleb(4 * (weight - index))
    text = f"{number:.{scale}f}"
    return "-" + text if sign == 0x4000 else text


def _timestamp(value: bytes, zoned: bool) -> str:
    (micros,) = struct.unpack("!q", value)
    moment = _EPOCH_2000 + timedelta(microseconds=micros)
    text = moment.isoformat()
    return text if zoned else text.replace("+00:00", "")


_BINARY = {
    "boolean": lambda v: "true" if v == b"\x01" else "false",
    "smallint": lambda v: str(struct.unpack("!h", v)[0]),
    "integer": lambda v: str(struct.unpack("!i", v)[0]),
    "bigint": lambda v: str(struct.unpack("!q", v)[0]),
    "real": lambda v: repr(struct.unpack("!f", v)[0]),
    "double precision": lambda v: repr(struct.unpack("!d", v)[0]),
    "text": lambda v: v.decode("utf-8"),
    "numeric": _numeric,
    "date": lambda v: (_DATE_2000 + timedelta(days=struct.unpack("!i", v)[0])).isoformat(),
    "timestamp": lambda v: _timestamp(v, zoned=False),
    "timestamptz": lambda v: _timestamp(v, zoned=True),
}
