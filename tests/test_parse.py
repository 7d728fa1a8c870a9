"""Unit tests of server.ingest.parse: run bodies (NDJSON, CSV) to Arrow tables.

Pure Python + pyarrow: no database, no Spark. Every valid body is parsed three ways (the
public parse_run, the fast path alone where it applies, the slow path alone) and the
results must agree with the expected values; every invalid body must be refused by
parse_run and by the slow path with the same line and column.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter.errors import StrataError
from rewriter.types import ColumnSpec, SqlType
from server.errors import RunFormatError, UnsupportedContentType
from server.ingest import parse as P
from server.ingest.parse import arrow_schema, parse_run, run_format

NDJSON = "application/x-ndjson"
CSV = "text/csv"


def col(name: str, type_name: str, precision: int | None = None, scale: int | None = None):
    return ColumnSpec(name, SqlType(type_name, precision, scale))


ALL = (
    col("ts", "timestamptz"),
    col("name", "text"),
    col("small", "smallint"),
    col("i", "integer"),
    col("big", "bigint"),
    col("price", "numeric", 12, 4),
    col("anynum", "numeric"),
    col("r", "real"),
    col("d", "double precision"),
    col("flag", "boolean"),
    col("local", "timestamp"),
    col("day", "date"),
)
NAMES = [c.name for c in ALL]
SIMPLE = (col("ts", "timestamptz"), col("name", "text"), col("n", "bigint"))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def nd(*lines: str) -> bytes:
    return "\n".join(lines).encode()


def parse_all_ways(
    body: bytes, content_type: str, columns=ALL, event_time: str = "ts", *, fast: bool = True
) -> pa.Table:
    """parse_run, checked against the slow path (and the fast path alone when ``fast``)."""
    table = parse_run(body, content_type, columns, event_time)
    assert table.schema == arrow_schema(columns)
    slow = P._parse(body, content_type, columns, event_time, mode="slow")
    assert slow.schema == table.schema
    assert slow.to_pylist() == table.to_pylist()
    if fast:
        quick = P._parse(body, content_type, columns, event_time, mode="fast")
        assert quick.to_pylist() == table.to_pylist()
    return table


def rows(body: bytes, content_type: str, columns=ALL, event_time: str = "ts", **kw):
    return parse_all_ways(body, content_type, columns, event_time, **kw).to_pylist()


def refused(body: bytes, content_type: str, columns=ALL, event_time: str = "ts") -> RunFormatError:
    """The error of parse_run, which the slow path alone must raise identically."""
    with pytest.raises(RunFormatError) as caught:
        parse_run(body, content_type, columns, event_time)
    with pytest.raises(RunFormatError) as caught_slow:
        P._parse(body, content_type, columns, event_time, mode="slow")
    err = caught.value
    assert str(err) == str(caught_slow.value)
    assert (err.line, err.column, err.value) == (
        caught_slow.value.line,
        caught_slow.value.column,
        caught_slow.value.value,
    )
    if content_type != CSV or err.line != 1:  # header errors never reach the fast path
        with pytest.raises(Exception):  # noqa: B017 - the fast path must not accept it
            P._parse(body, content_type, columns, event_time, mode="fast")
    return err


def check(err: RunFormatError, line: int | None, column: str | None, *fragments: str) -> None:
    assert err.line == line, str(err)
    assert err.column == column, str(err)
    for fragment in fragments:
        assert fragment in str(err), (fragment, str(err))


def null_row(**values: Any) -> dict[str, Any]:
    row = dict.fromkeys(NAMES)
    row.update(values)
    return row


# ------------------------------------------------------------------- content types


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("application/x-ndjson", "ndjson"),
        ("application/jsonl", "ndjson"),
        ("application/json", "ndjson"),
        ("Application/X-NDJSON; charset=UTF-8", "ndjson"),
        ('application/json;charset="utf8"', "ndjson"),
        ("text/csv", "csv"),
        ("text/csv; charset=utf-8; header=present", "csv"),
        (" TEXT/CSV ", "csv"),
    ],
)
def test_content_types_accepted(content_type: str, kind: str) -> None:
    assert run_format(content_type) == kind


@pytest.mark.parametrize(
    "content_type",
    [None, "", "text/plain", "application/xml", "multipart/form-data", "text/csv; charset=latin-1"],
)
def test_content_types_refused(content_type: str | None) -> None:
    with pytest.raises(UnsupportedContentType) as caught:
        parse_run(b'{"ts": "2024-01-01T00:00:00Z"}', content_type, SIMPLE, "ts")  # type: ignore[arg-type]
    assert isinstance(caught.value, StrataError)
    assert not isinstance(caught.value, RunFormatError)


def test_event_time_must_be_declared() -> None:
    with pytest.raises(ValueError):
        parse_run(b"", NDJSON, SIMPLE, "nope")


# ------------------------------------------------------------------------- schema


def test_arrow_schema_types() -> None:
    schema = arrow_schema(ALL)
    assert schema.names == NAMES
    assert [f.type for f in schema] == [
        pa.timestamp("us", tz="UTC"),
        pa.string(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.decimal128(12, 4),
        pa.decimal128(38, 10),
        pa.float32(),
        pa.float64(),
        pa.bool_(),
        pa.timestamp("us"),
        pa.date32(),
    ]
    assert all(f.nullable for f in schema)


# ------------------------------------------------------------------- NDJSON: good

FULL_JSON = (
    '{"ts": "2024-03-01T12:34:56.123456+02:00", "name": "caf\\u00e9 \\"x\\"", "small": -32768,'
    ' "i": 2147483647, "big": -9223372036854775808, "price": 12345678.12345,'
    ' "anynum": 0.30000000000000004, "r": 0.1, "d": 1e308, "flag": true,'
    ' "local": "2024-03-01 12:34:56.5", "day": "2024-02-29"}'
)
FULL_ROW = {
    "ts": utc(2024, 3, 1, 10, 34, 56, 123456),
    "name": 'café "x"',
    "small": -32768,
    "i": 2147483647,
    "big": -9223372036854775808,
    "price": Decimal("12345678.1235"),
    "anynum": Decimal("0.3000000000"),
    "r": 0.10000000149011612,
    "d": 1e308,
    "flag": True,
    "local": datetime(2024, 3, 1, 12, 34, 56, 500000),
    "day": date(2024, 2, 29),
}


def test_ndjson_full_row() -> None:
    assert rows(FULL_JSON.encode(), NDJSON) == [FULL_ROW]


def test_ndjson_missing_and_null_are_null() -> None:
    body = nd(
        '{"ts": "2024-01-01T00:00:00Z"}',
        '{"ts": "2024-01-01T00:00:01Z", "name": null, "price": null, "flag": null, "day": null}',
    )
    assert rows(body, NDJSON) == [
        null_row(ts=utc(2024, 1, 1)),
        null_row(ts=utc(2024, 1, 1, 0, 0, 1)),
    ]


def test_ndjson_framing_bom_crlf_blank_lines() -> None:
    body = (
        b'\xef\xbb\xbf{"ts": "2024-01-01T00:00:00Z", "name": "a"}\r\n'
        b"\r\n"
        b"   \t\n"
        b'{"ts": "2024-01-01T00:00:00Z", "name": "b"}\r\n'
        b"\n"
        b'  {"ts": "2024-01-01T00:00:00Z", "name": "c"}  '
    )
    assert [r["name"] for r in rows(body, NDJSON)] == ["a", "b", "c"]


@pytest.mark.parametrize("body", [b"", b"\n", b" \r\n\t\n", b"\xef\xbb\xbf"])
def test_ndjson_empty_body_gives_no_rows(body: bytes) -> None:
    table = parse_run(body, NDJSON, ALL, "ts")
    assert table.num_rows == 0
    assert table.schema == arrow_schema(ALL)


def test_ndjson_numbers() -> None:
    cols = (
        col("ts", "timestamptz"),
        col("big", "bigint"),
        col("price", "numeric", 12, 4),
        col("anynum", "numeric"),
        col("r", "real"),
        col("d", "double precision"),
    )
    ts = '"ts": "2024-01-01T00:00:00Z"'
    body = nd(
        f'{{{ts}, "big": -0, "price": 1.23445, "anynum": 1e-11, "r": 1, "d": -0.0}}',
        f'{{{ts}, "big": 7, "price": -1.23445, "anynum": -5e-11, "r": 3.4e38, "d": 5e-324}}',
        f'{{{ts}, "big": 8, "price": "12", "anynum": "1.5e3", "r": -2.5, "d": 123456789012}}',
        f'{{{ts}, "big": 9, "price": 0.00005, "anynum": 12345678901234567890.123, "r": 0}}',
        f'{{{ts}, "big": 10, "price": -0.00004, "anynum": "-.5", "r": 1e-50}}',
        f'{{{ts}, "big": 11, "price": 99999999.99994, "anynum": 99999999999999999999999999.9}}',
        # more fractional digits than the fast path keeps (scale widened by 26): rounded too
        f'{{{ts}, "big": 12, "price": 1.{"0" * 40}5, "anynum": 0.{"0" * 9}5{"0" * 40}1}}',
    )
    got = rows(body, NDJSON, cols, fast=False)
    assert [r["big"] for r in got] == [0, 7, 8, 9, 10, 11, 12]
    assert [r["price"] for r in got] == [
        Decimal("1.2345"),  # half away from zero
        Decimal("-1.2345"),
        Decimal("12"),
        Decimal("0.0001"),
        Decimal("0"),
        Decimal("99999999.9999"),
        Decimal("1.0000"),
    ]
    assert [r["anynum"] for r in got] == [
        Decimal("0E-10"),
        Decimal("-1E-10"),
        Decimal("1500"),
        Decimal("12345678901234567890.1230000000"),
        Decimal("-0.5"),
        Decimal("99999999999999999999999999.9"),
        Decimal("5E-10"),
    ]
    assert [r["r"] for r in got] == [1.0, 3.3999999521443642e38, -2.5, 0.0, 0.0, None, None]
    assert [r["d"] for r in got][:4] == [-0.0, 5e-324, 123456789012.0, None]
    assert math.copysign(1.0, got[0]["d"]) == -1.0


def test_ndjson_numbers_fast_path_covers_common_forms() -> None:
    cols = (col("ts", "timestamptz"), col("price", "numeric", 12, 4), col("r", "real"))
    body = nd(
        '{"ts": "2024-01-01T00:00:00Z", "price": 1.23445, "r": 0.1}',
        '{"ts": "2024-01-01T00:00:00Z", "price": "7.5", "r": 1e-3}',
    )
    assert rows(body, NDJSON, cols) == [
        {"ts": utc(2024, 1, 1), "price": Decimal("1.2345"), "r": 0.10000000149011612},
        {"ts": utc(2024, 1, 1), "price": Decimal("7.5"), "r": 0.0010000000474974513},
    ]


def test_real_is_rounded_once() -> None:
    # Via a double this decimal rounds to 1.0000002384185791; directly to float32 it is
    # 1.0000001192092896 (what PostgreSQL's float4in stores).
    cols = (col("ts", "timestamptz"), col("r", "real"))
    text = "1.00000017881393432617187499"
    body = f'{{"ts": "2024-01-01T00:00:00Z", "r": {text}}}'.encode()
    assert rows(body, NDJSON, cols) == [{"ts": utc(2024, 1, 1), "r": 1.0000001192092896}]
    body = f'{{"ts": "2024-01-01T00:00:00Z", "r": "{text}"}}'.encode()
    assert rows(body, NDJSON, cols, fast=False)[0]["r"] == 1.0000001192092896
    csv = f"ts,r\n2024-01-01T00:00:00Z,{text}\n".encode()
    assert rows(csv, CSV, cols)[0]["r"] == 1.0000001192092896


def test_ndjson_integer_strings_are_accepted() -> None:
    cols = (col("ts", "timestamptz"), col("small", "smallint"), col("big", "bigint"))
    body = nd('{"ts": "2024-01-01T00:00:00Z", "small": "-12", "big": "+9223372036854775807"}')
    assert rows(body, NDJSON, cols, fast=False) == [
        {"ts": utc(2024, 1, 1), "small": -12, "big": 9223372036854775807}
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01T00:00:00Z", utc(2024, 1, 1)),
        ("2024-01-01 00:00:00+02:00", utc(2023, 12, 31, 22)),
        ("2024-01-01T00:00:00+0530", utc(2023, 12, 31, 18, 30)),
        ("2024-01-01T00:00:00-05", utc(2024, 1, 1, 5)),
        ("2024-01-01T00:00:00-00", utc(2024, 1, 1)),
        ("2024-01-01T00:00:00+23:59", utc(2023, 12, 31, 0, 1)),
        ("2024-01-01T00:00:00", utc(2024, 1, 1)),  # no offset: UTC
        ("2024-01-01 10:20", utc(2024, 1, 1, 10, 20)),
        ("2024-01-01", utc(2024, 1, 1)),
        ("2024-01-01T00:00:00.5Z", utc(2024, 1, 1, 0, 0, 0, 500000)),
        ("2024-01-01T00:00:00.000001Z", utc(2024, 1, 1, 0, 0, 0, 1)),
        ("0001-01-01T00:00:00Z", utc(1, 1, 1)),
        ("9999-12-31T23:59:59.999999Z", utc(9999, 12, 31, 23, 59, 59, 999999)),
        ("0001-01-01T00:00:00-01:00", utc(1, 1, 1, 1)),
    ],
)
def test_timestamptz_forms(text: str, expected: datetime) -> None:
    cols = (col("ts", "timestamptz"),)
    assert rows(json.dumps({"ts": text}).encode(), NDJSON, cols) == [{"ts": expected}]
    assert rows(f"ts\n{text}\n".encode(), CSV, cols) == [{"ts": expected}]


def test_timestamptz_mixed_offsets_in_one_column() -> None:
    cols = (col("ts", "timestamptz"),)
    body = nd('{"ts": "2024-01-01T00:00:00"}', '{"ts": "2024-01-01T00:00:00+01:00"}')
    assert rows(body, NDJSON, cols) == [{"ts": utc(2024, 1, 1)}, {"ts": utc(2023, 12, 31, 23)}]


def test_timestamp_and_date_forms() -> None:
    cols = (col("ts", "timestamptz"), col("local", "timestamp"), col("day", "date"))
    body = nd(
        '{"ts": "2024-01-01", "local": "2024-01-01T01:02:03.000004", "day": "0001-01-01"}',
        '{"ts": "2024-01-01", "local": "2000-02-29", "day": "9999-12-31"}',
        '{"ts": "2024-01-01", "local": "2000-02-29 23:59", "day": null}',
    )
    got = rows(body, NDJSON, cols)
    assert [r["local"] for r in got] == [
        datetime(2024, 1, 1, 1, 2, 3, 4),
        datetime(2000, 2, 29),
        datetime(2000, 2, 29, 23, 59),
    ]
    assert [r["day"] for r in got] == [date(1, 1, 1), date(9999, 12, 31), None]


def test_ndjson_text_values() -> None:
    cols = (col("ts", "timestamptz"), col("name", "text"))
    values = ["", " padded ", "line\nbreak", "tab\t", "emoji \U0001f600", "\u2028", '"quoted"']
    body = "\n".join(
        json.dumps({"ts": "2024-01-01T00:00:00Z", "name": v}, ensure_ascii=i % 2 == 0)
        for i, v in enumerate(values)
    ).encode()
    assert [r["name"] for r in rows(body, NDJSON, cols)] == values


def test_ndjson_escaped_key_names_match() -> None:
    body = b'{"\\u0074s": "2024-01-01T00:00:00Z", "n\\u0061me": "x"}'
    assert rows(body, NDJSON, SIMPLE) == [{"ts": utc(2024, 1, 1), "name": "x", "n": None}]


# -------------------------------------------------------------------- NDJSON: bad


def test_ndjson_invalid_json_names_the_line() -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', "", '{"ts": "2024-01-01T00:00:00Z",}')
    check(refused(body, NDJSON, SIMPLE), 3, None, "line 3", "invalid JSON")


def test_ndjson_first_bad_line_wins() -> None:
    body = nd(
        '{"ts": "2024-01-01T00:00:00Z", "n": 1}',
        '{"ts": "2024-01-01T00:00:00Z", "n": 2}',
        '{"ts": "2024-01-01T00:00:00Z", "n": "x"}',
        '{"ts": "2024-01-01T00:00:00Z", "n": 4}',
        '{"ts": "nope", "n": 5}',
    )
    check(refused(body, NDJSON, SIMPLE), 3, "n", "not an integer", "(value: 'x')")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("[1, 2]", "got an array"),
        ('"text"', "got a string"),
        ("42", "got a number"),
        ("null", "got null"),
        ('{"ts": "2024-01-01T00:00:00Z"} {"ts": "2024-01-01T00:00:00Z"}', "invalid JSON"),
        ('{"ts": "2024-01-01T00:00:00Z"}\r{"ts": "2024-01-01T00:00:00Z"}', "invalid JSON"),
        ("{'ts': 1}", "invalid JSON"),
        ('{"ts": "2024-01-01T00:00:00Z"', "invalid JSON"),
    ],
)
def test_ndjson_line_must_be_one_object(line: str, fragment: str) -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', line)
    check(refused(body, NDJSON, SIMPLE), 2, None, fragment)


def test_ndjson_object_spanning_lines_is_refused() -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', '{"ts":', '"2024-01-01T00:00:00Z"}')
    check(refused(body, NDJSON, SIMPLE), 2, None, "invalid JSON")
    body = nd('{"ts": "2024-01-01T00:00:00Z", "n": 1}{"ts":', '"2024-01-01T00:00:00Z"}')
    check(refused(body, NDJSON, SIMPLE), 1, None, "invalid JSON")


def test_ndjson_unknown_field() -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', '{"ts": "2024-01-01T00:00:00Z", "extra": 5}')
    err = refused(body, NDJSON, SIMPLE)
    check(err, 2, "extra", "unknown field 'extra'", "ts, name, n")
    assert err.value == "5"


def test_ndjson_duplicate_key() -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z", "n": 1, "n": 2}')
    check(refused(body, NDJSON, SIMPLE), 1, "n", "more than once")


def test_ndjson_event_time_required() -> None:
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', '{"name": "x"}')
    check(refused(body, NDJSON, SIMPLE), 2, "ts", "event-time column 'ts' is missing")
    body = nd('{"ts": "2024-01-01T00:00:00Z"}', '{"ts": null}')
    check(refused(body, NDJSON, SIMPLE), 2, "ts", "must not be null")


BAD_JSON_VALUES = [
    # (column, JSON value, message fragment)
    ("small", "32768", "out of range for type smallint"),
    ("small", "-32769", "out of range for type smallint"),
    ("i", "2147483648", "out of range for type integer"),
    ("big", "9223372036854775808", "out of range for type bigint"),
    ("big", "-9223372036854775809", "out of range for type bigint"),
    ("big", "1" + "0" * 5000, "out of range for type bigint"),
    ("big", "1.0", "not an integer"),
    ("big", "1e3", "not an integer"),
    ("big", '"1.5"', "not an integer"),
    ("big", '" 5"', "not an integer"),
    ("big", '"0x10"', "not an integer"),
    ("big", "true", "expected an integer, got a boolean"),
    ("big", "[1]", "expected an integer, got an array"),
    ("big", '{"a": 1}', "expected an integer, got an object"),
    ("price", "123456789", "numeric field overflow: precision 12, scale 4"),
    ("price", "99999999.99995", "numeric field overflow: precision 12, scale 4"),
    ("price", "-1e8", "numeric field overflow"),
    ("price", "1e999999999", "numeric field overflow"),
    ("anynum", "1e28", "numeric field overflow: precision 38, scale 10"),
    ("price", '"abc"', "not a number"),
    ("price", '"NaN"', "NaN and Infinity are not allowed"),
    ("price", '"-Infinity"', "NaN and Infinity are not allowed"),
    ("price", "NaN", "NaN is not a JSON value"),
    ("price", "false", "expected a number, got a boolean"),
    ("r", "1e39", "out of range for type real"),
    ("r", "-3.5e38", "out of range for type real"),
    ("d", "1e400", "out of range for type double precision"),
    ("d", "Infinity", "Infinity is not a JSON value"),
    ("d", "-Infinity", "-Infinity is not a JSON value"),
    ("d", '"NaN"', "NaN and Infinity are not allowed in double precision"),
    ("r", '"inf"', "NaN and Infinity are not allowed in real"),
    ("d", '"1,5"', "not a number"),
    ("flag", '"true"', "expected true or false, got a string"),
    ("flag", "1", "expected true or false, got a number"),
    ("name", "5", "expected a string, got a number"),
    ("name", "true", "expected a string, got a boolean"),
    ("name", '"a\\u0000b"', "NUL"),
    ("name", '"\\ud800"', "lone surrogate"),
    ("local", '"2024-01-01T00:00:00Z"', "time zone offset is not allowed"),
    ("local", '"2024-01-01T00:00:00+01:00"', "time zone offset is not allowed"),
    ("local", "20240101", "expected an ISO 8601 string, got a number"),
    ("day", '"2024-1-1"', "not a date"),
    ("day", '"2024-02-30"', "date field value out of range"),
    ("day", '"2023-02-29"', "date field value out of range"),
    ("day", '"0000-01-01"', "years 1..9999"),
    ("day", '"2024-01-01T00:00:00"', "not a date"),
    ("day", "19000", "expected an ISO 8601 string, got a number"),
]


@pytest.mark.parametrize(("column", "value", "fragment"), BAD_JSON_VALUES)
def test_ndjson_bad_values(column: str, value: str, fragment: str) -> None:
    good = '{"ts": "2024-01-01T00:00:00Z"}'
    bad = f'{{"ts": "2024-01-01T00:00:00Z", "{column}": {value}}}'
    err = refused(nd(good, good, bad, good), NDJSON)
    check(err, 3, column, "line 3", f"column {column!r}", fragment)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2024-13-01T00:00:00Z", "out of range"),
        ("2024-01-32T00:00:00Z", "out of range"),
        ("2024-01-01T24:00:00Z", "out of range"),
        ("2024-01-01T23:60:00Z", "out of range"),
        ("2024-01-01T23:59:60Z", "out of range"),
        ("2024-01-01T00:00:00+24:00", "offset out of range"),
        ("2024-01-01T00:00:00+01:60", "offset out of range"),
        ("2024-01-01T00:00:00.1234567Z", "not a timestamp"),
        ("2024-01-01t00:00:00z", "not a timestamp"),
        ("2024-01-01T00Z", "not a timestamp"),
        ("2024-01-01Z", "not a timestamp"),
        ("10000-01-01T00:00:00Z", "not a timestamp"),
        ("2024-01-01T00:00:00 Z", "not a timestamp"),
        (" 2024-01-01T00:00:00Z", "not a timestamp"),
        ("0000-12-31T00:00:00Z", "years 1..9999"),
        ("0001-01-01T00:00:00+00:01", "years 1..9999"),
        ("9999-12-31T23:59:59-00:01", "years 1..9999"),
        ("yesterday", "expected ISO 8601"),
    ],
)
def test_timestamptz_bad(value: str, fragment: str) -> None:
    good = json.dumps({"ts": "2024-01-01T00:00:00Z"})
    body = nd(good, json.dumps({"ts": value}))
    check(refused(body, NDJSON, SIMPLE), 2, "ts", fragment)
    csv = f"ts\n2024-01-01T00:00:00Z\n{value}\n".encode()
    check(refused(csv, CSV, SIMPLE), 3, "ts", fragment)


def test_ndjson_invalid_utf8_names_the_line() -> None:
    body = b'{"ts": "2024-01-01T00:00:00Z"}\n{"ts": "2024-01-01T00:00:00Z", "name": "\xff"}\n'
    check(refused(body, NDJSON, SIMPLE), 2, None, "not valid UTF-8", "0xff")
    body = b'{"ts": "2024-01-01T00:00:00Z", "name": "\xc3"}'  # truncated sequence
    check(refused(body, NDJSON, SIMPLE), 1, None, "not valid UTF-8")


def test_ndjson_raw_control_character_in_string() -> None:
    body = b'{"ts": "2024-01-01T00:00:00Z", "name": "a\tb"}'
    check(refused(body, NDJSON, SIMPLE), 1, None, "invalid JSON")


# ---------------------------------------------------------------------- CSV: good

FULL_CSV_HEADER = ",".join(NAMES)
FULL_CSV_LINE = (
    '2024-03-01T12:34:56.123456+02:00,"café ""x""",-32768,2147483647,-9223372036854775808,'
    "12345678.12345,0.30000000000000004,0.1,1e308,t,2024-03-01 12:34:56.5,2024-02-29"
)


