"""The rewriter's entry point: CREATE STREAM text + existing streams -> an immutable plan.

The passes run in order, each a pure function of its inputs:
parse_stream -> (raw) build_archive
             -> inline_functions (the user's SQL functions' bodies, at their calls), then
             -> (joins with tables, outer joins of 3+ streams) build_lookup, on read
                [aggregates over streams and tables: split_join_aggregate -> a join
                 stream of the streams, and build_lookup of it joined with the tables]
             -> (aggregates over a join) split_join_aggregate -> a join stream + the below
             -> (inner joins of raw streams) build_join
             -> (top-N and dedup, on read) [split_top_n -> a stream of the ranked rows]
                                           build_top_n
             -> (a subquery in FROM) split_subquery -> a stream of it + the query on read
             -> (subqueries joined in FROM) split_join_inputs -> a stream of each + the
                join on read
             -> (SESSION windows, on read) build_session
             -> (window functions over one stream, on read) build_window_functions
             -> (no window, no aggregates) build_projection
             -> (derived) resolve_window -> split_aggregates (over a raw stream)
                                          | split_rollup (over a derived stream)
                                       -> build_views (parallel, PP)
                                          | build_serial (at a gather point, SP)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sqlglot import exp

from rewriter.build_archive import build_archive
from rewriter.build_join import build_join, is_join
from rewriter.build_lookup import build_lookup, joins_on_read
from rewriter.build_projection import build_projection, is_projection
from rewriter.build_serial import build_serial
from rewriter.build_session import build_session, is_session
from rewriter.build_top_n import build_top_n, is_top_n
from rewriter.build_views import build_views
from rewriter.build_window_functions import build_window_query, is_window_query
from rewriter.derived_select import check_statement
from rewriter.errors import StrataError, UnknownSource, UnsupportedSQL
from rewriter.inline_functions import inline_functions
from rewriter.parse_stream import RawStreamStatement, parse_stream
from rewriter.plan import JoinStreamPlan, StreamPlan, WindowedAggregatePlan
from rewriter.resolve_window import resolve_window
from rewriter.split_aggregates import split_aggregates
from rewriter.split_join_aggregate import (
    JoinAggregate,
    is_join_aggregate,
    join_rows_statement,
    joins_streams_and_tables,
    split_join_aggregate,
)
from rewriter.split_join_inputs import (
    build_join_inputs,
    has_subquery_inputs,
    input_statements,
)
from rewriter.split_rollup import GatherPoint, split_rollup
from rewriter.split_subquery import build_subquery, inner_statement, is_subquery
from rewriter.split_top_n import split_top_n
from rewriter.split_union import build_union, is_union_of_streams, union_statements
from rewriter.sql_functions import SqlFunction
from rewriter.tables import TableSchema


def rewrite(
    sql: str,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
    functions: Mapping[str, SqlFunction] | None = None,
) -> StreamPlan:
    """Plan a stream. ``streams`` are the existing streams, by name (the plan's sources);
    ``tables`` the PostgreSQL tables the statement names, by the name it uses
    (rewriter.tables.referenced_names says which names to look up); ``functions`` the
    user's functions it calls, by name (rewriter.sql_functions.referenced_functions)."""
    try:
        return _rewrite(sql, streams, tables or {}, functions or {})
    except RecursionError:
        # sqlglot and the passes walk expressions recursively: a few dozen nested
        # parentheses exhaust Python's stack before anything else is wrong.
        raise UnsupportedSQL(
            "the statement nests expressions too deeply to be planned; simplify it"
        ) from None


def companion(
    sql: str,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
    functions: Mapping[str, SqlFunction] | None = None,
) -> tuple[str, str, str] | None:
    """(the stream's name, its companion's name, the companion's CREATE STREAM) when
    ``sql`` is built on one stream the server creates first (the first of companions)."""
    made = companions(sql, streams, tables, functions)
    return None if made is None else (made[0], *made[1][0])


def companions(
    sql: str,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
    functions: Mapping[str, SqlFunction] | None = None,
) -> tuple[str, list[tuple[str, str]]] | None:
    """(the stream's name, [(companion's name, its CREATE STREAM), ...]) when ``sql`` is
    built on streams the server creates first, in order, in the same transaction: the join
    of an aggregate over a join in one statement (``<name>__rows``), a subquery in FROM
    (``<name>__inner``), or the subqueries joined in FROM (``<name>__in<k>``), after the
    common table expressions its window calls read (``<name>__with<k>``). None for
    other statements (and for those whose error planning them reports). A companion's
    statement holds the user functions' bodies inlined: it needs no functions of its own."""
    try:
        statement = parse_stream(sql)
        if isinstance(statement, RawStreamStatement):
            return None
        first = list(statement.with_streams)
        if first:
            streams = planned_with_companions([t for _, t in first], streams, tables, functions)
        select = inline_functions(statement.select, functions or {})
        if has_subquery_inputs(select):
            assert isinstance(select, exp.Select)
            check_statement(select)
            return statement.name, first + input_statements(statement.name, select)
        if is_union_of_streams(select):
            assert isinstance(select, exp.Union)
            check_statement(select)
            branches = union_statements(statement.name, select)
            # A branch that cannot be planned is reported by the union (rewrite), which
            # names it.
            planned_with_companions([t for _, t in branches], streams, tables, functions)
            return statement.name, first + branches
        made = _companion(statement.name, select, streams, tables)
        if made is None:
            return (statement.name, first) if first else None
        return statement.name, [*first, made]
    except (StrataError, RecursionError):
        return None


def planned_with_companions(
    statements: Iterable[str],
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
    functions: Mapping[str, SqlFunction] | None = None,
) -> dict[str, StreamPlan]:
    """``streams`` and the plans of ``statements``, each after the streams made with it
    (recursively), as the server creates them: what a further statement is planned over."""
    planned = dict(streams)

    def plan(text: str) -> None:
        made = companions(text, planned, tables, functions)
        for _, statement in made[1] if made else []:
            plan(statement)
        stream = rewrite(text, planned, tables, functions)
        planned[stream.name] = stream

    for text in statements:
        plan(text)
    return planned


def _companion(
    name: str,
    select: exp.Select | exp.Union,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None,
) -> tuple[str, str] | None:
    if joins_on_read(select, tables or {}):
        assert isinstance(select, exp.Select)
        if not joins_streams_and_tables(select, tables or {}):
            return None
        return join_rows_statement(name, select, streams, tables)
    if is_top_n(select):
        assert isinstance(select, exp.Select)
        split = split_top_n(name, select, streams)
        return None if split is None else (split.inner, split.inner_statement)
    if is_subquery(select):
        assert isinstance(select, exp.Select)
        return inner_statement(name, select)
    return join_rows_statement(name, select, streams)


def _rewrite(
    sql: str,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema],
    functions: Mapping[str, SqlFunction],
) -> StreamPlan:
    statement = parse_stream(sql)
    if isinstance(statement, RawStreamStatement):
        return build_archive(statement)
    _check_made(statement.name, statement.with_streams, streams, tables, functions, _with_stream)
    select = inline_functions(statement.select, functions)
    check_statement(select)
    if has_subquery_inputs(select):
        assert isinstance(select, exp.Select)
        return build_join_inputs(statement.name, select, streams, tables)
    if joins_on_read(select, tables):
        assert isinstance(select, exp.Select)
        if joins_streams_and_tables(select, tables):
            split = _join_split(statement.name, select, streams, tables)
            return build_lookup(statement.name, split.aggregate, streams, tables)
        return build_lookup(statement.name, select, streams, tables)
    if is_join_aggregate(select):
        assert isinstance(select, exp.Select)
        split = _join_split(statement.name, select, streams, {})
        return _windowed(statement.name, split.aggregate, streams)
    if is_join(select):
        assert isinstance(select, exp.Select)
        return build_join(statement.name, select, streams)
    if is_top_n(select):
        assert isinstance(select, exp.Select)
        ranked = split_top_n(statement.name, select, streams)
        return build_top_n(statement.name, select if ranked is None else ranked.select, streams)
    if is_subquery(select):
        assert isinstance(select, exp.Select)
        return build_subquery(statement.name, select, streams)
    if is_session(select):
        assert isinstance(select, exp.Select)
        return build_session(statement.name, select, streams)
    if is_window_query(select):
        assert isinstance(select, exp.Select)
        return build_window_query(statement.name, select, streams)
    if is_union_of_streams(select):
        assert isinstance(select, exp.Union)
        branches = union_statements(statement.name, select)
        _check_made(statement.name, branches, streams, tables, functions, _union_branch)
        return build_union(statement.name, select, streams)
    if is_projection(select):
        return build_projection(statement.name, select, streams)
    assert isinstance(select, exp.Select)  # a UNION is always a projection
    return _windowed(statement.name, select, streams)


