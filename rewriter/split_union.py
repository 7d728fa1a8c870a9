"""Pass 3k: a UNION ALL whose branches aggregate (and so a query grouped by GROUPING SETS,
ROLLUP or CUBE, a branch per grouping set: rewriter.grouping_sets), each branch planned as
a stream of its own.

``q1 UNION ALL q2 ...`` makes each branch the stream ``<name>__union<k>`` (k: its place,
from 1), planned like any stream (a windowed aggregate in parallel: partials per run), and
the stream itself a view of the UNION ALL of those streams' views. Every branch's view is
exact at every instant and one statement reads them all in one snapshot, so the union is
exact at every instant, whatever the lateness; reading it costs reading the branches. The
companions are made and dropped with the stream, in the same transaction. A UNION ALL of
plain projections stays one projection stream (rewriter.build_projection).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.build_projection import is_projection
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import column_names, named_query
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import OutputColumn, RawStreamPlan, ReadUnionStreamPlan, StreamPlan


def is_union_of_streams(query: exp.Expr) -> bool:
    """A UNION ALL with a branch that is not a plain projection of one stream's rows (an
    aggregate, a window call, a join)."""
    return isinstance(query, exp.Union) and not all(
        is_projection(b) and not b.args.get("joins") for b in _branches(query)
    )


def _branches(query: exp.Expr) -> list[exp.Expr]:
    if isinstance(query, exp.Union) and not query.args.get("distinct"):
        return _branches(query.this) + _branches(query.expression)
    while isinstance(query, exp.Subquery) and not query.alias:
        query = query.this
    if isinstance(query, exp.Union):  # UNION (distinct), refused by name where it is planned
        raise UnsupportedSQL(
            "UNION removes duplicates, which runs processed apart cannot; use UNION ALL"
        )
    return [query]


def union_statements(name: str, union: exp.Union) -> list[tuple[str, str]]:
    """(name, CREATE STREAM) of the stream each branch becomes, in order; every branch's
    columns named as the first branch's (a union's columns are its first branch's)."""
    branches = _branches(union)
    first = named_query(branches[0])
    names = [i.alias_or_name for i in first.expressions] if isinstance(first, exp.Select) else []
    made = []
    for position, branch in enumerate(branches, start=1):
        companion = naming.union_stream(name, position)
        if len(companion) > naming.MAX_STREAM_NAME:
            raise UnsupportedSQL(
                f"a union of aggregates keeps each branch as a stream, here {companion!r}, "
                f"longer than {naming.MAX_STREAM_NAME} characters: choose a shorter name"
            )
        query = first if position == 1 else _named_as(branch, names, position)
        made.append((companion, f"CREATE STREAM {companion} AS {query.sql('postgres')}"))
    return made


def _named_as(branch: exp.Expr, names: list[str], position: int) -> exp.Expr:
    if not isinstance(branch, exp.Select) or any(
        isinstance(i, exp.Star) or (isinstance(i, exp.Column) and i.is_star)
        for i in branch.expressions
    ):
        return named_query(branch)
    if len(branch.expressions) != len(names):
        raise UnsupportedSQL(
            f"each branch of UNION ALL selects as many columns: branch {position} selects "
            f"{len(branch.expressions)}, the first {len(names)}"
        )
    named = branch.copy()
    named.set(
        "expressions",
        [
            exp.alias_(i.this if isinstance(i, exp.Alias) else i, n, quoted=True)
            for i, n in zip(named.expressions, names, strict=True)
        ],
    )
    return named


def build_union(
    name: str, union: exp.Union, streams: Mapping[str, StreamPlan]
) -> ReadUnionStreamPlan:
    branches: list[StreamPlan] = []
    for companion, _ in union_statements(name, union):
        plan = streams.get(companion)
        if plan is None:
            raise UnknownSource(
                f"the stream {companion!r} that {name!r} reads does not exist (the server "
                "creates it with the stream)"
            )
        branches.append(plan)
    names = column_names(branches[0])
    for position, plan in enumerate(branches[1:], start=2):
        if len(column_names(plan)) != len(names):
            raise UnsupportedSQL(
                f"each branch of UNION ALL selects as many columns: branch {position} "
                f"selects {len(column_names(plan))}, the first {len(names)}"
            )
    selects = [
        exp.select(*(exp.column(c, quoted=True) for c in column_names(plan))).from_(
            table(plan.name, naming.PUBLIC_SCHEMA)
        )
        for plan in branches
    ]
    view: exp.Expr = selects[0]
    for select in selects[1:]:
        view = exp.union(view, select, distinct=False)
    assert isinstance(view, exp.Union)
    return ReadUnionStreamPlan(
        name=name,
        sources=tuple(p.name for p in branches),
        raw_sources=tuple(dict.fromkeys(r for p in branches for r in _raw_sources(p))),
        columns=tuple(OutputColumn(n, None) for n in names),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _raw_sources(plan: StreamPlan) -> tuple[str, ...]:
    return (plan.name,) if isinstance(plan, RawStreamPlan) else plan.raw_sources
