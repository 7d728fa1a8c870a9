"""The user's SQL functions in streams (rewriter.inline_functions): the pass's golden
inlinings (tests/fixtures/inline_functions.sql), its refusals by name, and, with a server,
functions created in PostgreSQL (through the SQL port) and called by streams, whose views
equal PostgreSQL's own calls of the function over the raw rows under late runs."""

from __future__ import annotations

import itertools
import os
import random
import re
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewriter import rewrite
from rewriter.errors import StrataError, UnsupportedSQL
from rewriter.inline_functions import inline_functions
from rewriter.plan import StreamPlan
from rewriter.sql_functions import SqlFunction, referenced_functions
from server.catalog import PlanCache
from server.workers.swapper import Swapper
from tests.conftest import Strata, examples
from tests.oracle import (
    START,
    SnapshotReader,
    at,
    execute,
    late_runs,
    ndjson,
    same,
    with_a_late_run,
)

FIXTURE = Path(__file__).parent / "fixtures" / "inline_functions.sql"
BID = (
    "CREATE STREAM bid (auction bigint, price numeric(12,2), extra text, t timestamptz) "
    "WITH (event_time = 't')"
)


def _sql(
    name: str,
    body: str,
    arguments: tuple[tuple[str, str], ...] = (("s", "text"),),
    result: str = "bigint",
    *,
    language: str = "sql",
    volatility: str = "immutable",
    returns_set: bool = False,
) -> SqlFunction:
    return SqlFunction(name, arguments, result, language, volatility, returns_set, body)


# As pg_proc describes them (a RETURN body as pg_get_function_sqlbody prints it).
FUNCTIONS = {
    f.name: f
    for f in (
        _sql(
            "count_char",
            "RETURN (length(s) - length(replace(s, c, ''::text)))",
            (("s", "text"), ("c", "text")),
        ),
        _sql("twice", "SELECT $1 * 2", (("", "numeric"),), "numeric"),
        _sql("shout", "RETURN (upper(s) || '!'::text)", result="text"),
        _sql("loud_count", "RETURN count_char(shout(s), '!'::text)"),
        _sql("qualified", "RETURN length(qualified.s)"),
        _sql("atomic", "BEGIN ATOMIC\n SELECT (x + 1);\nEND", (("x", "numeric"),), "numeric"),
    )
}


def _cases() -> list[tuple[str, str]]:
    return re.findall(
        r"^-- case\n(.*?)\n-- inlined\n(.*?)(?=^-- case|\Z)", FIXTURE.read_text(), re.M | re.S
    )


def test_golden_inlinings() -> None:
    """Each call is its body, arguments cast to the parameters' types and parenthesised, the
    whole cast to the result type; functions the body calls are inlined too; a call the
    table does not hold stays; the caller's tree is not changed."""
    text = FIXTURE.read_text()
    cases = _cases()
    assert len(cases) >= 5
    for select, expected in cases:
        tree = sqlglot.parse_one(select, read="postgres")
        assert isinstance(tree, sqlglot.exp.Select)
        before = tree.sql("postgres")
        inlined = inline_functions(tree, FUNCTIONS).sql("postgres")
        assert tree.sql("postgres") == before
        if os.environ.get("STRATA_UPDATE_GOLDENS"):
            text = text.replace(
                f"{select}\n-- inlined\n{expected}", f"{select}\n-- inlined\n{inlined}\n", 1
            )
            continue
        assert inlined == expected.strip(), select
    if os.environ.get("STRATA_UPDATE_GOLDENS"):
        FIXTURE.write_text(text)


def _streams() -> dict[str, StreamPlan]:
    return {"bid": rewrite(BID, {})}


def test_a_stream_names_the_calls_the_server_looks_up() -> None:
    assert referenced_functions(
        "CREATE STREAM s AS SELECT count_char(extra, 'c') AS n, upper(extra) AS u, "
        "to_char(t AT TIME ZONE 'UTC', 'HH24') AS h, window_end "
        "FROM TUMBLE(bid, t, INTERVAL '1 hour') GROUP BY 1, 2, 3, window_end"
    ) == ["count_char"]


