"""COPY's text and CSV formats read into runs (server/ingest/copy_format.py): the same rows
give the same table as an HTTP body, and errors name the line as counted in the COPY
data, the column and the value, with the texts an HTTP body gets."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import InvalidSQL, UnsupportedSQL
from server.errors import RunFormatError
from server.ingest import copy_format as cf
from server.ingest.copy_format import CopyFormat, parse_copy
from server.ingest.parse import parse_run, rows_from_fields

PLAN = rewrite(
    "CREATE STREAM ev (label text, n bigint, price numeric(12,4), ok boolean, t timestamptz) "
    "WITH (event_time = 't')",
    {},
)
COLUMNS = PLAN.columns
NAMES = [c.name for c in COLUMNS]
TEXT = CopyFormat.of()
CSV = CopyFormat.of(format="csv")


def copy(data: str | bytes, copy_format: CopyFormat = TEXT, names: list[str] = NAMES) -> pa.Table:
    raw = data.encode() if isinstance(data, str) else data
    return parse_copy(raw, copy_format, names, COLUMNS, "t")


def refused(data: str, copy_format: CopyFormat = TEXT, names: list[str] = NAMES) -> RunFormatError:
    with pytest.raises(RunFormatError) as raised:
        copy(data, copy_format, names)
    return raised.value


# ---- the same rows as over HTTP ----------------------------------------------------------

Row = tuple[str | None, int | None, Decimal | None, bool | None, datetime]

ROWS = st.lists(
    st.tuples(
        st.one_of(
            st.none(),
            st.text(alphabet=st.characters(exclude_characters="\0", exclude_categories=("Cs",))),
        ),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        st.one_of(
            st.none(), st.decimals(min_value=-(10**7), max_value=10**7, places=4, allow_nan=False)
        ),
        st.one_of(st.none(), st.booleans()),
        st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1)).map(
            lambda d: d.replace(tzinfo=UTC)
        ),
    ),
    max_size=20,
)


def _text_field(value: object) -> str:
    if value is None:
        return "\\N"
    text = _plain(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _csv_field(value: object) -> str:
    if value is None:
        return ""
    text = _plain(value)
    if text == "" or any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _ndjson(rows: list[Row]) -> bytes:
    def value(v: object) -> object:
        if isinstance(v, Decimal):
            return str(v)
        if isinstance(v, datetime):
            return v.isoformat()
        return v

    return "".join(
        json.dumps({n: value(v) for n, v in zip(NAMES, row, strict=True)}) + "\n" for row in rows
    ).encode()


@settings(max_examples=60, deadline=None)
@given(ROWS)
def test_text_and_csv_copies_equal_the_http_body_of_the_same_rows(rows: list[Row]) -> None:
    expected = parse_run(_ndjson(rows), "application/x-ndjson", COLUMNS, "t")
    text = "".join("\t".join(_text_field(v) for v in row) + "\n" for row in rows)
    csv = "".join(",".join(_csv_field(v) for v in row) + "\r\n" for row in rows)
    assert copy(text).equals(expected)
    assert copy(csv, CSV).equals(expected)
    header = ",".join(NAMES) + "\n"
    assert copy(header + csv, CopyFormat.of(format="csv", header="match")).equals(expected)
    # The slow path (records walked in Python) agrees with whatever path was taken.
    slow = rows_from_fields(
        cf._checked(cf._text_records(text.encode(), TEXT), TEXT, NAMES), NAMES, COLUMNS, "t"
    )
    assert slow.equals(expected)


# ---- the formats' details ------------------------------------------------------------------


def test_text_format_escapes_nulls_and_the_end_marker() -> None:
    data = (
        "a\\tb\\\\c\\101\\x42\\q\t1\t\\N\tt\t2026-11-21 10:00:05+00\r\n"
        "\\303\\251\t\\N\t1.5\tf\t2026-11-21T10:00:05Z\n"
        "\\.\n"
        "ignored after the end marker\n"
    )
    table = copy(data)
    assert table.column("label").to_pylist() == ["a\tb\\cABq", "é"]
    assert table.column("n").to_pylist() == [1, None]
    assert table.column("ok").to_pylist() == [True, False]


def test_column_lists_options_and_headers() -> None:
    table = copy("2026-11-21T10:00:00Z;x\n", CopyFormat.of(delimiter=";"), ["t", "label"])
    assert table.column("label").to_pylist() == ["x"] and table.column("n").to_pylist() == [None]
    nulls = CopyFormat.of(format="csv", null="NULL", quote="'", header="on")
    table = copy(
        "label,t\n'a,b',2026-11-21T10:00:00Z\nNULL,2026-11-21T10:00:00Z\n'NULL',2026-11-21T10:00:00Z\n",
        nulls,
        ["label", "t"],
    )
    assert table.column("label").to_pylist() == ["a,b", None, "NULL"]
    escaped = CopyFormat.of(format="csv", escape="\\")
    assert copy('"a\\"b",2026-11-21T10:00:00Z\n', escaped, ["label", "t"]).column(
        "label"
    ).to_pylist() == ['a"b']


def test_errors_name_line_column_and_value_like_http() -> None:
    body = "label,n,price,ok,t\nx,1,0.5,t,2026-11-21T10:00:00Z\ny,2,abc,t,2026-11-21T10:00:00Z\n"
    with pytest.raises(RunFormatError) as http:
        parse_run(body.encode(), "text/csv", COLUMNS, "t")
    error = refused(body, CopyFormat.of(format="csv", header=True))
    assert str(error) == str(http.value) == "line 3, column 'price': not a number (value: 'abc')"
    assert (error.line, error.column, error.value) == (3, "price", "abc")


@pytest.mark.parametrize(
    "data, copy_format, message",
    [
        ("x\t1\n", TEXT, "line 1, column 'price': missing data for column 'price'"),
        (
            "x\t1\t1\tt\t2026-11-21T10:00:00Z\textra\n",
            TEXT,
            "extra data after last expected column",
        ),
        ("x\t1\t1\tt\t\\N\n", TEXT, "the event-time column 't' must not be null"),
        ("x\t1\t1\tmaybe\t2026-11-21T10:00:00Z\n", TEXT, "column 'ok'"),
        (
            'x,1,1,t,2026-11-21T10:00:00Z\n"open,1,1,t,2026\n',
            CSV,
            "line 2: unterminated CSV quoted field",
        ),
        (
            'x,1,"",t,2026-11-21T10:00:00Z\n',
            CSV,
            "line 1, column 'price': not a number (value: '')",
        ),
        ("x\t\xff\t1\tt\t2026-11-21T10:00:00Z\n", TEXT, "not valid UTF-8"),
    ],
)
def test_bad_rows_are_refused_whole(data: str, copy_format: CopyFormat, message: str) -> None:
    with pytest.raises(RunFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        copy(data.encode("latin-1") if "\xff" in data else data, copy_format)


def test_a_multi_line_csv_row_is_named_by_its_first_line() -> None:
    data = 'x,1,1,t,2026-11-21T10:00:00Z\n"two\nlines",1,bad,t,2026-11-21T10:00:00Z\n'
    assert refused(data, CSV).line == 2
    after = (
        'x,1,1,t,2026-11-21T10:00:00Z\n"two\nlines",1,1,t,2026-11-21T10:00:00Z\n'
        "y,1,bad,t,2026-11-21T10:00:00Z\n"
    )
    assert refused(after, CSV).line == 4  # lines as in the data: the quoted break counts


def test_header_match_checks_the_names() -> None:
    error = refused("label,n,cost,ok,t\n", CopyFormat.of(format="csv", header="match"))
    assert error.line == 1 and "'cost' does not match the expected column name 'price'" in str(
        error
    )


def test_empty_data_is_a_run_of_no_rows() -> None:
    assert copy("").num_rows == 0
    assert copy("\\.\n").num_rows == 0
    assert copy(",".join(NAMES) + "\n", CopyFormat.of(format="csv", header=True)).num_rows == 0


@pytest.mark.parametrize(
    "options, error",
    [
        ({"format": "binary"}, UnsupportedSQL),
        ({"format": "xml"}, InvalidSQL),
        ({"delimiter": "ab"}, InvalidSQL),
        ({"delimiter": "\n"}, InvalidSQL),
        ({"delimiter": "\\"}, InvalidSQL),
        ({"quote": "'"}, InvalidSQL),  # QUOTE in text format
        ({"format": "csv", "quote": ","}, InvalidSQL),
        ({"null": "a\tb"}, InvalidSQL),
        ({"header": "sometimes"}, InvalidSQL),
    ],
)
def test_options_are_checked_as_postgresql_checks_them(
    options: dict[str, str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        CopyFormat.of(**options)


def test_large_copies_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    start = datetime(2026, 11, 21, tzinfo=UTC)
    moments = [f"{start + timedelta(seconds=i):%Y-%m-%dT%H:%M:%SZ}" for i in range(20_000)]
    lines = [f"c{i % 7}\t{i}\t{i % 100}.25\t{'tf'[i % 2]}\t{t}" for i, t in enumerate(moments)]
    # The slow path is not taken: a plain COPY is read by pyarrow alone.
    monkeypatch.setattr(cf, "rows_from_fields", None)
    table = copy("\n".join(lines) + "\n")
    assert table.num_rows == 20_000 and table.column("n").to_pylist()[-1] == 19_999