def test_csv_full_row() -> None:
    body = f"{FULL_CSV_HEADER}\n{FULL_CSV_LINE}\n".encode()
    assert rows(body, CSV) == [FULL_ROW]


def test_csv_header_order_and_subset() -> None:
    body = b"n,ts\n5,2024-01-01T00:00:00Z\n,2024-01-02T00:00:00Z\n"
    assert rows(body, CSV, SIMPLE) == [
        {"ts": utc(2024, 1, 1), "name": None, "n": 5},
        {"ts": utc(2024, 1, 2), "name": None, "n": None},
    ]


def test_csv_empty_quoted_text_is_empty_string() -> None:
    body = b'ts,name\n2024-01-01T00:00:00Z,""\n2024-01-01T00:00:00Z,\n"2024-01-01T00:00:00Z", \n'
    assert [r["name"] for r in rows(body, CSV, SIMPLE)] == ["", None, " "]


def test_csv_quoting() -> None:
    body = (
        b"ts,name,n\n"
        b'2024-01-01T00:00:00Z,"a,b",1\n'
        b'2024-01-01T00:00:00Z,"multi\nline\r\ntext",2\n'
        b'2024-01-01T00:00:00Z,"say ""hi""","3"\n'
        b'"2024-01-01T00:00:00Z",plain text ,4\n'
    )
    got = rows(body, CSV, SIMPLE)
    assert [r["name"] for r in got] == ["a,b", "multi\nline\r\ntext", 'say "hi"', "plain text "]
    assert [r["n"] for r in got] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "body",
    [
        b"ts,n\r\n2024-01-01T00:00:00Z,1\r\n2024-01-01T00:00:00Z,2\r\n",
        b"ts,n\r2024-01-01T00:00:00Z,1\r2024-01-01T00:00:00Z,2",
        b"\xef\xbb\xbfts,n\n2024-01-01T00:00:00Z,1\n\n\r\n2024-01-01T00:00:00Z,2\n\n",
        b"\n\nts,n\n2024-01-01T00:00:00Z,1\n2024-01-01T00:00:00Z,2",
        b'"ts","n"\n"2024-01-01T00:00:00Z","1"\n"2024-01-01T00:00:00Z","2"\n',
    ],
)
def test_csv_framing(body: bytes) -> None:
    assert [r["n"] for r in rows(body, CSV, SIMPLE)] == [1, 2]


