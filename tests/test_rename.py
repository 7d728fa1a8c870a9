"""The rewriter's parts of ALTER STREAM: its text, streams renamed in a statement, the
relations a plan creates, and which archived partial rows answer a new definition."""

from __future__ import annotations

import pytest

from rewriter import naming, rewrite
from rewriter.errors import InvalidSQL
from rewriter.plan import ParallelAggregatePlan, StreamPlan
from rewriter.rename import alter_as_create, created_relations, rename_streams, replaced_views
from rewriter.reuse_partials import reusable_columns

RAW = "CREATE STREAM ev (k text, v bigint, w bigint, t timestamptz) WITH (event_time = 't')"
MINUTE = "FROM TUMBLE(ev, t, INTERVAL '1 minute')"


def _plans(*statements: str) -> dict[str, StreamPlan]:
    plans: dict[str, StreamPlan] = {}
    for statement in (RAW, *statements):
        plan = rewrite(statement, plans)
        plans[plan.name] = plan
    return plans


def _aggregate(query: str) -> ParallelAggregatePlan:
    plan = rewrite(f"CREATE STREAM m AS {query}", _plans())
    assert isinstance(plan, ParallelAggregatePlan)
    return plan


def test_alter_stands_for_a_create() -> None:
    assert alter_as_create("alter stream m AS SELECT 1") == "CREATE stream m AS SELECT 1"
    with pytest.raises(InvalidSQL, match="new query"):
        alter_as_create("ALTER STREAM m ADD COLUMN x int")
    with pytest.raises(InvalidSQL, match="ALTER STREAM"):
        alter_as_create("ALTER TABLE m AS SELECT 1")


@pytest.mark.parametrize(
    ("statement", "renamed"),
    [
        (
            "CREATE STREAM h AS SELECT window_start, sum(c) AS c FROM TUMBLE(m, window_start, "
            "INTERVAL '1 hour') GROUP BY window_start",
            "CREATE STREAM h__next AS SELECT window_start, sum(c) AS c FROM TUMBLE(m__next, "
            "window_start, INTERVAL '1 hour') GROUP BY window_start",
        ),
        (  # a qualified column follows its stream; a quoted name is a name
            'CREATE STREAM h AS SELECT m.k, m.c FROM "m" WHERE m.c > 1',
            "CREATE STREAM h__next AS SELECT m__next.k, m__next.c FROM m__next WHERE m__next.c > 1",
        ),
        (  # a column named like a stream, and a schema-qualified table, stay
            "CREATE STREAM h AS SELECT x.m, p.k FROM x JOIN public.m p ON x.m = p.k",
            "CREATE STREAM h__next AS SELECT x.m, p.k FROM x JOIN public.m p ON x.m = p.k",
        ),
        (
            "CREATE STREAM h AS SELECT k, count(*) AS n, window_start FROM SESSION(m, t, "
            "INTERVAL '5 minutes') GROUP BY k, window_start",
            "CREATE STREAM h__next AS SELECT k, count(*) AS n, window_start FROM "
            "SESSION(m__next, t, INTERVAL '5 minutes') GROUP BY k, window_start",
        ),
        (  # in WITH: read as a subquery, and read by a window call (a stream made with h)
            "CREATE STREAM h AS WITH d AS (SELECT k, c, t FROM m WHERE c > 1), e AS (SELECT k "
            "FROM m) SELECT k, count(*) AS n, window_start FROM TUMBLE(d, t, INTERVAL '1 hour') "
            "WHERE k IN ('a') GROUP BY k, window_start",
            "CREATE STREAM h__next AS WITH d AS (SELECT k, c, t FROM m__next WHERE c > 1), e AS "
            "(SELECT k FROM m) SELECT k, count(*) AS n, window_start FROM TUMBLE(d, t, INTERVAL "
            "'1 hour') WHERE k IN ('a') GROUP BY k, window_start",
        ),
        (
            "CREATE STREAM h AS WITH d AS (SELECT k, c FROM m WHERE c > 1) SELECT d.k FROM d",
            "CREATE STREAM h__next AS WITH d AS (SELECT k, c FROM m__next WHERE c > 1) SELECT "
            "d.k FROM d",
        ),
    ],
)
def test_streams_are_renamed_where_named(statement: str, renamed: str) -> None:
    assert rename_streams(statement, {"m": "m__next", "h": "h__next"}) == renamed


def test_relations_pair_up_between_two_names() -> None:
    query = f"SELECT window_start, k, count(*) AS c {MINUTE} GROUP BY window_start, k"
    plans = _plans()
    old = rewrite(f"CREATE STREAM m AS {query}", plans)
    new = rewrite(f"CREATE STREAM m__next AS {query}", plans)
    before, after = created_relations(old), created_relations(new)
    assert [(r.kind, r.name) for r in before][:2] == [
        ("TABLE", "m__partial"),
        ("INDEX", "m__partial_window"),
    ]
    assert [r.kind for r in before] == [r.kind for r in after]
    assert [r.name.replace("m__next", "m") for r in after] == [r.name for r in before]
    assert before[-1].kind == "VIEW" and before[-1].schema == "public"
    function, view = replaced_views(old)  # the function the view calls, before it
    assert function.startswith(
        f'CREATE OR REPLACE FUNCTION "strata_internal"."{naming.waiting_windows_function("m")}"'
    )
    assert view.startswith('CREATE OR REPLACE VIEW "public"."m"')


def test_partial_rows_answer_a_narrower_or_rearranged_query() -> None:
    old = _aggregate(
        f"SELECT window_start, k, count(*) AS c, sum(v) AS s, count(v) AS n {MINUTE} "
        "GROUP BY window_start, k"
    )
    dropped = _aggregate(
        f"SELECT window_start, k AS key, sum(v) AS s {MINUTE} GROUP BY window_start, k"
    )
    assert reusable_columns(old, dropped) == {
        "strata_run": "strata_run",
        "window_start": "window_start",
        "key_0": "key_0",
        "agg_0_sum": "agg_1_sum",
    }
    averaged = _aggregate(
        f"SELECT window_start, k, avg(v) AS a {MINUTE} GROUP BY window_start, k HAVING count(*) > 1"
    )
    columns = reusable_columns(old, averaged)
    assert columns is not None and set(columns.values()) >= {"agg_1_sum", "agg_2_count"}


@pytest.mark.parametrize(
    "query",
    [
        f"SELECT window_start, k, count(*) AS c {MINUTE} WHERE v > 0 GROUP BY window_start, k",
        f"SELECT window_start, count(*) AS c {MINUTE} GROUP BY window_start",
        f"SELECT window_start, k, max(v) AS c {MINUTE} GROUP BY window_start, k",
        f"SELECT window_start, k, avg(w) AS c {MINUTE} GROUP BY window_start, k",
        "SELECT window_start, k, count(*) AS c FROM TUMBLE(ev, t, INTERVAL '2 minutes') "
        "GROUP BY window_start, k",
    ],
)
def test_other_changes_need_the_history(query: str) -> None:
    old = _aggregate(
        f"SELECT window_start, k, count(*) AS c, sum(v) AS s, count(v) AS n {MINUTE} "
        "GROUP BY window_start, k"
    )
    assert reusable_columns(old, _aggregate(query)) is None
