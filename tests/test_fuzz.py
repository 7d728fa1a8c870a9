"""Fuzzing: the DDL rewriter, the run parsers and the HTTP API never crash on any input.

* ``rewriter.rewrite`` over random text and over mutations of valid statements: a plan or
  a StrataError (which the API turns into a 4xx), nothing else.
* ``parse_run`` over random bytes and over mutations of valid NDJSON and CSV bodies: a table
  of the declared schema or a RunFormatError whose line is a line of the body and whose
  HTTP form is valid JSON; and the fast path (pyarrow) answers as the slow, line-by-line
  reference path does.
* schemathesis over the FastAPI app's /openapi.json, against a real server: no 5xx.

Examples are bounded so that the whole module takes well under a minute.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error

from rewriter import rewrite
from rewriter.errors import StrataError
from rewriter.plan import StreamPlan
from server.errors import RunFormatError
from server.ingest.parse import _parse, arrow_schema
from tests.conftest import Strata

# ------------------------------------------------------------------------ the rewriter

RAW = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), "
    "ok boolean, t timestamptz) WITH (event_time = 't', delay = '30 seconds')"
)
STATEMENTS = [
    RAW,
    "CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "CREATE STREAM hop AS SELECT avg(price) AS a, max(user_id) AS m, window_start "
    "FROM HOP(impsns, t, INTERVAL '1 minute', INTERVAL '5 minutes') "
    "WHERE campaign <> 'x' AND ok GROUP BY window_start HAVING count(*) > 1",
    "CREATE STREAM sugar AS SELECT campaign, count(*) AS c, cq_close(*) "
    "FROM impsns <SLICES '1 minute'> GROUP BY campaign",
    "CREATE STREAM rollup AS SELECT campaign, sum(c) AS c, window_end "
    "FROM TUMBLE(impsn_count, INTERVAL '5 minutes') GROUP BY campaign, window_end",
    "CREATE STREAM top AS SELECT max(c) AS top, window_end "
    "FROM TUMBLE(impsn_count, INTERVAL '5 minutes') GROUP BY window_end",
    "CREATE STREAM picked AS SELECT campaign, price * 2 AS p, t FROM impsns WHERE user_id % 2 = 0",
    "CREATE STREAM f AS SELECT count(*) FILTER (WHERE ok) AS n, "
    "approx_percentile(price, 0.5) AS med, window_end "
    "FROM TUMBLE(impsns, t, INTERVAL '10 seconds') GROUP BY window_end",
]
VOCABULARY = [
    " ",
    "\n",
    "(",
    ")",
    ",",
    ";",
    "'",
    '"',
    "*",
    "-",
    "--",
    "/*",
    "*/",
    "::",
    "=",
    "<",
    ">",
    "0",
    "1",
    "-1",
    "1e309",
    "99999999999999999999",
    "NULL",
    "TRUE",
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "HAVING",
    "AS",
    "AND",
    "OR",
    "NOT",
    "CASE WHEN",
    "END",
    "UNION ALL",
    "JOIN",
    "ORDER BY",
    "LIMIT",
    "DISTINCT",
    "CREATE",
    "STREAM",
    "TABLE",
    "DROP",
    "WITH",
    "INTERVAL",
    "'1 minute'",
    "'0 seconds'",
    "'1 month'",
    "'-5 minutes'",
    "TUMBLE",
    "HOP",
    "<SLICES",
    "<VISIBLE",
    "ADVANCE",
    "window_start",
    "window_end",
    "count(*)",
    "sum(",
    "avg(",
    "max(",
    "min(",
    "count(DISTINCT",
    "impsns",
    "impsn_count",
    "campaign",
    "price",
    "t",
    "numeric(12,4)",
    "numeric(99,2)",
    "text",
    "bigint",
    "timestamptz",
    "event_time",
    "delay",
    "retention",
    "strata_run",
    "pg_class",
    "x" * 70,
    "é",
    "\x00",
    "\\",
    "$1",
    "$$",
    "E'\\n'",
    "[",
    "]",
    "{",
    "}",
    "%",
    "/",
    "||",
]


def _existing() -> dict[str, StreamPlan]:
    streams: dict[str, StreamPlan] = {}
    for statement in STATEMENTS[:2]:
        plan = rewrite(statement, streams)
        streams[plan.name] = plan
    return streams


EXISTING = _existing()


@st.composite
def mutated(draw: st.DrawFn, corpus: list[str], vocabulary: list[str]) -> str:
    """A corpus entry with a few edits: delete, duplicate or replace a span, insert a word."""
    text = draw(st.sampled_from(corpus))
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 12)))
        edit = draw(st.sampled_from(["delete", "duplicate", "replace", "insert"]))
        word = draw(st.sampled_from(vocabulary))
        if edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        elif edit == "replace":
            text = text[:i] + word + text[j:]
        else:
            text = text[:i] + word + text[i:]
    return text


def _plan_or_strata_error(sql: str) -> None:
    try:
        plan = rewrite(sql, EXISTING)
    except StrataError as err:
        assert str(err)
        json.dumps({"error": str(err)}).encode()
        return
    assert plan.name and plan.create_statements


_rewriter_settings = settings(
    max_examples=int(os.environ.get("STRATA_FUZZ_EXAMPLES", 300)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@_rewriter_settings
@given(sql=mutated(STATEMENTS, VOCABULARY))
def test_rewriter_on_mutated_statements(sql: str) -> None:
    _plan_or_strata_error(sql)


@_rewriter_settings
@given(
    sql=st.one_of(
        st.text(max_size=200),
        st.lists(st.sampled_from(VOCABULARY), max_size=40).map(" ".join),
        st.lists(st.sampled_from(VOCABULARY), max_size=30).map(
            lambda words: "CREATE STREAM s AS SELECT " + " ".join(words)
        ),
    )
)
def test_rewriter_on_random_text(sql: str) -> None:
    _plan_or_strata_error(sql)


# --------------------------------------------------------------------- the run parsers


EVERY = (
    "CREATE STREAM every (s text, i smallint, b bigint, n numeric(6,2), wide numeric, "
    "r real, d double precision, ok boolean, day date, local timestamp, t timestamptz) "
    "WITH (event_time = 't')"
)
EVERY_AGGREGATES = (
    "CREATE STREAM every_agg AS SELECT s, ok, count(*) AS c, sum(n) AS sn, sum(b) AS sb, "
    "avg(wide) AS aw, min(day) AS d, max(local) AS l, sum(r) AS sr, stddev(d) AS sd, "
    "count(DISTINCT i) AS di, window_end "
    "FROM HOP(every, t, INTERVAL '1 minute', INTERVAL '2 minutes') GROUP BY s, ok, window_end"
)


def _columns() -> tuple:  # type: ignore[type-arg]
    plan = rewrite(
        EVERY,
        {},
    )
    return plan.columns  # type: ignore[union-attr]


COLUMNS = _columns()
SCHEMA = arrow_schema(COLUMNS)
NDJSON_BODIES = [
    '{"s": "a", "i": 1, "b": -2, "n": 1.25, "wide": 1e3, "r": 0.5, "d": -1.5e-3, "ok": true, '
    '"day": "2024-02-29", "local": "2024-01-01 12:00", "t": "2024-01-01T00:00:00Z"}\n'
    '{"s": null, "i": "7", "n": "-0.005", "ok": false, "t": "2024-01-01T00:00:00.123456+05:30"}\n',
    '\ufeff{"t": "0001-01-01T00:00:00Z", "s": "\\u00e9\\n\\""}\r\n\r\n'
    '{"t": "9999-12-31T23:59:59Z", "b": 9223372036854775807}\r\n',
]
CSV_BODIES = [
    "s,i,b,n,wide,r,d,ok,day,local,t\n"
    "a,1,-2,1.25,1e3,0.5,-1.5e-3,t,2024-02-29,2024-01-01 12:00,2024-01-01T00:00:00Z\n"
    '"q,""x""\nline",,,,,,,,,,2024-01-01T00:00:00+01\n',
    't,s,ok\r\n2024-01-01T00:00:00Z,,YES\r\n2024-01-01 00:00:00Z,"",off\r\n',
]
BYTES_VOCABULARY = [
    b'"',
    b",",
    b"\n",
    b"\r",
    b"\r\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"0",
    b"9" * 30,
    b"-",
    b"+",
    b".",
    b"e",
    b"e999",
    b"NaN",
    b"Infinity",
    b"null",
    b"true",
    b"T",
    b"Z",
    b"+24:00",
    b" ",
    b"\t",
    b'"t": ',
    b'"x": 1, ',
    b"2024-13-01",
    b"0000-01-01",
    b"10000-01-01",
]


def _mutated_bytes(corpus: list[str]) -> st.SearchStrategy[bytes]:
    return mutated(
        [c.encode("utf-8") for c in corpus],  # type: ignore[arg-type]
        BYTES_VOCABULARY,  # type: ignore[arg-type]
    )


def _outcome(body: bytes, content_type: str, mode: str) -> pa.Table | RunFormatError:
    try:
        return _parse(body, content_type, COLUMNS, "t", mode=mode)
    except RunFormatError as err:
        return err


def _check_parse(body: bytes, content_type: str) -> None:
    found = _outcome(body, content_type, "auto")
    reference = _outcome(body, content_type, "slow")
    if isinstance(found, RunFormatError):
        physical = body.count(b"\n") + 1 + (body.count(b"\r") - body.count(b"\r\n"))
        assert found.line is None or 1 <= found.line <= physical, (found, physical)
        json.dumps(found.to_dict()).encode("utf-8")  # what the API sends must be sendable
        assert isinstance(reference, RunFormatError), (found, reference)
        assert str(found) == str(reference)
    else:
        assert found.schema == SCHEMA
        assert isinstance(reference, pa.Table), reference
        assert found.equals(reference), (found.to_pylist(), reference.to_pylist())


_parser_settings = settings(
    max_examples=int(os.environ.get("STRATA_FUZZ_EXAMPLES", 250)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_parser_settings
@given(body=_mutated_bytes(NDJSON_BODIES))
def test_ndjson_parser_on_mutated_bodies(body: bytes) -> None:
    _check_parse(body, "application/x-ndjson")


@_parser_settings
@given(body=_mutated_bytes(CSV_BODIES))
def test_csv_parser_on_mutated_bodies(body: bytes) -> None:
    _check_parse(body, "text/csv")


@_parser_settings
@given(body=st.binary(max_size=300), csv=st.booleans())
def test_parsers_on_random_bytes(body: bytes, csv: bool) -> None:
    _check_parse(body, "text/csv" if csv else "application/x-ndjson")


# ------------------------------------------------------------------ the HTTP API (schemathesis)

# The runs endpoint takes NDJSON and CSV bodies, which schemathesis sends as text.
schemathesis.serializer.alias(["application/x-ndjson"], "text/plain")


API_EXAMPLES = int(os.environ.get("STRATA_FUZZ_API_EXAMPLES", 20))


def test_api_never_answers_a_server_error(module_strata: Strata, subtests: pytest.Subtests) -> None:
    """Every operation of /openapi.json, with inputs that follow its schema and inputs
    that do not: never a 5xx (the runs endpoint gets random NDJSON and CSV text)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", module_strata.client.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            with subtests.test(operation=operation.label, mode=mode.value):

                @settings(
                    max_examples=API_EXAMPLES,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def call(case: schemathesis.Case) -> None:
                    response = case.call()
                    case.validate_response(response, checks=[not_a_server_error])

                try:
                    call()
                except Unsatisfiable:  # nothing to get wrong: no parameters, no body
                    assert mode is schemathesis.GenerationMode.NEGATIVE


# ------------------------------------------- runs and DDL through the server, end to end


@pytest.fixture(scope="module")
def every(module_strata: Strata) -> Strata:
    names = ("every", "every_agg", "impsns", "impsn_count")
    for name, statement in zip(names, (EVERY, EVERY_AGGREGATES, *STATEMENTS[:2]), strict=True):
        if module_strata.client.get(f"/streams/{name}").status_code == 404:
            module_strata.create(statement)  # (the API fuzz may have created it from the example)
    return module_strata


def test_runs_through_the_server(every: Strata) -> None:
    """Mutated runs through HTTP: 202 or 400, never a 5xx; every run accepted then commits
    (the parser accepts nothing that Spark or PostgreSQL would refuse), and the derived
    stream counts exactly the archived rows."""
    accepted: list[str] = []

    @settings(
        max_examples=int(os.environ.get("STRATA_FUZZ_EXAMPLES", 40)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=st.one_of(_mutated_bytes(NDJSON_BODIES), _mutated_bytes(CSV_BODIES)))
    def post(body: bytes) -> None:
        csv = not body.lstrip(b"\xef\xbb\xbf").startswith(b"{")
        response = every.post_run("every", body, csv=csv, wait=False)
        assert response.status_code in (202, 400), response.text
        if response.status_code == 202:
            accepted.append(response.json()["run_id"])
        else:
            assert response.json()["line"] is not None or "Content-Type" in response.text

    post()
    assert accepted
    for run_id in accepted:
        record = every.service.wait(every.service.run(run_id), 120)  # type: ignore[arg-type]
        assert record.status == "committed", record
    # Every row of each (pane, group) is in two HOP windows.
    assert every.query("SELECT sum(c) FROM every_agg") == every.query(
        "SELECT 2 * count(*) FROM every"
    )


def test_ddl_through_the_server(every: Strata) -> None:
    """Mutated CREATE STREAM statements through HTTP, PostgreSQL DDL included: 201 or a
    4xx, never a 5xx; what was created can be dropped."""

    @settings(
        max_examples=int(os.environ.get("STRATA_FUZZ_EXAMPLES", 40)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(sql=mutated(STATEMENTS[2:], VOCABULARY))
    def create(sql: str) -> None:
        response = every.client.post("/streams", json={"sql": sql})
        assert response.status_code in (201, 400, 409), (sql, response.text)
        if response.status_code == 201:
            name = response.json()["name"]
            assert every.client.delete(f"/streams/{name}").status_code == 200

    create()