@pytest.mark.parametrize(
    "body", [b"", b"\n\r\n", b"ts,n", b"ts,n\n", b"ts,n\r\n\r\n", b"\xef\xbb\xbf"]
)
def test_csv_empty_or_header_only_gives_no_rows(body: bytes) -> None:
    table = parse_run(body, CSV, SIMPLE, "ts")
    assert table.num_rows == 0
    assert table.schema == arrow_schema(SIMPLE)


def test_csv_booleans() -> None:
    cols = (col("ts", "timestamptz"), col("flag", "boolean"))
    spellings = ["t", "T", "true", "TRUE", "True", "y", "Yes", "on", "ON", "1"]
    spellings += ["f", "F", "false", "FaLsE", "n", "NO", "off", "Off", "0", ""]
    body = ("ts,flag\n" + "".join(f"2024-01-01T00:00:00Z,{s}\n" for s in spellings)).encode()
    assert [r["flag"] for r in rows(body, CSV, cols)] == [True] * 10 + [False] * 9 + [None]


def test_csv_numbers() -> None:
    cols = (
        col("ts", "timestamptz"),
        col("big", "bigint"),
        col("price", "numeric", 12, 4),
        col("d", "double precision"),
    )
    body = (
        b"ts,big,price,d\n"
        b"2024-01-01T00:00:00Z,007,1.23445,.5\n"
        b"2024-01-01T00:00:00Z,-0,-1.23445,5.\n"
        b"2024-01-01T00:00:00Z,42,100,+1.5e3\n"
        b'2024-01-01T00:00:00Z,"9223372036854775807","-0.00005",-0\n'
    )
    got = rows(body, CSV, cols)
    assert [r["big"] for r in got] == [7, 0, 42, 9223372036854775807]
    assert [r["price"] for r in got] == [
        Decimal("1.2345"),
        Decimal("-1.2345"),
        Decimal("100"),
        Decimal("-0.0001"),
    ]
    assert [r["d"] for r in got] == [0.5, 5.0, 1500.0, -0.0]
    # Forms the fast path leaves to the slow path: a '+' on an integer, an exponent or
    # leading zeros beyond the declared integer digits on a numeric.
    body = b"ts,big,price\n2024-01-01T00:00:00Z,+5,1E2\n2024-01-01T00:00:00Z,-6,00000000012.5\n"
    got = rows(body, CSV, cols, fast=False)
    assert [(r["big"], r["price"]) for r in got] == [(5, Decimal(100)), (-6, Decimal("12.5"))]


