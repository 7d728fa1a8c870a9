"""Parse the body of a run (NDJSON or CSV) into an Arrow table of a stream's declared columns.

``parse_run`` returns exactly the declared columns, in declared order, typed by
``arrow_schema``. The values are the ones PostgreSQL would store for the same input in
columns of the declared types (a PostgreSQL GROUP BY over the archived raw rows is the
oracle), or the run is refused with a ``RunFormatError`` naming the physical line of the
body (counted from 1; for CSV the header is line 1 and a record that spans lines is named
by the line where it starts), the column and the offending value.

Two paths compute the same result:

* the fast path lets pyarrow parse the whole body (``pyarrow.json.read_json`` with an
  explicit schema and unexpected fields as errors; ``pyarrow.csv.read_csv`` reading every
  field as a string), then converts and checks whole columns with Arrow kernels (RE2
  grammars, casts, range checks);
* when pyarrow refuses the body or a check fails, the slow path walks the body line by
  line in Python. It is the reference implementation of the rules below: it raises the
  first problem in body order, or, when the body is valid after all (a form pyarrow does
  not take, e.g. ``"12"`` for a bigint, a ``+`` sign, an exponent in a CSV numeric, more
  fractional digits than the fast path keeps), returns the table itself. So pyarrow's
  own message never reaches a user: the slow path either names the problem or finds
  none.

Policy
------
Body and framing
  * The body is UTF-8; invalid UTF-8 is refused naming the line. A UTF-8 BOM at the start
    is skipped. Lines end in LF or CRLF (CSV also takes a lone CR, as RFC 4180 readers do).
  * An empty body, a body of blank lines or a CSV body with only a header gives 0 rows.
  * Content types: ``application/x-ndjson``, ``application/jsonl`` and ``application/json``
    (all read as NDJSON) and ``text/csv``, with parameters (a ``charset`` must be UTF-8).
    Anything else raises ``UnsupportedContentType`` (HTTP 415).

Columns
  * Every declared column may be absent from an object or from the CSV header: it is NULL
    there. The event-time column is the exception: it must be present and non-NULL on
    every row.
  * Unknown fields (NDJSON) and unknown header columns (CSV) are refused by name: nothing
    is silently dropped. Duplicate keys in an object and duplicate CSV header names are
    refused. Names match exactly (case-sensitive).

NDJSON
  * One JSON object per line; blank lines (spaces, tabs, CR only) are skipped but counted.
    A line holding anything but exactly one object (an array, a scalar, two objects, half
    an object) is refused. JSON ``null`` is NULL.
  * Numbers are read exactly from their text (never through a binary float).

CSV (RFC 4180)
  * A header line is required. Fields are separated by commas; a field is either quoted
    (``"..."``, a quote inside doubled as ``""``, may span lines) or unquoted (no quote
    characters at all). Anything else (``a"b``, ``"a"b``, an unterminated quote) is
    refused. Every record must have as many fields as the header. Empty lines are skipped.
  * Errors inside a record that spans lines name the line where it starts (invalid
    UTF-8 names the line of the bad byte).
  * An empty unquoted field is NULL. An empty quoted field ``""`` is the empty string in a
    text column and an error in any other column (as PostgreSQL's COPY ... CSV does).
  * Quoted and unquoted fields are otherwise read alike (``"5"`` is 5).

Values (no whitespace is trimmed from any value)
  * text: a JSON string (a number or boolean is refused, not guessed); any CSV field.
    Text containing NUL (U+0000) is refused (PostgreSQL text cannot hold it), and so are
    lone surrogate escapes.
  * smallint/integer/bigint: a JSON integer, or a string / CSV field of the form
    ``[+-]digits``; ``1.0``, ``1e3`` and the like are refused (as PostgreSQL does). Values
    outside the type's range are refused.
  * numeric(p,s): a JSON number, or a string / CSV field of the form
    ``[+-]digits[.digits][e[+-]digits]``. More than s fractional digits are rounded half
    away from zero to s digits (as PostgreSQL does on insert); a value needing more than
    p-s integer digits (also after rounding) is refused as ``numeric field overflow``.
    ``numeric`` without (p,s) is held as numeric(38,10), like Spark. NaN and Infinity are
    refused (Spark decimals cannot hold them).
  * real/double precision: a JSON number or a number string / CSV field (same grammar as
    numeric), rounded once to the nearest float32/float64. NaN, Infinity (JSON literals
    or strings such as "NaN", "Infinity", "-Infinity", "inf") and values out of the
    type's range are refused. Values too small for the type become a subnormal or 0
    (where PostgreSQL would refuse an underflow to 0: a deliberate, documented leniency).
  * boolean: JSON true/false; in CSV one of t/f, true/false, y/n, yes/no, on/off, 1/0 in
    any letter case (PostgreSQL's spellings). JSON strings are not booleans.
  * timestamptz: an ISO 8601 string ``YYYY-MM-DD[(T| )HH:MM[:SS[.ffffff]][offset]]`` with
    offset ``Z``, ``+HH``, ``+HHMM`` or ``+HH:MM`` (hours 0..23, minutes 0..59). Without an
    offset the value is UTC. At most 6 fractional digits. Stored as UTC microseconds;
    the UTC instant must fall in years 1..9999.
  * timestamp (without time zone): the same without an offset (an offset is refused, as
    PostgreSQL would silently drop it). Years 1..9999.
  * date: ``YYYY-MM-DD``, years 1..9999.
  * ``T`` and ``Z`` are upper case; no other ISO 8601 forms (week dates, ``24:00``, leap
    seconds, more than 6 fraction digits). In JSON, temporal values must be strings.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from rewriter.types import ColumnSpec, SqlType
from server.errors import RunFormatError, UnsupportedContentType

__all__ = [
    "CSV_MEDIA_TYPES",
    "NDJSON_MEDIA_TYPES",
    "UnsupportedContentType",
    "arrow_schema",
    "arrow_type",
    "columns_from_fields",
    "parse_run",
    "rows_from_fields",
    "run_format",
]

NDJSON_MEDIA_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/json"})
CSV_MEDIA_TYPES = frozenset({"text/csv"})


# --------------------------------------------------------------------------- types

_ARROW_TYPES: dict[str, pa.DataType] = {
    "text": pa.string(),
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "boolean": pa.bool_(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
    "date": pa.date32(),
}

_INT_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}

# Smallest magnitude that rounds to infinity in float32 (max float32 plus half an ulp).
_FLOAT32_OVERFLOW = 3.4028235677973366e38

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MIN_DAYS = date(1, 1, 1).toordinal() - _EPOCH_ORDINAL
_MAX_DAYS = date(9999, 12, 31).toordinal() - _EPOCH_ORDINAL
_MIN_MICROS = _MIN_DAYS * 86_400_000_000
_MAX_MICROS = (_MAX_DAYS + 1) * 86_400_000_000 - 1

# Decimal digits that always fit in 256 bits (10**76 < 2**255).
_DECIMAL256_DIGITS = 76


def arrow_type(sql_type: SqlType) -> pa.DataType:
    """The Arrow type that holds a declared column type."""
    if sql_type.name == "numeric":
        return pa.decimal128(sql_type.effective_precision, sql_type.effective_scale)
    try:
        return _ARROW_TYPES[sql_type.name]
    except KeyError:
        raise ValueError(f"unsupported column type {sql_type.name!r}") from None


def arrow_schema(columns: Sequence[ColumnSpec]) -> pa.Schema:
    """The schema of a parsed run: the declared columns, in order, all nullable."""
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns])


def run_format(content_type: str | None) -> str:
    """``"ndjson"`` or ``"csv"`` for a Content-Type header, else UnsupportedContentType."""
    accepted = ", ".join(sorted(NDJSON_MEDIA_TYPES | CSV_MEDIA_TYPES))
    if not content_type or not content_type.strip():
        raise UnsupportedContentType(f"a run needs a Content-Type; supported: {accepted}")
    media, *params = content_type.split(";")
    media = media.strip().lower()
    if media in NDJSON_MEDIA_TYPES:
        kind = "ndjson"
    elif media in CSV_MEDIA_TYPES:
        kind = "csv"
    else:
        raise UnsupportedContentType(
            f"content type {media!r} is not supported for runs; supported: {accepted}"
        )
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
            if charset not in ("utf-8", "utf8"):
                raise UnsupportedContentType(
                    f"charset {charset!r} is not supported for runs; send UTF-8"
                )
    return kind


# ------------------------------------------------------------------------ grammars
# The same patterns serve Python's re (fullmatch, ASCII) and Arrow's RE2 (anchored).

_INT = r"[+-]?[0-9]+"
_NUM = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_DATE = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME = r"[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?"
_OFFSET = r"(Z|[+-][0-9]{2}(?::?[0-9]{2})?)"
_TS_NAIVE = f"{_DATE}(?:{_TIME})?"
_TS_ANY = f"{_DATE}(?:{_TIME}{_OFFSET}?)?"
_TS_WITH_OFFSET = f"{_DATE}{_TIME}{_OFFSET}"

_INT_RE = re.compile(_INT, re.ASCII)
_NUM_RE = re.compile(_NUM, re.ASCII)
_DATE_RE = re.compile(_DATE, re.ASCII)
_TS_RE = re.compile(_TS_ANY, re.ASCII)
_NAN_INF_RE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.ASCII | re.IGNORECASE)


def _re2(pattern: str) -> str:
    return f"^(?:{pattern})$"


_BOOL_TRUE = ("t", "true", "y", "yes", "on", "1")
_BOOL_FALSE = ("f", "false", "n", "no", "off", "0")
_BOOL_TRUE_SET = pa.array(_BOOL_TRUE, pa.string())
_BOOL_FALSE_SET = pa.array(_BOOL_FALSE, pa.string())

# NDJSON framing for the fast path: every line blank or one {...}; the strict variant
# also forbids blank lines so that the line count is a plain count of newlines.
_NDJSON_STRICT = r"^(?:[ \t\r]*\{[^\n]*\}[ \t\r]*\n)*(?:[ \t\r]*\{[^\n]*\}[ \t\r]*)?$"
_NDJSON_LOOSE = r"^(?:[ \t\r]*(?:\{[^\n]*\}[ \t\r]*)?\n)*[ \t\r]*(?:\{[^\n]*\}[ \t\r]*)?$"
_NDJSON_LINE_START = r"(?m)^[ \t\r]*\{"
# RFC 4180 framing (the slow path's tokenizer accepts exactly this).
_CSV_FIELD = r'(?:"[^"]*(?:""[^"]*)*"|[^,"\r\n]*)'
_CSV_STRICT = rf"^(?:{_CSV_FIELD}(?:,{_CSV_FIELD})*(?:\r\n|\n|\r|$))*$"

_BOM = b"\xef\xbb\xbf"
_BLANK_BYTES = re.compile(rb"[ \t\r\n]*")


# -------------------------------------------------------------------------- entry


def parse_run(
    body: bytes, content_type: str, columns: Sequence[ColumnSpec], event_time: str
) -> pa.Table:
    """Parse a run's body into a table of the declared columns (see the module docstring).

    Raises UnsupportedContentType for a content type that is not a run format, and
    RunFormatError (with ``line``, ``column`` and ``value``) for a malformed body.
    """
    return _parse(body, content_type, columns, event_time, mode="auto")


def _parse(
    body: bytes,
    content_type: str,
    columns: Sequence[ColumnSpec],
    event_time: str,
    *,
    mode: str,
) -> pa.Table:
    """``mode``: "auto" (fast path, slow path when it misses), "fast" (raise _FastPathMiss
    or pyarrow's error instead of falling back) or "slow" (slow path only). Tests use the
    last two to hold both paths to the same results."""
    kind = run_format(content_type)
    columns = tuple(columns)
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate column names in {names}")
    if event_time not in names:
        raise ValueError(f"event-time column {event_time!r} is not among the columns {names}")
    data = bytes(body)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    _check_utf8(data, csv=kind == "csv")
    if kind == "ndjson":
        return _parse_ndjson(data, columns, event_time, mode)
    return _parse_csv(data, columns, event_time, mode)


def _check_utf8(data: bytes, *, csv: bool) -> None:
    if data.isascii():
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = _line_start_offset(data, exc.start, csv=csv)
        end = data.find(b"\n", exc.start)
        shown = data[start : end if end >= 0 else len(data)].decode("utf-8", "backslashreplace")
        raise RunFormatError(
            f"the body is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
            line=_line_of_offset(data, exc.start, csv=csv),
            value=shown.rstrip("\r"),
        ) from None


def _line_of_offset(data: bytes, offset: int, *, csv: bool) -> int:
    line = data.count(b"\n", 0, offset) + 1
    if csv:  # a lone CR also ends a CSV line
        line += data.count(b"\r", 0, offset) - data.count(b"\r\n", 0, offset)
    return line


def _line_start_offset(data: bytes, offset: int, *, csv: bool) -> int:
    start = data.rfind(b"\n", 0, offset) + 1
    if csv:
        start = max(start, data.rfind(b"\r", 0, offset) + 1)
    return start


def _empty_table(columns: Sequence[ColumnSpec]) -> pa.Table:
    return arrow_schema(columns).empty_table()


class _FastPathMiss(Exception):
    """The fast path cannot vouch for the body; the slow path decides."""


class _Bad(Exception):
    """A value is refused; the caller adds line, column and value."""


# ---------------------------------------------------------------- fast path: shared


def _binary_scalar_array(data: bytes) -> pa.Array:
    """The whole body as a one-element large_binary array (zero-copy), for RE2 checks."""
    offsets = pa.array([0, len(data)], pa.int64()).buffers()[1]
    return pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])


def _all_true(mask: pa.ChunkedArray | pa.Array) -> bool:
    return bool(pc.all(mask, min_count=0).as_py())


def _require_grammar(arr: pa.ChunkedArray, pattern: str) -> None:
    if arr.null_count == len(arr):
        return
    if not _all_true(pc.match_substring_regex(arr, _re2(pattern))):
        raise _FastPathMiss


def _require_range(arr: pa.ChunkedArray, lo: int, hi: int) -> None:
    if arr.null_count == len(arr):
        return
    bounds = pc.min_max(arr)
    if bounds["min"].as_py() < lo or bounds["max"].as_py() > hi:
        raise _FastPathMiss


def _wide_decimal(sql_type: SqlType) -> pa.DataType:
    """A decimal256 with the declared integer digits (p-s) and more fraction digits.

    pyarrow checks a literal's digits against the precision, then scales it up without
    an overflow check. With precision + scale <= 76 the scaled value always fits in 256
    bits, so a value with too many integer digits stays exact and ``_fit_decimal`` finds
    it by comparison. That leaves s+15 (numeric(38,0): 19) to s+34 fraction digits.
    """
    p, s = sql_type.effective_precision, sql_type.effective_scale
    precision = (_DECIMAL256_DIGITS + p - s) // 2
    return pa.decimal256(precision, precision - (p - s))


def _fit_decimal(arr: pa.ChunkedArray, sql_type: SqlType) -> pa.ChunkedArray:
    """Round a widened decimal column half away from zero to the declared numeric(p,s).

    pyarrow's decimal division (rescaling down, ``round``) returns wrong digits for some
    values (seen with pyarrow 26: 18014398509481983.785 at scale 48 rounds to
    ...983.0542491814 at scale 10). A safe cast checks itself (it multiplies back); a
    rounded column is checked here with exact subtraction and comparison only, and any
    doubt goes to the slow path.
    """
    p, s = sql_type.effective_precision, sql_type.effective_scale
    target = pa.decimal128(p, s)
    if arr.null_count == len(arr):
        return arr.cast(target)
    largest = Decimal(f"{'9' * (p - s) or '0'}.{'9' * arr.type.scale}")
    if not _all_true(pc.less_equal(pc.abs(arr), pa.scalar(largest, arr.type))):
        raise _FastPathMiss  # numeric field overflow (the slow path says so)
    try:
        return arr.cast(target)  # a safe cast: only when no digit is lost
    except pa.ArrowInvalid:
        pass
    rounded = pc.round(arr, ndigits=s, round_mode="half_towards_infinity")
    error = pc.abs(pc.subtract(arr, rounded))
    half = pa.scalar(Decimal(5).scaleb(-(s + 1)), error.type)
    away_from_zero = pc.greater(pc.abs(rounded), pc.abs(arr))
    exact = pc.or_(pc.less(error, half), pc.and_(pc.equal(error, half), away_from_zero))
    if not _all_true(pc.or_(exact, pc.is_null(arr))):
        raise _FastPathMiss
    return rounded.cast(target)  # refuses digits beyond s, and values beyond precision p


def _require_finite(arr: pa.ChunkedArray) -> None:
    if arr.null_count < len(arr) and not _all_true(pc.is_finite(arr)):
        raise _FastPathMiss


def _temporal_from_strings(arr: pa.ChunkedArray, sql_type: SqlType) -> pa.ChunkedArray:
    name = sql_type.name
    if name == "date":
        _require_grammar(arr, _DATE)
        out = arr.cast(pa.date32())
        _require_range(out.cast(pa.int32()), _MIN_DAYS, _MAX_DAYS)
        return out
    if name == "timestamp":
        _require_grammar(arr, _TS_NAIVE)
        out = arr.cast(pa.timestamp("us"))
    else:
        utc = pa.timestamp("us", tz="UTC")
        has_offset = pc.match_substring_regex(arr, _re2(_TS_WITH_OFFSET))
        if _all_true(has_offset):  # the common case: one regex pass checks the grammar
            out = arr.cast(utc)
        else:
            _require_grammar(arr, _TS_ANY)
            if _all_true(pc.invert(has_offset)):  # no offset anywhere: the values are UTC
                out = arr.cast(pa.timestamp("us")).cast(utc)
            else:
                null = pa.scalar(None, pa.string())
                with_offset = pc.if_else(has_offset, arr, null).cast(utc)
                without = pc.if_else(has_offset, null, arr).cast(pa.timestamp("us")).cast(utc)
                out = pc.coalesce(with_offset, without)
    _require_range(out.cast(pa.int64()), _MIN_MICROS, _MAX_MICROS)
    return out


def _from_strings(arr: pa.ChunkedArray, sql_type: SqlType) -> pa.ChunkedArray:
    """Convert a column of CSV fields (or JSON temporal strings) to the declared type."""
    if sql_type.name == "text":
        return arr
    if sql_type.is_temporal:
        return _temporal_from_strings(arr, sql_type)
    if sql_type.is_integer:
        _require_grammar(arr, _INT)
        return arr.cast(arrow_type(sql_type))  # Arrow refuses out-of-range values and '+'
    if sql_type.is_numeric:
        # pyarrow's string->decimal cast wraps around on too many digits and mangles
        # exponents: it only gets plain decimals that fit the widened type.
        wide = _wide_decimal(sql_type)
        p, s = sql_type.effective_precision, sql_type.effective_scale
        int_digits = f"[0-9]{{1,{p - s}}}" if p > s else "0"
        plain = rf"[+-]?(?:{int_digits}(?:\.[0-9]{{0,{wide.scale}}})?|\.[0-9]{{1,{wide.scale}}})"
        _require_grammar(arr, plain)
        return _fit_decimal(arr.cast(wide), sql_type)
    if sql_type.is_float:
        _require_grammar(arr, _NUM)
        out = arr.cast(arrow_type(sql_type))
        _require_finite(out)
        return out
    if sql_type.name == "boolean":
        lower = pc.utf8_lower(arr)
        is_true = pc.is_in(lower, value_set=_BOOL_TRUE_SET)
        known = pc.or_(is_true, pc.is_in(lower, value_set=_BOOL_FALSE_SET))
        if not _all_true(pc.or_(known, pc.is_null(arr))):
            raise _FastPathMiss
        return pc.if_else(pc.is_null(arr), pa.scalar(None, pa.bool_()), is_true)
    raise ValueError(f"unsupported column type {sql_type.name!r}")


def _assemble(
    arrays: dict[str, pa.ChunkedArray], columns: Sequence[ColumnSpec], event_time: str
) -> pa.Table:
    if arrays[event_time].null_count:
        raise _FastPathMiss
    for c in columns:  # NUL can only hide in text columns (other strings pass a grammar)
        arr = arrays[c.name]
        if c.type.name == "text" and pc.any(pc.match_substring(arr, "\x00")).as_py():
            raise _FastPathMiss
    schema = arrow_schema(columns)
    return pa.Table.from_arrays([arrays[c.name] for c in columns], schema=schema)


# ------------------------------------------------------------------ fast path: NDJSON


def _json_read_type(sql_type: SqlType) -> pa.DataType:
    if sql_type.is_temporal:
        return pa.string()
    if sql_type.is_numeric:
        return _wide_decimal(sql_type)
    return arrow_type(sql_type)


def _fast_ndjson(data: bytes, columns: Sequence[ColumnSpec], event_time: str) -> pa.Table:
    # The framing is checked before pyarrow sees the body: pyarrow 26 crashes the whole
    # process (SIGSEGV) on a body that starts with a top-level null.
    lines = _ndjson_object_lines(data)
    read_schema = pa.schema([pa.field(c.name, _json_read_type(c.type)) for c in columns])
    table = pa_json.read_json(
        io.BytesIO(data),
        parse_options=pa_json.ParseOptions(
            explicit_schema=read_schema, unexpected_field_behavior="error"
        ),
    )
    if table.num_rows != lines:
        raise _FastPathMiss
    arrays = {}
    for c in columns:
        arr = table.column(c.name)
        if c.type.is_temporal:
            arr = _temporal_from_strings(arr, c.type)
        elif c.type.is_numeric:
            arr = _fit_decimal(arr, c.type)
        elif c.type.is_float:
            _require_finite(arr)  # pyarrow takes NaN/Infinity literals; float32 overflow
        arrays[c.name] = arr
    return _assemble(arrays, columns, event_time)


def _ndjson_object_lines(data: bytes) -> int:
    """The number of non-blank lines, when every one starts with '{' and ends with '}'.

    pyarrow also takes two objects on a line, or an object spread over lines. When every
    non-blank line starts with '{' and ends with '}', no object can span a line break
    (JSON never puts '}' and '{' side by side inside a value), so as many rows as such
    lines means exactly one object per line.
    """
    whole = _binary_scalar_array(data)
    if pc.match_substring_regex(whole, _NDJSON_STRICT)[0].as_py():
        return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if pc.match_substring_regex(whole, _NDJSON_LOOSE)[0].as_py():
        return int(pc.count_substring_regex(whole, _NDJSON_LINE_START)[0].as_py())
    raise _FastPathMiss


def _parse_ndjson(
    data: bytes, columns: Sequence[ColumnSpec], event_time: str, mode: str
) -> pa.Table:
    if _BLANK_BYTES.fullmatch(data):
        return _empty_table(columns)
    if mode != "slow":
        try:
            return _fast_ndjson(data, columns, event_time)
        except Exception:  # the fast path only vouches for bodies it fully understands
            if mode == "fast":
                raise
    return _slow_ndjson(data, columns, event_time)


# --------------------------------------------------------------------- fast path: CSV


def _fast_csv(
    data: bytes, header: list[str], columns: Sequence[ColumnSpec], event_time: str
) -> pa.Table:
    quoted = b'"' in data
    if quoted and not pc.match_substring_regex(_binary_scalar_array(data), _CSV_STRICT)[0].as_py():
        raise _FastPathMiss
    table = pa_csv.read_csv(
        io.BytesIO(data),
        read_options=pa_csv.ReadOptions(autogenerate_column_names=False),
        parse_options=pa_csv.ParseOptions(newlines_in_values=quoted, ignore_empty_lines=True),
        convert_options=pa_csv.ConvertOptions(
            column_types={name: pa.string() for name in header},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            check_utf8=False,  # checked on the whole body already
        ),
    )
    if table.column_names != header:
        raise _FastPathMiss
    arrays = {}
    for c in columns:
        if c.name in header:
            arrays[c.name] = _from_strings(table.column(c.name), c.type)
        else:
            arrays[c.name] = pa.chunked_array([pa.nulls(table.num_rows, arrow_type(c.type))])
    return _assemble(arrays, columns, event_time)


def _parse_csv(data: bytes, columns: Sequence[ColumnSpec], event_time: str, mode: str) -> pa.Table:
    text = data.decode("utf-8")
    first = next(_csv_records(text), None)
    if first is None:
        return _empty_table(columns)
    header = _check_header(first, columns, event_time)
    if _BLANK_TEXT.fullmatch(text, first.end):
        return _empty_table(columns)
    if mode != "slow":
        try:
            return _fast_csv(data, header, columns, event_time)
        except Exception:  # the fast path only vouches for bodies it fully understands
            if mode == "fast":
                raise
    rest = _csv_records(text, header, first.end, first.next_line)
    return _slow_csv(rest, header, columns, event_time)


# ------------------------------------------------------------ slow path: value parsing


def _parse_int_text(text: str, sql_type: SqlType) -> int:
    if not _INT_RE.fullmatch(text):
        raise _Bad("not an integer")
    lo, hi = _INT_RANGES[sql_type.name]
    if len(text.lstrip("+-").lstrip("0")) > 19:
        raise _Bad(f"out of range for type {sql_type.name} ({lo}..{hi})")
    value = int(text)
    if not lo <= value <= hi:
        raise _Bad(f"out of range for type {sql_type.name} ({lo}..{hi})")
    return value


_DECIMAL_CONTEXT = Context(prec=200)


def _parse_numeric_text(text: str, sql_type: SqlType) -> Decimal:
    if not _NUM_RE.fullmatch(text):
        if _NAN_INF_RE.fullmatch(text):
            raise _Bad("NaN and Infinity are not allowed in numeric columns")
        raise _Bad("not a number")
    p, s = sql_type.effective_precision, sql_type.effective_scale
    value = Decimal(text)
    overflow = _Bad(
        f"numeric field overflow: precision {p}, scale {s} "
        f"(the absolute value must round to less than 10^{p - s})"
    )
    if not value.is_zero() and value.adjusted() >= p - s:
        raise overflow
    quantum = Decimal(1).scaleb(-s)
    rounded = value.quantize(quantum, rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
    if rounded.is_zero():
        return rounded.copy_abs()
    if rounded.adjusted() >= p - s:
        raise overflow
    return rounded


def _parse_float_text(text: str, sql_type: SqlType) -> str:
    """Check a number for a float column; the text is converted by Arrow (one rounding)."""
    if not _NUM_RE.fullmatch(text):
        if _NAN_INF_RE.fullmatch(text):
            raise _Bad(f"NaN and Infinity are not allowed in {sql_type.name} columns")
        raise _Bad("not a number")
    magnitude = abs(float(text))
    limit = _FLOAT32_OVERFLOW if sql_type.name == "real" else math.inf
    if magnitude >= limit:
        raise _Bad(f"out of range for type {sql_type.name}")
    return text


def _parse_bool_text(text: str) -> bool:
    lower = text.lower()
    if lower in _BOOL_TRUE:
        return True
    if lower in _BOOL_FALSE:
        return False
    raise _Bad("not a boolean (expected one of t/f, true/false, y/n, yes/no, on/off, 1/0)")


def _parse_date_text(text: str) -> int:
    m = _DATE_RE.fullmatch(text)
    if m is None:
        raise _Bad("not a date (expected YYYY-MM-DD, e.g. 2024-01-31)")
    year, month, day = (int(g) for g in m.groups())
    if year == 0:
        raise _Bad("date out of range (years 1..9999 only)")
    try:
        return date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise _Bad("date field value out of range") from None


def _parse_timestamp_text(text: str, *, with_tz: bool) -> int:
    """Microseconds since the epoch (UTC for timestamptz)."""
    m = _TS_RE.fullmatch(text)
    if m is None:
        example = "2024-01-31T12:00:00Z" if with_tz else "2024-01-31T12:00:00"
        kind = "timestamp" if with_tz else "timestamp without time zone"
        raise _Bad(f"not a {kind} (expected ISO 8601, e.g. {example})")
    year, month, day, hour, minute, second, fraction, offset = m.groups()
    if offset is not None and not with_tz:
        raise _Bad("a time zone offset is not allowed in a timestamp (without time zone) column")
    if int(year) == 0:
        raise _Bad("timestamp out of range (years 1..9999 only)")
    hh, mi, ss = int(hour or 0), int(minute or 0), int(second or 0)
    try:
        moment = datetime(int(year), int(month), int(day), hh, mi, ss)
    except ValueError:
        raise _Bad("date/time field value out of range") from None
    offset_seconds = 0
    if offset is not None and offset != "Z":
        off_h, off_m = int(offset[1:3]), int(offset[-2:]) if len(offset) > 3 else 0
        if off_h > 23 or off_m > 59:
            raise _Bad("time zone offset out of range")
        offset_seconds = (off_h * 3600 + off_m * 60) * (1 if offset[0] == "+" else -1)
    days = moment.toordinal() - _EPOCH_ORDINAL
    seconds = days * 86400 + hh * 3600 + mi * 60 + ss - offset_seconds
    micros = seconds * 1_000_000 + int((fraction or "").ljust(6, "0"))
    if not _MIN_MICROS <= micros <= _MAX_MICROS:
        raise _Bad("timestamp out of range (years 1..9999 in UTC only)")
    return micros


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise _Bad("text cannot contain NUL (\\u0000) characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad("invalid Unicode escape (a lone surrogate)") from None
    return value


def _text_parser(sql_type: SqlType) -> Callable[[str], Any]:
    """The parser of a value given as text (a CSV field, or a JSON string)."""
    name = sql_type.name
    if name == "text":
        return _check_text
    if sql_type.is_integer:
        return lambda text: _parse_int_text(text, sql_type)
    if sql_type.is_numeric:
        return lambda text: _parse_numeric_text(text, sql_type)
    if sql_type.is_float:
        return lambda text: _parse_float_text(text, sql_type)
    if name == "boolean":
        return _parse_bool_text
    if name == "date":
        return _parse_date_text
    if name in ("timestamptz", "timestamp"):
        with_tz = name == "timestamptz"
        return lambda text: _parse_timestamp_text(text, with_tz=with_tz)
    raise ValueError(f"unsupported column type {name!r}")


def _to_arrow(values: list[Any], sql_type: SqlType) -> pa.Array:
    """Build a column from the slow path's Python values."""
    target = arrow_type(sql_type)
    if sql_type.is_float:  # number texts, rounded once by the same parser as the fast path
        return pa.array(values, pa.string()).cast(target)
    if sql_type.name in ("timestamptz", "timestamp"):
        return pa.array(values, pa.int64()).cast(target)
    if sql_type.name == "date":
        return pa.array(values, pa.int32()).cast(target)
    return pa.array(values, target)


def _build_table(values: dict[str, list[Any]], columns: Sequence[ColumnSpec]) -> pa.Table:
    arrays = [_to_arrow(values[c.name], c.type) for c in columns]
    return pa.Table.from_arrays(arrays, schema=arrow_schema(columns))


def _listed(names: Sequence[str]) -> str:
    """Unknown names as an error lists them: the first few, each cut to a readable length."""
    shown = [repr(n if len(n) <= 80 else n[:77] + "...") for n in names[:5]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _event_time_missing(event_time: str, *, null: bool) -> str:
    if null:
        return f"the event-time column {event_time!r} must not be null"
    return f"the event-time column {event_time!r} is missing; it is required on every row"


# ------------------------------------------------------------------ slow path: NDJSON


class _IntLiteral(str):
    """A JSON integer literal, kept as its text."""


class _FloatLiteral(str):
    """A JSON number literal with a fraction or exponent, kept as its text."""


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _JsonConstant:
    """NaN, Infinity or -Infinity, which Python's json takes but JSON does not have."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


_JSON_DECODER = json.JSONDecoder(
    parse_int=_IntLiteral,
    parse_float=_FloatLiteral,
    parse_constant=_JsonConstant,
    object_pairs_hook=_unique_keys,
)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (_IntLiteral, _FloatLiteral)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, _JsonConstant):
        return value.name
    return "an object"


def _plain_json(value: Any) -> Any:
    if isinstance(value, _IntLiteral):
        return int(value) if len(value) < 4000 else float(value)
    if isinstance(value, _FloatLiteral):
        return float(value)
    if isinstance(value, list):
        return [_plain_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_json(v) for k, v in value.items()}
    return value


def _json_shown(value: Any) -> str:
    """The offending value as a user wrote it (strings unquoted)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, _JsonConstant):
        return value.name
    return json.dumps(_plain_json(value), ensure_ascii=False, default=_shown_constant)


def _shown_constant(value: Any) -> str:
    return value.name if isinstance(value, _JsonConstant) else repr(value)


def _json_parser(sql_type: SqlType) -> Callable[[Any], Any]:
    """The parser of a JSON value (not null) for a column of the given type."""
    parse_text = _text_parser(sql_type)
    name = sql_type.name

    def expected(what: str, value: Any) -> _Bad:
        return _Bad(f"expected {what}, got {_json_kind(value)}")

    if name == "text":

        def parse(value: Any) -> Any:
            if isinstance(value, str) and not isinstance(value, (_IntLiteral, _FloatLiteral)):
                return parse_text(value)
            raise expected("a string", value)

    elif sql_type.is_integer:

        def parse(value: Any) -> Any:
            if isinstance(value, _FloatLiteral):
                raise _Bad("not an integer")
            if isinstance(value, str):
                return parse_text(value)
            raise expected("an integer", value)

    elif sql_type.is_number:

        def parse(value: Any) -> Any:
            if isinstance(value, str):
                return parse_text(value)
            raise expected("a number", value)

    elif name == "boolean":

        def parse(value: Any) -> Any:
            if isinstance(value, bool):
                return value
            raise expected("true or false", value)

    else:  # temporal: an ISO 8601 string

        def parse(value: Any) -> Any:
            if isinstance(value, str) and not isinstance(value, (_IntLiteral, _FloatLiteral)):
                return parse_text(value)
            raise expected("an ISO 8601 string", value)

    def parse_value(value: Any) -> Any:
        if isinstance(value, _JsonConstant):
            raise _Bad(f"{value.name} is not a JSON value (NaN and Infinity are not allowed)")
        return parse(value)

    return parse_value


def _slow_ndjson(data: bytes, columns: Sequence[ColumnSpec], event_time: str) -> pa.Table:
    parsers = {c.name: _json_parser(c.type) for c in columns}
    values: dict[str, list[Any]] = {c.name: [] for c in columns}
    declared = ", ".join(c.name for c in columns)
    missing = object()
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        if _BLANK_BYTES.fullmatch(raw):
            continue
        line = raw.decode("utf-8").rstrip("\r")
        try:
            obj = _JSON_DECODER.decode(line)
        except json.JSONDecodeError as exc:
            raise RunFormatError(
                f"invalid JSON: {exc.msg} (at character {exc.colno})", line=line_no, value=line
            ) from None
        except _DuplicateKey as exc:
            raise RunFormatError(
                f"field {exc.key!r} appears more than once in the object",
                line=line_no,
                column=exc.key,
            ) from None
        except RecursionError:
            raise RunFormatError("invalid JSON: nested too deeply", line=line_no) from None
        if not isinstance(obj, dict):
            if isinstance(obj, _JsonConstant):
                raise RunFormatError(
                    f"invalid JSON: {obj.name} is not a JSON value", line=line_no, value=line
                )
            raise RunFormatError(
                f"expected one JSON object per line, got {_json_kind(obj)}",
                line=line_no,
                value=line,
            )
        unknown = [key for key in obj if key not in parsers]
        if unknown:
            listed = _listed(unknown)
            noun = "field" if len(unknown) == 1 else "fields"
            raise RunFormatError(
                f"unknown {noun} {listed}; the stream declares: {declared}",
                line=line_no,
                column=unknown[0],
                value=_json_shown(obj[unknown[0]]),
            )
        for name, parse in parsers.items():
            value = obj.get(name, missing)
            if value is missing or value is None:
                if name == event_time:
                    raise RunFormatError(
                        _event_time_missing(event_time, null=value is None),
                        line=line_no,
                        column=name,
                    )
                values[name].append(None)
                continue
            try:
                values[name].append(parse(value))
            except _Bad as exc:
                raise RunFormatError(
                    str(exc), line=line_no, column=name, value=_json_shown(value)
                ) from None
    return _build_table(values, columns)


# --------------------------------------------------------------------- slow path: CSV

_BLANK_TEXT = re.compile(r"[\r\n]*")
_CSV_QUOTED = re.compile(r'"([^"]*(?:""[^"]*)*)"')
_CSV_UNQUOTED = re.compile(r'[^,"\r\n]*')


class _Record:
    """A CSV record: its first line, its (text, quoted) fields, where the next one starts."""

    __slots__ = ("end", "fields", "line", "next_line")

    def __init__(self, line: int, fields: list[tuple[str, bool]], end: int, next_line: int) -> None:
        self.line = line
        self.fields = fields
        self.end = end
        self.next_line = next_line


def _count_breaks(text: str) -> int:
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def _csv_records(
    text: str, header: list[str] | None = None, pos: int = 0, line: int = 1
) -> Iterator[_Record]:
    """Tokenize RFC 4180 CSV from ``pos`` (on ``line``); skips empty lines.

    Raises RunFormatError on bad quoting, naming the column when ``header`` is given.
    """
    n = len(text)
    while pos < n:
        char = text[pos]
        if char == "\n" or char == "\r":  # an empty line
            pos += 2 if text.startswith("\r\n", pos) else 1
            line += 1
            continue
        start_line = line
        # Most lines hold no quote: split them at once.
        eol = text.find("\n", pos)
        segment = text[pos : n if eol < 0 else eol]
        if segment.endswith("\r"):
            segment = segment[:-1]
        if '"' not in segment and "\r" not in segment:
            pos = n if eol < 0 else eol + 1
            line += 1
            yield _Record(start_line, [(f, False) for f in segment.split(",")], pos, line)
            continue
        fields: list[tuple[str, bool]] = []
        while True:
            column = header[len(fields)] if header and len(fields) < len(header) else None
            if pos < n and text[pos] == '"':
                m = _CSV_QUOTED.match(text, pos)
                if m is None:
                    raise RunFormatError(
                        "unterminated quoted field (a quote opened here is never closed)",
                        line=start_line,
                        column=column,
                        value=text[pos : pos + 80],
                    )
                raw = m.group(1)
                line += _count_breaks(raw)
                pos = m.end()
                if pos < n and text[pos] not in ",\r\n":
                    raise RunFormatError(
                        "unexpected character after a closing quote (a quote inside a quoted "
                        'field must be doubled: "")',
                        line=start_line,
                        column=column,
                        value=m.group(0) + text[pos : pos + 20],
                    )
                fields.append((raw.replace('""', '"'), True))
            else:
                m = _CSV_UNQUOTED.match(text, pos)
                assert m is not None  # the pattern matches the empty string too
                pos = m.end()
                if pos < n and text[pos] == '"':
                    raise RunFormatError(
                        "quote character inside an unquoted field (quote the whole field and "
                        'double the quote: "a""b")',
                        line=start_line,
                        column=column,
                        value=m.group(0) + text[pos : pos + 20],
                    )
                fields.append((m.group(0), False))
            if pos >= n:
                break
            if text[pos] == ",":
                pos += 1
                continue
            pos += 2 if text.startswith("\r\n", pos) else 1
            line += 1
            break
        yield _Record(start_line, fields, pos, line)


def _check_header(record: _Record, columns: Sequence[ColumnSpec], event_time: str) -> list[str]:
    names = [text for text, _ in record.fields]
    declared = {c.name for c in columns}
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise RunFormatError(
                f"column {name!r} appears more than once in the CSV header",
                line=record.line,
                column=name,
                value=name,
            )
        seen.add(name)
    unknown = [name for name in names if name not in declared]
    if unknown:
        listed = _listed(unknown)
        noun = "column" if len(unknown) == 1 else "columns"
        raise RunFormatError(
            f"unknown {noun} {listed} in the CSV header; the stream declares: "
            + ", ".join(c.name for c in columns),
            line=record.line,
            column=unknown[0],
            value=unknown[0],
        )
    if event_time not in seen:
        raise RunFormatError(
            f"the CSV header lacks the event-time column {event_time!r}; it is required",
            line=record.line,
            column=event_time,
        )
    return names


def _slow_csv(
    records: Iterator[_Record],
    header: list[str],
    columns: Sequence[ColumnSpec],
    event_time: str,
) -> pa.Table:
    types = {c.name: c.type for c in columns}
    parsers = [_text_parser(types[name]) for name in header]
    is_text = [types[name].name == "text" for name in header]
    values: dict[str, list[Any]] = {c.name: [] for c in columns}
    absent = [c.name for c in columns if c.name not in header]
    width = len(header)
    for record in records:
        fields = record.fields
        if len(fields) != width:
            raise RunFormatError(
                f"expected {width} fields (as in the header), got {len(fields)}",
                line=record.line,
                value=",".join(text for text, _ in fields),
            )
        for i, (text, quoted) in enumerate(fields):
            name = header[i]
            if not text and not quoted:
                if name == event_time:
                    raise RunFormatError(
                        _event_time_missing(event_time, null=True), line=record.line, column=name
                    )
                values[name].append(None)
                continue
            if not text and not is_text[i]:
                raise RunFormatError(
                    f'an empty quoted field ("") is not a valid {types[name].pg()} value; '
                    "leave the field empty (unquoted) for NULL",
                    line=record.line,
                    column=name,
                    value=text,
                )
            try:
                values[name].append(parsers[i](text))
            except _Bad as exc:
                raise RunFormatError(str(exc), line=record.line, column=name, value=text) from None
        for name in absent:
            values[name].append(None)
    return _build_table(values, columns)


# ------------------------------------------------ building blocks for other framings
# server/ingest/copy_format.py reads PostgreSQL's COPY formats into runs with these, so a
# COPY and an HTTP body of the same rows give the same table, or the same error.


def columns_from_fields(
    fields: dict[str, pa.ChunkedArray], columns: Sequence[ColumnSpec], event_time: str
) -> pa.Table | None:
    """The fast path over columns of field texts, null where a field is NULL, keyed by
    declared column (those absent are NULL): the run's table, or None when the fast path
    cannot vouch for a value (``rows_from_fields`` then names the problem)."""
    try:
        arrays = {
            c.name: _from_strings(fields[c.name], c.type)
            if c.name in fields
            else pa.chunked_array([pa.nulls(_length(fields), arrow_type(c.type))])
            for c in columns
        }
        return _assemble(arrays, columns, event_time)
    except Exception:  # the fast path only vouches for values it fully understands
        return None


def _length(fields: dict[str, pa.ChunkedArray]) -> int:
    return len(next(iter(fields.values()))) if fields else 0


def rows_from_fields(
    records: Iterable[tuple[int, Sequence[str | None]]],
    names: Sequence[str],
    columns: Sequence[ColumnSpec],
    event_time: str,
) -> pa.Table:
    """The slow path over records: (line, field texts in the order of ``names``, None for
    NULL). Raises RunFormatError naming the line, column and value of the first bad field."""
    types = {c.name: c.type for c in columns}
    parsers = [_text_parser(types[name]) for name in names]
    values: dict[str, list[Any]] = {c.name: [] for c in columns}
    absent = [c.name for c in columns if c.name not in names]
    for line, fields in records:
        for name, parser, text in zip(names, parsers, fields, strict=True):
            if text is None:
                if name == event_time:
                    raise RunFormatError(
                        _event_time_missing(event_time, null=True), line=line, column=name
                    )
                values[name].append(None)
                continue
            try:
                values[name].append(parser(text))
            except _Bad as exc:
                raise RunFormatError(str(exc), line=line, column=name, value=text) from None
        for name in absent:
            values[name].append(None)
    return _build_table(values, columns)
