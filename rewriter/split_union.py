"""Pass 3k: a UNION ALL whose branches aggregate (and so a query grouped by GROUPING SETS,
ROLLUP or CUBE, a branch per grouping set: rewriter.grouping_sets), or a UNION that removes
duplicates, each branch planned as a stream of its own.

``q1 UNION ALL q2 ...`` makes each branch the stream ``<name>__union<k>`` (k: its place,
from 1), planned like any stream (a windowed aggregate in parallel: partials per run), and
the stream itself a view of the UNION ALL of those streams' views. Every branch's view is
exact at every instant and one statement reads them all in one snapshot, so the union is
exact at every instant, whatever the lateness; reading it costs reading the branches. The
companions are made and dropped with the stream, in the same transaction. The view runs
the union as written (UNION removing duplicates across all branches' rows, ORDER BY and
LIMIT over it), on read, so it is exact at every instant too. A UNION ALL of plain
projections stays one projection stream (rewriter.build_projection).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.build_projection import is_projection
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import column_names, named_query
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import OutputColumn, RawStreamPlan, ReadUnionStreamPlan, StreamPlan


def is_union_of_streams(query: exp.Expr) -> bool:
    """A UNION that removes duplicates, or a UNION ALL with a branch that is not a plain
    projection of one stream's rows (an aggregate, a window call, a join), or that reads a
    stream in two branches."""
    if not isinstance(query, exp.Union):
        return False
    branches = _branches(query)
    read = [b.args["from_"].this.name for b in branches if b.args.get("from_") is not None]
    return (
        any(u.args.get("distinct") for u in _unions(query))
        or not all(is_projection(b) and not b.args.get("joins") for b in branches)
        or len(set(read)) < len(read)  # one stream read twice: a projection each
    )


def _bare(query: exp.Expr) -> exp.Expr:
    while isinstance(query, exp.Subquery) and not query.alias:
        query = query.this
    return query


def _unions(query: exp.Expr) -> list[exp.Union]:
    """The UNION operators of the statement's own tree (not those of its branches)."""
    query = _bare(query)
    if not isinstance(query, exp.Union):
        return []
    return [query, *_unions(query.this), *_unions(query.expression)]


def _branches(query: exp.Expr) -> list[exp.Expr]:
    query = _bare(query)
    if isinstance(query, exp.Union):
        return _branches(query.this) + _branches(query.expression)
    return [query]


def _view(query: exp.Expr, selects: Iterator[exp.Select]) -> exp.Expr:
    """The union's tree, each branch replaced by the next of ``selects``."""
    query = _bare(query)
    if not isinstance(query, exp.Union):
        return next(selects)
    left = _view(query.this, selects)
    right = _view(query.expression, selects)
    if isinstance(right, exp.Union):  # A UNION ALL (B UNION C) keeps its parentheses
        right = right.subquery()
    return exp.union(left, right, distinct=bool(query.args.get("distinct")))


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
    view = _view(union, iter(selects))
    assert isinstance(view, exp.Union)
    if union.args.get("limit") is not None and union.args.get("order") is None:
        raise UnsupportedSQL(
            "LIMIT without ORDER BY keeps arbitrary rows, which differ from read to read; "
            "say which rows with ORDER BY ... LIMIT N"
        )
    for clause in ("order", "limit", "offset"):  # over the union, run on read as written
        if union.args.get(clause) is not None:
            view.set(clause, union.args[clause].copy())
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