# ----------------------------------------------------------------------- CSV: bad


def test_csv_header_duplicate() -> None:
    check(refused(b"ts,n,n\n2024-01-01T00:00:00Z,1,2\n", CSV, SIMPLE), 1, "n", "more than once")


def test_csv_header_unknown() -> None:
    err = refused(b"ts,n,extra,more\n2024-01-01T00:00:00Z,1,2,3\n", CSV, SIMPLE)
    check(err, 1, "extra", "unknown columns 'extra', 'more'", "CSV header")


def test_csv_header_is_case_and_space_sensitive() -> None:
    check(refused(b"ts, n\n", CSV, SIMPLE), 1, " n", "unknown column ' n'")
    check(refused(b"TS,n\n", CSV, SIMPLE), 1, "TS", "unknown column 'TS'")


def test_csv_header_lacks_event_time() -> None:
    check(refused(b"name,n\nx,1\n", CSV, SIMPLE), 1, "ts", "lacks the event-time column 'ts'")


def test_csv_wrong_field_count() -> None:
    body = b"ts,n\n2024-01-01T00:00:00Z,1\n2024-01-01T00:00:00Z\n"
    check(refused(body, CSV, SIMPLE), 3, None, "expected 2 fields", "got 1")
    body = b"ts,n\n2024-01-01T00:00:00Z,1\n\n2024-01-01T00:00:00Z,1,\n"
    check(refused(body, CSV, SIMPLE), 4, None, "expected 2 fields", "got 3")
    body = b"ts,n\n2024-01-01T00:00:00Z,1\n \n"  # a line of spaces is a record
    check(refused(body, CSV, SIMPLE), 3, None, "expected 2 fields")