# (the functions besides FUNCTIONS, the call, a fragment of the refusal)
REFUSALS = {
    "plpgsql": (
        [_sql("f", "BEGIN RETURN 1; END", language="plpgsql")],
        "f(extra)",
        "f() is a plpgsql function: Strata inlines functions of LANGUAGE sql",
    ),
    "several statements": (
        [_sql("f", "SELECT 1; SELECT length(s)")],
        "f(extra)",
        "the body of f() is 2 statements",
    ),
    "a FROM": (
        [_sql("f", "SELECT count(*) FROM bid")],
        "f(extra)",
        "the body of f() is a query (FROM), not one expression",
    ),
    "a subquery": (
        [_sql("f", "RETURN (SELECT 1)")],
        "f(extra)",
        "the body of f() holds a subquery",
    ),
    "declared volatile": (
        [_sql("f", "RETURN length(s)", volatility="volatile")],
        "f(extra)",
        "f() is VOLATILE",
    ),
    "random()": (
        [_sql("f", "RETURN (length(s) + random())", result="double precision")],
        "f(extra)",
        "the body of f() calls random()",
    ),
    "now()": (
        [_sql("f", "RETURN now()", result="timestamptz", volatility="stable")],
        "f(extra)",
        "the body of f() calls now()",
    ),
    "set-returning": (
        [_sql("f", "SELECT length(s)", returns_set=True)],
        "f(extra)",
        "f() returns a set",
    ),
    "recursion": (
        [_sql("f", "RETURN f(s)")],
        "f(extra)",
        "f() calls itself: Strata inlines",
    ),
    "mutual recursion": (
        [_sql("f", "RETURN g(s)"), _sql("g", "RETURN f(s)")],
        "f(extra)",
        "f() calls itself through g()",
    ),
    "a polymorphic argument": (
        [_sql("f", "RETURN 1", (("x", "anyelement"),))],
        "f(extra)",
        "polymorphic type anyelement",
    ),
    "a column that is no argument": (
        [_sql("f", "RETURN length(extra)")],
        "f(extra)",
        "the body of f() names extra, which is none of its arguments",
    ),
    "the wrong number of arguments": ([], "count_char(extra)", "count_char() takes 2 arguments"),
    "a body Strata does not translate": (
        [_sql("f", "RETURN (x / 3)", (("x", "numeric"),), "numeric")],
        "f(price)",
        "division of numeric values",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_name_the_function_and_what_to_write(case: str) -> None:
    more, call, fragment = REFUSALS[case]
    functions = {**FUNCTIONS, **{f.name: f for f in more}}
    statement = f"CREATE STREAM s AS SELECT auction,\n  {call} AS v FROM bid"
    with pytest.raises(StrataError) as caught:
        rewrite(statement, _streams(), functions=functions)
    assert fragment in str(caught.value), str(caught.value)
    if case != "a body Strata does not translate":  # a projection's own refusals name none
        assert caught.value.position == (2, 3), "the error points at the call"


def test_flinks_java_function_is_refused_with_the_sql_function_to_write() -> None:
    with pytest.raises(UnsupportedSQL) as caught:
        rewrite("CREATE FUNCTION count_char AS 'com.github.nexmark.flink.udf.CountChar'", {})
    message = str(caught.value)
    assert "count_char AS '...' loads a Java class" in message
    assert "LANGUAGE sql IMMUTABLE RETURN" in message


# -- With a server ---------------------------------------------------------------------------

_names = itertools.count()
COUNT_CHAR = (
    "CREATE FUNCTION {f}(s text, c text) RETURNS bigint LANGUAGE sql IMMUTABLE "
    "RETURN length(s) - length(replace(s, c, ''))"
)
# A function of the other spelling (AS $$ SELECT ... $$), over a number and a function.
SCALED = (
    "CREATE FUNCTION {g}(x numeric, s text) RETURNS numeric LANGUAGE sql IMMUTABLE "
    "AS $$ SELECT $1 * 2 + {f}(s, 'a') $$"
)


def _functions(strata: Strata) -> tuple[str, str]:
    n = next(_names)
    f, g = f"count_char_{n}", f"scaled_{n}"
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:  # the SQL port
        connection.execute(COUNT_CHAR.format(f=f))  # type: ignore[arg-type]
        connection.execute(SCALED.format(f=f, g=g))  # type: ignore[arg-type]
    return f, g


def test_a_function_made_through_the_sql_port_is_taken_when_the_stream_is_created(
    strata: Strata,
) -> None:
    """The body is the one of CREATE STREAM's time: replacing the function later changes
    neither the view nor the plan the catalog gives at a start, an ALTER STREAM takes it
    anew; a plpgsql function, an overloaded name and Flink's Java class are refused by name
    over HTTP and through the SQL port."""
    f, g = _functions(strata)
    strata.create(BID)
    strata.create(f"CREATE STREAM letters AS SELECT auction, {f}(extra, 'c') AS n FROM bid")
    strata.ingest("bid", ndjson([{"auction": 1, "price": 1, "extra": "cacc", "t": at(1)}]))
    execute(
        strata,
        f"CREATE OR REPLACE FUNCTION {f}(s text, c text) RETURNS bigint LANGUAGE sql "
        "IMMUTABLE RETURN 0",
    )
    with psycopg.connect(strata.database_url) as connection:
        assert connection.execute("SELECT n FROM letters").fetchall() == [(3,)]
    with strata.service.engine.connect() as connection:
        at_start = PlanCache().load(connection)["letters"].plan  # as a start plans it
        running = strata.service.plans.load(connection)["letters"].plan
    assert at_start == running
    assert "REPLACE(" in running.create_statements[0]  # type: ignore[attr-defined]
    # ALTER STREAM reads the functions anew (and its swap keeps them with the stream).
    altered = f"ALTER STREAM letters AS SELECT auction, {f}(extra, 'c') + 1 AS n FROM bid"
    assert strata.client.post("/streams", json={"sql": altered}).status_code in (200, 202)
    Swapper(strata.service.engine, strata.service.plans).run_once()
    with psycopg.connect(strata.database_url) as connection:
        assert connection.execute("SELECT n FROM letters").fetchall() == [(1,)]
    with strata.service.engine.connect() as connection:
        assert (
            PlanCache().load(connection)["letters"].plan
            == strata.service.plans.load(connection)["letters"].plan
        )
    execute(
        strata,
        "CREATE FUNCTION loose(s text) RETURNS bigint LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN length(s); END $$",
    )
    refused = strata.client.post(
        "/streams", json={"sql": "CREATE STREAM l AS SELECT loose(extra) AS n FROM bid"}
    )
    assert refused.status_code == 400
    assert "loose() is a plpgsql function" in refused.json()["error"]
    execute(strata, "CREATE FUNCTION twin(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE RETURN x")
    execute(strata, "CREATE FUNCTION twin(x text) RETURNS text LANGUAGE sql IMMUTABLE RETURN x")
    refused = strata.client.post(
        "/streams", json={"sql": "CREATE STREAM o AS SELECT twin(auction) AS n FROM bid"}
    )
    assert "twin() has 2 definitions in PostgreSQL (overloads)" in refused.json()["error"]
    java = pytest.raises(psycopg.errors.FeatureNotSupported, match="loads a Java class")
    with psycopg.connect(strata.psql_url, autocommit=True) as connection, java:
        connection.execute("CREATE FUNCTION count_char AS 'com.example.CountChar'")


@st.composite
def bid_runs(draw: st.DrawFn) -> list[list[dict[str, object]]]:
    """Two to six runs of bids over a day, an extra that is NULL sometimes."""
    rows = draw(
        st.lists(
            st.tuples(
                st.integers(0, 3),
                st.integers(0, 500),
                st.one_of(st.none(), st.text("abc!", max_size=6)),
                st.integers(0, 24 * 60),
            ),
            min_size=2,
            max_size=30,
        )
    )
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
    runs, k = [], 0
    for size in itertools.cycle(sizes):
        if k >= len(rows):
            break
        runs.append(
            [
                {"auction": a, "price": p, "extra": e, "t": at(m * 60)}
                for a, p, e, m in rows[k : k + size]
            ]
        )
        k += size
    if len(runs) < 2:
        runs = [runs[0][:1], runs[0][1:]]
    if len({r["t"] for run in runs for r in run}) < 2:
        runs[-1][0] = {**runs[-1][0], "t": (START + timedelta(hours=30)).isoformat()}
    return [r for r in runs if r]


def _calling_streams(strata: Strata, prefix: str) -> tuple[str, dict[str, str]]:
    """A raw stream of bids, a window aggregate and a projection over it calling the user's
    functions (one calling the other, ``extra`` NULL sometimes, an expression as argument);
    the raw stream's name, and each view's query with PostgreSQL's own calls of the
    functions over the raw rows (its oracle)."""
    f, g = _functions(strata)
    n = next(_names)
    raw, agg, rows = f"{prefix}bid_{n}", f"{prefix}agg_{n}", f"{prefix}rows_{n}"
    strata.create(BID.replace("STREAM bid", f"STREAM {raw}"))
    strata.create(
        f"CREATE STREAM {agg} AS SELECT {f}(extra, 'b') AS b_count, count(*) AS n, "
        f"sum({g}(price - 1, extra)) AS scaled, max({f}(extra, 'a')) AS most_a, window_end "
        f"FROM TUMBLE({raw}, t, INTERVAL '1 hour') GROUP BY {f}(extra, 'b'), window_end"
    )
    strata.create(
        f"CREATE STREAM {rows} AS SELECT auction, {f}(extra, 'c'), {g}(price - 1, extra) AS s, t "
        f"FROM {raw}"
    )
    window = "date_bin('1 hour', t, timestamptz 'epoch') + interval '1 hour'"
    return raw, {
        f"SELECT b_count, n, scaled, most_a, window_end FROM {agg}": (
            f"SELECT {f}(extra, 'b'), count(*), sum({g}(price - 1, extra)), "
            f"max({f}(extra, 'a')), {window} FROM {raw} GROUP BY {f}(extra, 'b'), {window}"
        ),
        f"SELECT auction, {f}, s, t FROM {rows}": (
            f"SELECT auction, {f}(extra, 'c'), {g}(price - 1, extra), t FROM {raw}"
        ),
    }


@given(runs=bid_runs(), order=st.randoms(use_true_random=False))
@settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_views_calling_a_function_equal_postgresqls_calls_of_it(
    module_strata: Strata, runs: list[list[dict[str, object]]], order
) -> None:
    """Hypothesis: runs in shuffled order, one at least hours late: a window aggregate and
    a projection calling the user's functions (one calling the other, an argument NULL
    sometimes) equal plain PostgreSQL calling the real functions over the raw rows."""
    strata = module_strata
    raw, oracles = _calling_streams(strata, "f")
    order.shuffle(runs)
    runs = with_a_late_run(runs, lambda row: row["t"])
    for run in runs:
        strata.ingest(raw, ndjson(run))
    assert late_runs(strata, raw) > 0
    for view, oracle in oracles.items():
        same(strata, view, oracle)


def test_a_reader_sees_every_snapshot_exact_while_runs_commit(module_strata: Strata) -> None:
    """A reader comparing, in one snapshot after another, the views calling the user's
    functions with PostgreSQL's own calls of them over the raw rows, while 30 runs (a
    third of them hours late) are posted without waiting and commit."""
    strata = module_strata
    raw, oracles = _calling_streams(strata, "s")
    rng = random.Random(14)
    with SnapshotReader.of(strata.database_url, oracles, min_snapshots=5):
        posted = []
        for i in range(30):
            hours = 30 - (10 if i % 3 == 2 else 0)  # every third run hours behind the others
            body = ndjson(
                [
                    {
                        "auction": rng.randrange(4),
                        "price": rng.randrange(500),
                        "extra": rng.choice([None, "", "bb", "abcb", "ba!"]),
                        "t": at(i * 60 + (hours * 3600) + rng.randrange(600)),
                    }
                    for _ in range(rng.randrange(1, 8))
                ]
            )
            response = strata.post_run(raw, body, wait=False, run_id=f"{raw}-{i}")
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])
        for run_id in posted:
            strata.service.wait(strata.service.run(run_id), 120)  # type: ignore[arg-type]
    assert late_runs(strata, raw) > 0
    for view, oracle in oracles.items():
        same(strata, view, oracle)