def _check_made(
    name: str,
    statements: list[tuple[str, str]] | tuple[tuple[str, str], ...],
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema],
    functions: Mapping[str, SqlFunction],
    what: Callable[[str, str], str],
) -> None:
    """The streams made with ``name`` from ``statements`` exist; when one does not, the
    error planning it reports, introduced by ``what(its name, its query)`` (else that the
    server makes it)."""
    missing = [(n, text) for n, text in statements if n not in streams]
    if not missing:
        return
    planned = dict(streams)
    for made, text in missing:
        try:
            planned = planned_with_companions([text], planned, tables, functions)
        except StrataError as error:
            raise type(error)(f"{what(made, text.split(' AS ', 1)[1])}: {error.message}") from None
    raise UnknownSource(
        f"the stream {missing[0][0]!r} that {name!r} reads does not exist (the server creates "
        "it with the stream)"
    )


def _with_stream(made: str, query: str) -> str:
    return (
        "a common table expression read by a window call is planned as a stream of its own, "
        f"{made!r} ({query}), which cannot be"
    )


def _union_branch(made: str, query: str) -> str:
    return (
        f"each branch of the union (each grouping set) is planned as a stream of its own, "
        f"{made!r} ({query}), which cannot be"
    )


def _join_split(
    name: str,
    select: exp.Select,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema],
) -> JoinAggregate:
    """An aggregate over a join in one statement, split, once its join stream exists."""
    split = split_join_aggregate(name, select, streams, tables)
    if split.rows_stream not in streams:
        raise UnknownSource(
            f"the join stream {split.rows_stream!r} that {name!r} aggregates over does not "
            "exist (the server creates it with the stream)"
        )
    return split