def test_csv_line_numbers_follow_multiline_records() -> None:
    body = (
        b"ts,name,n\n"
        b'2024-01-01T00:00:00Z,"one\ntwo\r\nthree",1\n'  # lines 2-4
        b"2024-01-01T00:00:00Z,x,1\n"  # line 5
        b'2024-01-01T00:00:00Z,"a\nb",oops\n'  # lines 6-7: the record starts on line 6
    )
    check(refused(body, CSV, SIMPLE), 6, "n", "line 6", "not an integer", "'oops'")


@pytest.mark.parametrize(
    ("record", "column", "fragment"),
    [
        ('2024-01-01T00:00:00Z,a"b,1', "name", "quote character inside an unquoted field"),
        ('2024-01-01T00:00:00Z,"ab"c,1', "name", "after a closing quote"),
        ('2024-01-01T00:00:00Z,a""b,1', "name", "quote character inside an unquoted field"),
        ('2024-01-01T00:00:00Z, "ab",1', "name", "quote character inside an unquoted field"),
        ('2024-01-01T00:00:00Z,"ab" ,1', "name", "after a closing quote"),
        ('2024-01-01T00:00:00Z,"never closed,1\n2024-01-01T00:00:00Z,x,1', "name", "unterminated"),
    ],
)
def test_csv_bad_quoting(record: str, column: str, fragment: str) -> None:
    body = f"ts,name,n\n2024-01-01T00:00:00Z,x,1\n{record}\n2024-01-01T00:00:00Z,y,2\n"
    check(refused(body.encode(), CSV, SIMPLE), 3, column, fragment)


