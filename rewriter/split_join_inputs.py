"""Pass 3j: subqueries as join inputs, each planned as a stream of its own (Nexmark q5 and
q7 as their project writes them: a windowed aggregate in parentheses joined with its
maximum, or with the stream it aggregates).

``SELECT ... FROM (q1) a JOIN (q2) b ON ...`` (or ``FROM s JOIN (q) b``) makes each
subquery the stream ``<name>__in<k>`` (k: its place among the FROM items, from 1), planned
like any stream - a windowed aggregate in parallel (partials per run), a query over a
further subquery as its own companion (q5's maximum over counts: ``<name>__in2__inner``) -
and the join itself is a view over those streams' views and the other streams' views,
run as written in PostgreSQL on read (approximate aggregates as their exact twins). Every
input view is exact at every instant and one statement reads all of them in one snapshot,
so the join is exact at every instant, whatever the lateness; reading it costs the join of
the inputs' rows. The companions are made and dropped with the stream, in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.build_lookup import build_lookup
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import check_clauses, column_names, named_query, output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import (
    OutputColumn,
    ParallelAggregatePlan,
    RawStreamPlan,
    ReadJoinStreamPlan,
    StreamPlan,
)
from rewriter.registry import exact_in_postgres
from rewriter.tables import TableSchema, table_key

_INSTEAD = (
    "write the input as a subquery over the stream (... JOIN (SELECT ... FROM TUMBLE(s, t, "
    "INTERVAL '...') GROUP BY ...) AS w ON ...) or create it as a stream and join that stream"
)


def has_subquery_inputs(select: exp.Expr) -> bool:
    """A SELECT with joins, one of whose inputs is a subquery (or a UNION) in parentheses."""
    if not isinstance(select, exp.Select) or not select.args.get("joins"):
        return False
    return any(_is_subquery(item) for item in _items(select))


def _is_subquery(item: exp.Expr | None) -> bool:
    return isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select | exp.Union)


def _items(select: exp.Select) -> list[exp.Expr | None]:
    from_ = select.args.get("from_")
    return [from_.this if from_ is not None else None] + [
        j.this for j in select.args.get("joins") or []
    ]


def input_statements(name: str, select: exp.Select) -> list[tuple[str, str]]:
    """(name, CREATE STREAM) of the stream each subquery input becomes, in FROM order."""
    made = []
    for position, item in enumerate(_items(select), start=1):
        if not _is_subquery(item):
            continue
        assert isinstance(item, exp.Subquery)
        companion = naming.join_input_stream(name, position)
        if len(companion) > naming.MAX_STREAM_NAME:
            raise UnsupportedSQL(
                f"a join of subqueries keeps each subquery as a stream, here {companion!r}, "
                f"longer than {naming.MAX_STREAM_NAME} characters: choose a shorter name"
            )
        made.append(
            (companion, f"CREATE STREAM {companion} AS {named_query(item.this).sql('postgres')}")
        )
    return made


def build_join_inputs(
    name: str,
    select: exp.Select,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
) -> ReadJoinStreamPlan | ParallelAggregatePlan:
    input_statements(name, select)  # refuses a companion's name that is too long
    tables = tables or {}
    if any(
        isinstance(item, exp.Table) and table_key(item) in tables and table_key(item) not in streams
        for item in _items(select)
    ):
        # With PostgreSQL tables: the join of streams and tables (build_lookup), each
        # subquery read as its stream (Nexmark q13: a projection joined FOR SYSTEM_TIME AS
        # OF its time with a versioned table).
        with_tables = select.copy()
        for position, item in enumerate(_items(with_tables), start=1):
            if _is_subquery(item):
                assert isinstance(item, exp.Subquery)
                companion = naming.join_input_stream(name, position)
                if companion not in streams:
                    raise UnknownSource(
                        f"the stream {companion!r} that {name!r} joins does not exist (the "
                        "server creates it with the stream)"
                    )
                item.replace(
                    exp.alias_(exp.to_table(companion), item.alias or companion, table=True)
                )
        return build_lookup(name, with_tables, streams, tables)
    view = select.copy()
    joined: list[tuple[str, StreamPlan]] = []  # (alias, stream) per FROM item, in order
    for position, item in enumerate(_items(view), start=1):
        assert item is not None
        alias, plan = _input(name, position, item, streams)
        if any(a == alias for a, _ in joined):
            raise UnsupportedSQL(f"{alias!r} names two inputs of the join; give each its own alias")
        item.replace(exp.alias_(table(plan.name, naming.PUBLIC_SCHEMA), alias, table=True))
        joined.append((alias, plan))
    for join in view.args.get("joins") or []:
        kind = (join.args.get("kind") or "").upper()
        if kind in ("SEMI", "ANTI") or join.args.get("method"):
            raise UnsupportedSQL(
                f"{join.sql('postgres')!r} is not supported: write [LEFT|RIGHT|FULL] JOIN ... ON"
            )
    try:
        check_clauses(view)
    except UnsupportedSQL as refused:
        raise UnsupportedSQL(f"in a join of subqueries: {refused}") from None
    exact = view.transform(exact_in_postgres)
    assert isinstance(exact, exp.Select)
    view = exact
    names = _output_names(view, joined)
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise UnsupportedSQL(
            f"the join selects two columns named {doubled[0]!r}: name one of them with AS"
        )
    sources = tuple(dict.fromkeys(plan.name for _, plan in joined))
    return ReadJoinStreamPlan(
        name=name,
        sources=sources,
        raw_sources=tuple(dict.fromkeys(r for _, plan in joined for r in _raw_sources(plan))),
        columns=tuple(OutputColumn(n, None) for n in names),
        event_time=None,
        tables=(),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _input(
    name: str, position: int, item: exp.Expr, streams: Mapping[str, StreamPlan]
) -> tuple[str, StreamPlan]:
    """(alias, stream) of one FROM item: a subquery's companion stream, or a stream."""
    if _is_subquery(item):
        assert isinstance(item, exp.Subquery)
        companion = naming.join_input_stream(name, position)
        plan = streams.get(companion)
        if plan is None:
            raise UnknownSource(
                f"the stream {companion!r} that {name!r} joins does not exist (the server "
                "creates it with the stream)"
            )
        return item.alias or companion, plan
    if isinstance(item, exp.Table) and isinstance(item.this, exp.Anonymous):
        call = item.this.name.upper()
        raise UnsupportedSQL(
            f"{call}(...) as a join input beside a subquery is not supported: {_INSTEAD}"
        )
    key = table_key(item) if isinstance(item, exp.Table) else None
    if key is None:
        raise UnsupportedSQL(
            f"a join of subqueries reads streams and subqueries, not {item.sql('postgres')!r}"
        )
    if key not in streams:
        raise UnknownSource(
            f"{item.sql('postgres')!r} is not a stream; a join of subqueries joins streams and "
            "subqueries over streams (join a PostgreSQL table in the subquery, or in a stream "
            "of its own)"
        )
    if item.args.get("version") is not None:
        raise UnsupportedSQL("FOR SYSTEM_TIME AS OF reads a table, not a stream")
    return item.alias_or_name, streams[key]


def _output_names(view: exp.Select, joined: list[tuple[str, StreamPlan]]) -> list[str]:
    names: list[str] = []
    for item in view.expressions:
        if isinstance(item, exp.Star):
            names += [c for _, plan in joined for c in column_names(plan)]
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            plan = next((p for a, p in joined if a == item.table), None)
            if plan is None:
                raise UnknownSource(f"{item.table!r} is not an input of the join")
            names += column_names(plan)
        else:
            names.append(output_name(item))
    return names


def _raw_sources(plan: StreamPlan) -> tuple[str, ...]:
    return (plan.name,) if isinstance(plan, RawStreamPlan) else plan.raw_sources