def _windowed(name: str, select: exp.Select, streams: Mapping[str, StreamPlan]) -> StreamPlan:
    """A windowed aggregate: parallel (PP) unless it needs a gather point (SP)."""
    window = resolve_window(select, streams)
    try:
        if isinstance(window.source, JoinStreamPlan) and window.source.preserved:
            raise GatherPoint(_over_outer_join(window.source))
        if select.args.get("distinct"):
            raise GatherPoint("SELECT DISTINCT over aggregates needs their final values")
        if isinstance(window.source, WindowedAggregatePlan):
            split = split_rollup(select, window)
        else:
            split = split_aggregates(select, window)
    except GatherPoint as gather:
        if window.is_global:
            raise UnsupportedSQL(
                f"{gather.reason}: such a stream (a gather point) needs a window: read FROM "
                f"TUMBLE({window.source.name}, ..., INTERVAL '...')"
            ) from None
        return build_serial(name, select, window, gather.reason)
    return build_views(name, split, window)


def _over_outer_join(join: JoinStreamPlan) -> str:
    """Why a stream over an outer join is serial; refused where padded rows would have no
    event time (it must come from the one input whose unmatched rows are kept)."""
    position = join.event_time_input
    if position not in join.preserved or len(join.preserved) > 1:
        raise UnsupportedSQL(
            f"streams over the outer join {join.name!r} window over its event time, which "
            "must come from the input whose unmatched rows it keeps (LEFT: the left, RIGHT: "
            "the right; a FULL join pads both, so its padded rows would have no time)"
        )
    return (
        f"the outer join {join.name!r} retracts a NULL-padded row when a late match arrives: "
        "its windows are computed from its rows, archived when closed and repaired"
    )