BAD_CSV_VALUES = [
    ("small", "32768", "out of range for type smallint"),
    ("big", "0x10", "not an integer"),
    ("big", " 5", "not an integer"),
    ("big", "5 ", "not an integer"),
    ("big", "1.0", "not an integer"),
    ("big", "1_000", "not an integer"),
    ("big", '""', 'empty quoted field ("") is not a valid bigint'),
    ("price", '""', 'empty quoted field ("") is not a valid numeric(12,4)'),
    ("price", "123456789", "numeric field overflow: precision 12, scale 4"),
    ("price", "NaN", "NaN and Infinity are not allowed in numeric"),
    ("price", "1,5", "expected 12 fields"),
    ("price", "abc", "not a number"),
    ("d", "nan", "NaN and Infinity are not allowed in double precision"),
    ("d", "-Infinity", "NaN and Infinity are not allowed"),
    ("d", "inf", "NaN and Infinity are not allowed"),
    ("d", "1e400", "out of range for type double precision"),
    ("r", "1e39", "out of range for type real"),
    ("d", "0x10", "not a number"),
    ("flag", "maybe", "not a boolean"),
    ("flag", " t", "not a boolean"),
    ("flag", '""', "empty quoted field"),
    ("local", "2024-01-01T00:00:00Z", "time zone offset is not allowed"),
    ("day", "2024-02-30", "date field value out of range"),
    ("day", "01/02/2024", "not a date"),
    ("name", "a\x00b", "NUL"),
]


@pytest.mark.parametrize(("column", "value", "fragment"), BAD_CSV_VALUES)
def test_csv_bad_values(column: str, value: str, fragment: str) -> None:
    def record(**values: str) -> str:
        fields = {"ts": "2024-01-01T00:00:00Z", **values}
        return ",".join(fields.get(name, "") for name in NAMES)

    body = "\n".join([FULL_CSV_HEADER, record(), record(), record(**{column: value}), record()])
    err = refused(body.encode(), CSV)
    expected_column = None if fragment.startswith("expected") else column
    check(err, 4, expected_column, "line 4", fragment)


