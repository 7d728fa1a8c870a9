"""The SQL port's reading of query strings (server/pgwire/lexer.py, statements.py, values.py)
and of protocol messages (messages.py), without a server."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import InvalidSQL, UnsupportedSQL
from server.pgwire import messages as m
from server.pgwire.lexer import Unreadable, split, tokenize
from server.pgwire.statements import (
    AlterStream,
    CopyFrom,
    CreateStream,
    DropStream,
    ExplainStream,
    Insert,
    Refused,
    ShowStreams,
    Statement,
    classify,
    may_hold_strata,
)
from server.pgwire.values import insert_records, parameter_text
from tests.conftest import examples

IMPSNS = rewrite(
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')",
    {},
)


def statements(text: str) -> list[Statement | None]:
    return [classify(text, piece) for piece in split(text) if piece.tokens]


# ---- the lexer -----------------------------------------------------------------------


def test_semicolons_inside_quotes_comments_and_dollar_quotes_do_not_split() -> None:
    text = (
        "SELECT 'a;b', E'c\\';d', \"q;\", $x$ ; $x$, $$;$$ /* ; /* nested ; */ ; */ -- ;\n"
        "; CREATE STREAM s (a int) WITH (event_time = 'a');"
    )
    pieces = [p for p in split(text) if p.tokens]
    assert len(pieces) == 2
    assert text[pieces[1].start : pieces[1].end].strip().startswith("CREATE STREAM s")


def test_string_constants_are_decoded() -> None:
    values = [
        t.value for t in tokenize("'it''s' E'a\\tb\\x41\\101\\u00e9' U&'\\00e9t\\00e9' $t$x'y$t$")
    ]
    assert values == ["it's", "a\tbAAé", "été", "x'y"]
    words = [t.value for t in tokenize('CREATE "MixedCase" Stream')]
    assert words == ["create", "MixedCase", "stream"]


def test_unreadable_strings_are_left_to_postgresql() -> None:
    for text in ("SELECT 'open", 'SELECT "open', "SELECT $x$ open", "SELECT /* open"):
        with pytest.raises(Unreadable):
            tokenize(text)


def test_the_cheap_test_lets_plain_queries_through() -> None:
    assert not may_hold_strata("SELECT campaign, sum(c) FROM impsn_count GROUP BY 1")
    assert may_hold_strata("select 1; Copy t FROM stdin")


# ---- Strata's statements ------------------------------------------------------------------


def test_strata_statements_are_recognised() -> None:
    text = (
        "create stream s (a int, t timestamptz) with (event_time = 't');"
        "DROP STREAM IF EXISTS public.s; ALTER STREAM s AS SELECT 1; SHOW STREAMS;"
        'EXPLAIN STREAM "S"'
    )
    found = statements(text)
    assert isinstance(found[0], CreateStream)
    assert found[0].text == "create stream s (a int, t timestamptz) with (event_time = 't')"
    assert isinstance(found[1], DropStream) and found[1].if_exists
    assert (found[1].name.schema, found[1].name.name) == ("public", "s")
    assert isinstance(found[2], AlterStream) and isinstance(found[3], ShowStreams)
    assert isinstance(found[4], ExplainStream) and found[4].name.name == "S"


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1",
        "SHOW search_path",
        "EXPLAIN SELECT 1",
        "CREATE TABLE stream (x int)",
        "DROP TABLE streams",
        "COPY t TO STDOUT",
        "COPY (SELECT 1) TO STDOUT",
        "INSERT INTO t SELECT 1",  # a candidate only: passes unless t is a stream
    ],
)
def test_postgresqls_statements_are_not_strata_statements(text: str) -> None:
    found = statements(text)[0]
    assert found is None or isinstance(found, Insert | CopyFrom)


def test_copy_options_new_and_old_syntax() -> None:
    new = statements(
        "COPY impsns (campaign, t) FROM STDIN WITH (FORMAT csv, HEADER, DELIMITER ';', "
        "NULL 'x', RUN_ID 'r-1')"
    )[0]
    assert isinstance(new, CopyFrom) and new.problem is None
    assert new.columns == ("campaign", "t")
    assert [(o.name, o.value) for o in new.options] == [
        ("format", "csv"),
        ("header", None),
        ("delimiter", ";"),
        ("null", "x"),
        ("run_id", "r-1"),
    ]
    old = statements("COPY impsns FROM stdin DELIMITER AS '|' NULL 'n' CSV HEADER QUOTE '\"'")[0]
    assert isinstance(old, CopyFrom)
    assert [(o.name, o.value) for o in old.options] == [
        ("delimiter", "|"),
        ("null", "n"),
        ("format", "csv"),
        ("header", None),
        ("quote", '"'),
    ]


def test_copy_forms_strata_refuses_carry_their_refusal_and_place() -> None:
    text = "COPY impsns FROM '/tmp/rows.csv'"
    refused = statements(text)[0]
    assert isinstance(refused, CopyFrom) and refused.problem is not None
    assert isinstance(refused.problem.error, UnsupportedSQL)
    assert text[refused.problem.at :].startswith("'/tmp/rows.csv'")
    where = statements("COPY impsns FROM STDIN WHERE user_id > 1")[0]
    assert isinstance(where, CopyFrom) and where.problem is not None


def test_drop_stream_refusals_are_placed() -> None:
    text = "DROP STREAM a, b"
    with pytest.raises(Refused) as raised:
        statements(text)
    assert isinstance(raised.value.error, UnsupportedSQL) and text[raised.value.at] == ","
    with pytest.raises(Refused, match="CASCADE"):
        statements("DROP STREAM a CASCADE")
    with pytest.raises(Refused) as missing:
        statements("DROP STREAM")
    assert isinstance(missing.value.error, InvalidSQL)


def test_insert_values_constants_and_parameters() -> None:
    text = (
        "INSERT INTO impsns AS i (t, campaign, price) VALUES "
        "('2026-11-21T10:00:00Z', 'a''b', -1.5e1), "
        "(timestamptz '2026-11-21 10:00:00+00', $1, CAST($2 AS numeric(12,4))), "
        "($3::timestamptz, NULL, DEFAULT)"
    )
    insert = statements(text)[0]
    assert isinstance(insert, Insert) and insert.problem is None
    assert insert.parameters == 3 and insert.columns == ("t", "campaign", "price")
    names, records = insert_records(insert, IMPSNS.columns, ["x", "2.5", "2026-11-21T11:00:00Z"])
    assert names == ["t", "campaign", "price"]
    assert records == [
        (1, ["2026-11-21T10:00:00Z", "a'b", "-1.5e1"]),
        (2, ["2026-11-21 10:00:00+00", "x", "2.5"]),
        (3, ["2026-11-21T11:00:00Z", None, None]),
    ]
    # Without a column list, missing trailing values are NULL, as PostgreSQL's defaults.
    short = statements("INSERT INTO impsns VALUES ('a')")[0]
    assert isinstance(short, Insert)
    assert insert_records(short, IMPSNS.columns)[1] == [(1, ["a", None, None, None])]


@pytest.mark.parametrize(
    "text, found",
    [
        ("INSERT INTO impsns VALUES (now())", "now"),
        ("INSERT INTO impsns VALUES (1 + 2)", "followed by"),
        ("INSERT INTO impsns SELECT 1", "VALUES"),
        ("INSERT INTO impsns VALUES (1) RETURNING *", "RETURNING"),
        ("INSERT INTO impsns VALUES (1) ON CONFLICT DO NOTHING", "ON"),
        ("INSERT INTO impsns DEFAULT VALUES", "VALUES"),
    ],
)
def test_insert_forms_strata_refuses(text: str, found: str) -> None:
    insert = statements(text)[0]
    assert isinstance(insert, Insert) and insert.problem is not None
    assert found in str(insert.problem.error)
    assert 0 <= insert.problem.at <= len(text)


def test_insert_arity_errors_are_postgresqls() -> None:
    insert = statements("INSERT INTO impsns (campaign, t) VALUES ('a', 'b', 'c')")[0]
    assert isinstance(insert, Insert)
    with pytest.raises(Refused, match="more expressions than target columns"):
        insert_records(insert, IMPSNS.columns)
    fewer = statements("INSERT INTO impsns (campaign, t) VALUES ('a')")[0]
    assert isinstance(fewer, Insert)
    with pytest.raises(Refused, match="more target columns than expressions"):
        insert_records(fewer, IMPSNS.columns)


def test_binary_parameters_become_the_texts_copy_would_carry() -> None:
    def numeric(digits: list[int], weight: int, sign: int, scale: int) -> bytes:
        head = struct.pack("!hhHh", len(digits), weight, sign, scale)
        return head + struct.pack(f"!{len(digits)}h", *digits)

    cases = [
        (struct.pack("!q", -42), 20, "bigint", "-42"),
        (struct.pack("!h", 7), 21, "bigint", "7"),
        (b"\x01", 16, "boolean", "true"),
        (struct.pack("!d", 0.25), 701, "double precision", "0.25"),
        (numeric([12, 3400], 0, 0x4000, 4), 1700, "numeric", "-12.3400"),
        (struct.pack("!q", 86_400_000_000), 1184, "timestamptz", "2000-01-02T00:00:00+00:00"),
        (struct.pack("!i", -1), 1082, "date", "1999-12-31"),
        ("é".encode(), 0, "text", "é"),  # unknown type: read by the column's
    ]
    for value, oid, column_type, text in cases:
        assert parameter_text(value, True, oid, column_type, "utf-8") == text
    assert parameter_text(b"1.5", False, 0, "numeric", "utf-8") == "1.5"
    assert parameter_text(None, True, 20, "bigint", "utf-8") is None
    with pytest.raises(UnsupportedSQL):
        parameter_text(b"\0", True, 17, "text", "utf-8")  # bytea


@settings(max_examples=examples(100))
@given(
    st.lists(
        st.one_of(st.none(), st.text(alphabet=st.characters(exclude_characters="\0"))),
        min_size=1,
        max_size=4,
    )
)
def test_insert_string_constants_round_trip(values: list[str | None]) -> None:
    def constant(value: str | None) -> str:
        return (
            "NULL" if value is None else "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
        )

    text = f"INSERT INTO impsns VALUES ({', '.join(constant(v) for v in values)})"
    insert = statements(text)[0]
    assert isinstance(insert, Insert) and insert.problem is None
    assert [v.text for v in insert.rows[0]] == values


# ---- protocol messages ----------------------------------------------------------------


async def _reader(data: bytes) -> m.MessageReader:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return m.MessageReader(stream)


async def _first(data: bytes) -> m.Message | None:
    return await (await _reader(data)).message()


def test_messages_are_framed_and_decoded() -> None:
    async def read() -> list[m.Message | None]:
        parse_body = b"s1\0SELECT\0" + struct.pack("!hi", 1, 23)
        parse = b"P" + struct.pack("!i", 4 + len(parse_body)) + parse_body
        reader = await _reader(m.query("SELECT 1") + parse)
        return [await reader.message(), await reader.message(), await reader.message()]

    query, parse, end = asyncio.run(read())
    assert query is not None and m.decode_query(query.body, "utf-8") == "SELECT 1"
    assert parse is not None and m.decode_parse(parse.body, "utf-8") == m.Parse(
        "s1", "SELECT", (23,)
    )
    assert end is None
    bind = (
        b"p\0s\0"
        + struct.pack("!hh", 1, 1)
        + struct.pack("!h", 2)
        + struct.pack("!i", 2)
        + b"ab"
        + struct.pack("!i", -1)
        + struct.pack("!h", 0)
    )
    decoded = m.decode_bind(memoryview(bind), "utf-8")
    assert decoded.parameters == (b"ab", None) and decoded.parameter_format(1) == 1
    row = m.data_row(["x", None])
    assert row[:1] == b"D" and struct.unpack("!i", row[1:5])[0] == len(row) - 1
    assert m.decode_fields(memoryview(m.error_response({"C": "42P01", "M": "é"})[5:])) == {
        "C": "42P01",
        "M": "é",
    }


@pytest.mark.parametrize(
    "data",
    [
        b"Q" + struct.pack("!i", 3),  # below the length field itself
        b"Q" + struct.pack("!i", (1 << 30) + 1),  # above 1 GB
        b"Q" + struct.pack("!i", 10) + b"abc",  # cut short
    ],
)
def test_malformed_framing_is_a_protocol_violation(data: bytes) -> None:
    with pytest.raises(m.ProtocolViolation):
        asyncio.run(_first(data))


def test_malformed_bodies_are_protocol_violations() -> None:
    with pytest.raises(m.ProtocolViolation):
        m.decode_parse(memoryview(b"name-without-end"), "utf-8")
    with pytest.raises(m.ProtocolViolation):
        m.decode_bind(memoryview(b"\0\0" + struct.pack("!h", 1)), "utf-8")
    with pytest.raises(m.ProtocolViolation):
        m.decode_target(memoryview(b"X\0"), "utf-8")
    with pytest.raises(m.ProtocolViolation):
        m.startup_parameters(struct.pack("!ii", 13, 3 << 16) + b"user")


def test_row_description_and_data_rows_are_what_psycopg_reads() -> None:
    description = m.row_description([("name", 25), ("n", 20)])
    count = struct.unpack("!h", description[5:7])[0]
    assert count == 2 and b"name\0" in description
    assert struct.unpack("!i", description[-12:-8]) == (20,)  # the last column's type


def test_every_strata_error_has_a_sqlstate() -> None:
    """As every error has an HTTP status (server/api/errors.py), it has a SQLSTATE."""
    import inspect

    from rewriter import errors as sql_errors
    from rewriter.errors import StrataError
    from server import errors as service_errors
    from server.pgwire.errors import SQLSTATE

    kinds = [
        kind
        for module in (sql_errors, service_errors)
        for _, kind in inspect.getmembers(module, inspect.isclass)
        if issubclass(kind, StrataError) and kind is not StrataError
    ]
    assert len(kinds) > 15
    for kind in kinds:
        assert any(k in SQLSTATE for k in kind.__mro__), f"{kind.__name__} has no SQLSTATE"