def test_csv_event_time_required() -> None:
    body = b"ts,n\n2024-01-01T00:00:00Z,1\n,2\n"
    check(refused(body, CSV, SIMPLE), 3, "ts", "must not be null")
    body = b'ts,n\n2024-01-01T00:00:00Z,1\n"",2\n'
    check(refused(body, CSV, SIMPLE), 3, "ts", "empty quoted field")


def test_csv_invalid_utf8_names_the_line() -> None:
    body = b"ts,name\n2024-01-01T00:00:00Z,ok\r\n2024-01-01T00:00:00Z,\xe9t\xe9\n"
    check(refused(body, CSV, SIMPLE), 3, None, "not valid UTF-8", "0xe9")


# --------------------------------------------------------- fast path: performance


def test_fast_path_handles_a_typical_body(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_slow_path(*args: Any) -> None:
        raise AssertionError("the slow path ran")

    monkeypatch.setattr(P, "_slow_ndjson", no_slow_path)
    monkeypatch.setattr(P, "_slow_csv", no_slow_path)
    cols = (
        col("name", "text"),
        col("n", "bigint"),
        col("price", "numeric", 12, 4),
        col("ts", "timestamptz"),
    )
    lines = [
        f'{{"name": "user{i}", "n": {i * 1000}, "price": {i}.{i % 10000:04d}5, '
        f'"ts": "2024-01-01T00:{i % 60:02d}:00.{i:06d}Z"}}'
        for i in range(1000)
    ]
    table = parse_run("\n".join(lines).encode(), NDJSON, cols, "ts")
    assert table.num_rows == 1000
    csv = "name,n,price,ts\n" + "".join(
        f"user{i},{i * 1000},{i}.{i % 10000:04d}5,2024-01-01T00:{i % 60:02d}:00.{i:06d}Z\n"
        for i in range(1000)
    )
    assert parse_run(csv.encode(), CSV, cols, "ts").equals(table)


# ------------------------------------------------------ hypothesis: paths agree

GEN_COLUMNS = (
    col("ts", "timestamptz"),
    col("name", "text"),
    col("small", "smallint"),
    col("big", "bigint"),
    col("price", "numeric", 12, 4),
    col("anynum", "numeric"),
    col("r", "real"),
    col("d", "double precision"),
    col("flag", "boolean"),
    col("local", "timestamp"),
    col("day", "date"),
)
GEN_NAMES = [c.name for c in GEN_COLUMNS]

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
_datetimes = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31))
_offsets = st.one_of(st.none(), st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59))


@st.composite
def _decimal_value(draw: Any, int_digits: int, max_frac: int) -> Decimal:
    int_part = draw(st.integers(min_value=0, max_value=10**int_digits - 1))
    frac_digits = draw(st.integers(min_value=0, max_value=max_frac))
    frac = draw(st.integers(min_value=0, max_value=10**frac_digits - 1))
    sign = draw(st.sampled_from(["", "-"]))
    return Decimal(
        f"{sign}{int_part}.{frac:0{frac_digits}d}" if frac_digits else f"{sign}{int_part}"
    )


def _round(value: Decimal, scale: int) -> Decimal:
    """Round half away from zero, exactly (PostgreSQL's numeric rounding)."""
    return value.quantize(Decimal(1).scaleb(-scale), ROUND_HALF_UP, Context(prec=100))


def _render_decimal(value: Decimal, style: int) -> str:
    if style == 0:
        return format(value, "f")
    sign, digits, exponent = value.as_tuple()
    return f"{'-' if sign else ''}{''.join(map(str, digits)) or '0'}e{exponent}"


def _render_ts(moment: datetime, offset: int | None, sep: str, offset_style: int) -> str:
    text = f"{moment.date().isoformat()}{sep}{moment.hour:02d}:{moment.minute:02d}"
    if moment.second or moment.microsecond or offset_style:
        text += f":{moment.second:02d}"
        if moment.microsecond:
            text += f".{moment.microsecond:06d}".rstrip("0")
    if offset is None:
        return text
    if offset == 0 and offset_style == 0:
        return text + "Z"
    sign = "+" if offset >= 0 else "-"
    hours, minutes = divmod(abs(offset), 60)
    if offset_style == 2 and minutes == 0:
        return f"{text}{sign}{hours:02d}"
    return f"{text}{sign}{hours:02d}{':' if offset_style != 3 else ''}{minutes:02d}"


@st.composite
def generated_row(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(expected values, how each one is written: text for CSV and JSON for NDJSON)."""
    nullable = st.booleans()
    expected: dict[str, Any] = {}
    written: dict[str, tuple[str, Any]] = {}  # name -> (csv text, json value as text)
    moment, offset = draw(_datetimes), draw(_offsets)
    sep, style = draw(st.sampled_from("T ")), draw(st.integers(0, 3))
    text = _render_ts(moment, offset, sep, style)
    expected["ts"] = (moment - timedelta(minutes=offset or 0)).replace(tzinfo=UTC)
    written["ts"] = (text, json.dumps(text))

    def maybe(name: str, value: Any, csv_text: str, json_text: str) -> None:
        if draw(nullable):
            expected[name] = None
            written[name] = ("", "null")
        else:
            expected[name] = value
            written[name] = (csv_text, json_text)

    name = draw(_text)
    maybe("name", name, name, json.dumps(name, ensure_ascii=draw(st.booleans())))
    small = draw(st.integers(-(2**15), 2**15 - 1))
    maybe("small", small, str(small), str(small))
    big = draw(st.integers(-(2**63), 2**63 - 1))
    maybe("big", big, str(big), str(big))
    price = draw(_decimal_value(8, 8))
    expected_price = _round(price, 4)
    if abs(expected_price) >= Decimal(10**8):
        price = expected_price = Decimal(0)
    # CSV numerics with an exponent take the slow path, so CSV gets the plain form here
    text = _render_decimal(price, draw(st.integers(0, 1)))
    as_string = draw(st.booleans())
    maybe("price", expected_price, format(price, "f"), json.dumps(text) if as_string else text)
    anynum = draw(_decimal_value(28, 14))
    expected_any = _round(anynum, 10)
    if abs(expected_any) >= Decimal(10**28):
        anynum = expected_any = Decimal(0)
    text = _render_decimal(anynum, draw(st.integers(0, 1)))
    maybe("anynum", expected_any, format(anynum, "f"), text)
    real = draw(st.floats(width=32, allow_nan=False, allow_infinity=False))
    maybe("r", real, repr(real), repr(real))
    double = draw(st.floats(allow_nan=False, allow_infinity=False))
    maybe("d", double, repr(double), repr(double))
    flag = draw(st.booleans())
    spelling = draw(st.sampled_from(["t", "TRUE", "yes", "On", "1"] if flag else ["F", "no", "0"]))
    maybe("flag", flag, spelling, "true" if flag else "false")
    local = draw(_datetimes)
    text = _render_ts(local, None, draw(st.sampled_from("T ")), draw(st.integers(0, 3)))
    maybe("local", local, text, json.dumps(text))
    day = draw(st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)))
    maybe("day", day, day.isoformat(), json.dumps(day.isoformat()))
    return expected, written


def render_csv(
    generated: list[tuple[dict[str, Any], dict[str, Any]]],
    header: list[str],
    quote_all: bool,
    newline: str,
    overrides: dict[tuple[int, str], str] | None = None,
) -> tuple[bytes, list[int]]:
    """The CSV body and the line each record starts on."""
    overrides = overrides or {}
    out = [",".join(header) + newline]
    starts = []
    line = 2
    for index, (expected, written) in enumerate(generated):
        fields = []
        for name in header:
            if (index, name) in overrides:
                fields.append(overrides[index, name])
                continue
            text = written[name][0]
            if expected[name] is None:
                fields.append("")  # NULL: an empty unquoted field
            elif quote_all or text == "" or any(c in text for c in ',"\r\n'):
                fields.append('"' + text.replace('"', '""') + '"')
            else:
                fields.append(text)
        record = ",".join(fields) + newline
        starts.append(line)
        line += len(re.findall(r"\r\n|\n|\r", record))
        out.append(record)
    return "".join(out).encode(), starts


def render_ndjson(
    generated: list[tuple[dict[str, Any], dict[str, Any]]],
    omit_nulls: bool,
    newline: str,
    overrides: dict[tuple[int, str], str] | None = None,
) -> tuple[bytes, list[int]]:
    overrides = overrides or {}
    out, starts = [], []
    for index, (_expected, written) in enumerate(generated):
        members = []
        for name in GEN_NAMES:
            value = overrides.get((index, name), written[name][1])
            if value == "null" and omit_nulls:
                continue
            members.append(f"{json.dumps(name)}: {value}")
        out.append("{" + ", ".join(members) + "}")
        starts.append(index + 1)
    return newline.join(out).encode(), starts


_settings = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_settings
@given(
    generated=st.lists(generated_row(), min_size=1, max_size=8),
    omit_nulls=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_ndjson_paths_agree_with_generated_values(
    generated: list[tuple[dict[str, Any], dict[str, Any]]], omit_nulls: bool, newline: str
) -> None:
    body, _ = render_ndjson(generated, omit_nulls, newline)
    expected = [e for e, _ in generated]
    assert parse_all_ways(body, NDJSON, GEN_COLUMNS).to_pylist() == expected


@_settings
@given(
    generated=st.lists(generated_row(), min_size=1, max_size=8),
    header=st.permutations(GEN_NAMES),
    keep=st.integers(min_value=1, max_value=len(GEN_NAMES)),
    quote_all=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_csv_paths_agree_with_generated_values(
    generated: list[tuple[dict[str, Any], dict[str, Any]]],
    header: list[str],
    keep: int,
    quote_all: bool,
    newline: str,
) -> None:
    header = [name for name in header[:keep]] + ([] if "ts" in header[:keep] else ["ts"])
    body, _ = render_csv(generated, header, quote_all, newline)
    expected = [
        {name: e[name] if name in header else None for name in GEN_NAMES} for e, _ in generated
    ]
    assert parse_all_ways(body, CSV, GEN_COLUMNS).to_pylist() == expected


# A refused value per column, as (CSV text, JSON value text, message fragment).
CORRUPTIONS = {
    "ts": ("2024-02-30T00:00:00Z", '"2024-02-30T00:00:00Z"', "out of range"),
    "name": ("a\x00b", "12", ""),
    "small": ("1.5", "1.5", "not an integer"),
    "big": ("9223372036854775808", "9223372036854775808", "out of range for type bigint"),
    "price": ("abc", '"abc"', "not a number"),
    "anynum": ("1e40", "1e40", "numeric field overflow"),
    "r": ("NaN", '"NaN"', "NaN and Infinity"),
    "d": ("1e999", "1e999", "out of range for type double precision"),
    "flag": ("maybe", '"yes"', ""),
    "local": ("2024-01-01T00:00:00+01:00", '"2024-01-01T00:00:00+01:00"', "offset"),
    "day": ("2024-13-01", '"2024-13-01"', "out of range"),
}


@_settings
@given(
    generated=st.lists(generated_row(), min_size=1, max_size=8),
    data=st.data(),
    quote_all=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_one_corrupted_field_is_found_on_its_line(
    generated: list[tuple[dict[str, Any], dict[str, Any]]],
    data: Any,
    quote_all: bool,
    newline: str,
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(generated) - 1))
    name = data.draw(st.sampled_from(GEN_NAMES))
    csv_text, json_text, fragment = CORRUPTIONS[name]

    body, starts = render_ndjson(generated, False, newline, {(index, name): json_text})
    err = refused(body, NDJSON, GEN_COLUMNS)
    check(err, starts[index], name, fragment)

    field = '"' + csv_text + '"' if quote_all else csv_text
    body, starts = render_csv(generated, GEN_NAMES, quote_all, newline, {(index, name): field})
    err = refused(body, CSV, GEN_COLUMNS)
    check(err, starts[index], name, fragment)
