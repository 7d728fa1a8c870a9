"""Pass 3h: top-N and dedup, computed on read.

``SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY k [, window_start] ORDER BY
x DESC) AS rn FROM source) t WHERE rn <= N`` (RANK and DENSE_RANK too; Nexmark q9, q18,
q19), ``SELECT ... FROM source [WHERE ...] ORDER BY ... LIMIT N`` (over everything) and
``SELECT DISTINCT ON (k) ... FROM source ORDER BY k, x DESC`` (PostgreSQL's dedup: the
first row of each key; rewriter.derived_select checks its ORDER BY).
The source is any stream (rows, or an aggregate stream's consolidated rows, as in "the
window's hottest item" shapes), or ``TUMBLE(stream, time_column, INTERVAL '...')`` of a
stream of rows, which gives each row its window_start and window_end.

Whether a row is among the first N depends on every other row of its partition, and a late
row can push one out: the stream is a view that ranks the source's rows at every read, so
it is exact at every instant whatever the lateness; reading it ranks the source's rows (of
the partitions a reader's filter keeps, where PostgreSQL pushes it down). Streams are not
built on it.

Where every rank partitions by the window of a tumbling aggregate stream (the top 10
campaigns of each minute), each window's first N depend on that window's rows alone: the
stream is a serial stream (rewriter.build_serial) whose query per window is the ranking,
its closed windows kept in an archive and repaired after late data, so that a dashboard
reads the N rows of each window, not every row of the source. Its view is as exact: a
window is read from the archive or ranked on read, never both.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.build_serial import serial_plan, window_start
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import (
    check_shown_time,
    column_names,
    is_star,
    output_name,
    output_names,
)
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import (
    JoinStreamPlan,
    OnReadStreamPlan,
    OutputColumn,
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
    WindowedAggregatePlan,
)
from rewriter.resolve_window import (
    GLOBAL_WINDOW_US,
    WINDOW_FORM,
    WindowSpec,
    fixed_interval,
    parse_interval,
)

_RANKS = (exp.RowNumber, exp.Rank, exp.DenseRank)
TOP_N_FORM = (
    "SELECT * FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY k ORDER BY x DESC) AS rn "
    "FROM stream) t WHERE rn <= 3"
)


def is_top_n(select: exp.Expr) -> bool:
    """A ranking subquery filtered on its rank, ORDER BY ... LIMIT over a stream, or
    DISTINCT ON over a stream (the first row of each key, in the ORDER BY's order)."""
    if not isinstance(select, exp.Select) or select.args.get("joins"):
        return False
    from_ = select.args.get("from_")
    item = from_.this if from_ is not None else None
    if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
        # The subquery ranks its own rows (a window in its select list, not deeper down).
        return any(e.find(exp.Window) is not None for e in item.this.expressions)
    distinct = select.args.get("distinct")
    return (
        isinstance(item, exp.Table)
        and bool(select.args.get("limit") or (distinct and distinct.args.get("on")))
        and not select.args.get("group")
    )


def build_top_n(
    name: str, select: exp.Select, streams: Mapping[str, StreamPlan], *, materialize: bool = True
) -> OnReadStreamPlan | SerialAggregatePlan:
    """The top-N stream ``name``; ``materialize=False`` computes it on read even where its
    windows could be kept (how the releases before kept every top-N stream)."""
    view = select.copy()
    for clause in ("with_", "qualify", "offset"):
        if view.args.get(clause):
            raise UnsupportedSQL(f"{clause.rstrip('_').upper()} is not supported in a top-N stream")
    inner = view.args["from_"].this
    ranked = inner.this if isinstance(inner, exp.Subquery) else view
    if isinstance(inner, exp.Subquery):
        _check_rank_filter(view, ranked)
    if ranked.args.get("joins") or ranked.args.get("group"):
        raise UnsupportedSQL(
            "a top-N stream ranks the rows of one stream: join or aggregate in a stream of "
            f"its own first, then rank its rows ({TOP_N_FORM})"
        )
    if any(isinstance(s, exp.Subquery) for s in ranked.find_all(exp.Subquery)):
        raise UnsupportedSQL("subqueries are not supported inside a top-N stream's ranking")
    source = _source(ranked, streams)
    window = _serial_window(view, ranked, source) if materialize else None
    if window is not None:
        return _materialized(name, view, ranked, window)
    columns = [OutputColumn(n, None) for n in _names(view, ranked, source)]
    window = ranked.args["from_"].this
    ranked.args["from_"].set("this", _rows(window, source))
    distinct = view.args.get("distinct")
    reason = (
        "DISTINCT ON: a late row can take the place of the row kept for its key, so the "
        "source's rows are deduplicated on read"
        if distinct is not None and distinct.args.get("on") is not None
        else "top-N: a late row can push another out of the first N, so the source's rows "
        "are ranked on read"
    )
    return OnReadStreamPlan(
        name=name,
        source=source.name,
        raw_sources=(source.name,) if isinstance(source, RawStreamPlan) else source.raw_sources,
        window=None,
        parallelism_reason=reason,
        columns=tuple(columns),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _serial_window(view: exp.Select, ranked: exp.Select, source: StreamPlan) -> WindowSpec | None:
    """The source's window, when the stream ranks the rows of a tumbling aggregate stream
    (without tables joined on read) and every rank partitions by that stream's window
    column; None otherwise."""
    if view is ranked or not isinstance(source, ParallelAggregatePlan) or source.tables:
        return None
    size = source.window_size_us
    if size != source.window_slide_us or size == GLOBAL_WINDOW_US:
        return None
    item = ranked.args["from_"].this
    if not isinstance(item, exp.Table) or isinstance(item.this, exp.Anonymous):
        return None
    if any(view.args.get(c) for c in ("order", "limit", "distinct", "group", "having")) or any(
        ranked.args.get(c) for c in ("order", "limit", "distinct", "having")
    ):
        return None
    alias = item.alias_or_name
    times: list[str] = []
    for rank in ranked.find_all(exp.Window):
        keys = [
            c.name
            for c in rank.args.get("partition_by") or []
            if isinstance(c, exp.Column)
            and c.table in ("", alias)
            and (output := source.output(c.name)) is not None
            and output.role in (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)
        ]
        if not keys:
            return None
        times += keys
    return WindowSpec(source, times[0], size, size) if times else None


def _materialized(
    name: str, view: exp.Select, ranked: exp.Select, window: WindowSpec
) -> SerialAggregatePlan:
    """The ranking as a serial stream over ``window``: the query per window ranks the
    source's rows as ``src``, their window's start carried out through the outer query."""
    source = window.source
    assert isinstance(source, ParallelAggregatePlan)  # as _serial_window found it
    names = _names(view, ranked, source)
    inner_names = output_names(ranked, column_names(source))
    per_window = view.copy()
    subquery = per_window.args["from_"].this
    if not subquery.alias:
        subquery.set("alias", exp.TableAlias(this=exp.to_identifier("ranked")))
    inner = subquery.this
    alias = inner.args["from_"].this.alias_or_name
    inner.args["from_"].set(
        "this", exp.alias_(table(source.name, naming.PUBLIC_SCHEMA), "src", table=True)
    )
    for column in inner.find_all(exp.Column):
        if column.table == alias:
            column.set("table", exp.to_identifier("src"))
    inner.set(
        "expressions",
        [*inner.expressions, exp.alias_(window_start(window), naming.SERIAL_WINDOW_COLUMN)],
    )
    items: list[exp.Expr] = []
    for item in per_window.expressions:
        if is_star(item):
            items += [exp.column(n, table=subquery.alias, quoted=True) for n in inner_names]
        else:
            items.append(item.this if isinstance(item, exp.Alias) else item)
    per_window.set(
        "expressions",
        [
            *(exp.alias_(e, n, quoted=True) for e, n in zip(items, names, strict=True)),
            exp.column(naming.SERIAL_WINDOW_COLUMN, table=subquery.alias),
        ],
    )
    # No column is the stream's window for the streams and feeds that read it: its rows
    # are the first N of each window, not one row per window and group.
    outputs = tuple(OutputColumn(n, None) for n in names)
    reason = (
        "top-N: a late row can push another out of the first N of its window, so the "
        "windows are ranked when they close and ranked again after late data"
    )
    # The window column, shown as it is: readers filter by it (an hour of a dashboard).
    shown = tuple(
        n
        for e, n in zip(items, names, strict=True)
        if n == window.time_column
        and isinstance(e, exp.Column)
        and e.name == n
        and _ranks_it_as_is(ranked, n)
    )
    return serial_plan(
        name, window, reason, per_window, outputs, _in_ranking, distinct=False, indexed=shown
    )


def _ranks_it_as_is(ranked: exp.Select, column: str) -> bool:
    """Whether the ranking passes the source's ``column`` through unchanged."""
    for item in ranked.expressions:
        if is_star(item):
            return True
        if output_name(item) == column:
            value = item.this if isinstance(item, exp.Alias) else item
            return isinstance(value, exp.Column) and value.name == column
    return False


def _in_ranking(query: exp.Select, condition: exp.Expr) -> exp.Select:
    """``query`` with ``condition`` on the rows its ranking subquery ranks."""
    query = query.copy()
    inner = query.args["from_"].this.this
    where = inner.args.get("where")
    if where is not None:
        condition = exp.and_(exp.paren(where.this.copy()), exp.paren(condition))
    inner.set("where", exp.Where(this=condition))
    return query


def _check_rank_filter(outer: exp.Select, ranked: exp.Select) -> None:
    ranks = {
        item.alias
        for item in ranked.expressions
        if isinstance(item, exp.Alias)
        and isinstance(item.this, exp.Window)
        and isinstance(item.this.this, _RANKS)
    }
    where = outer.args.get("where")
    if (
        not ranks
        or where is None
        or not any(
            isinstance(c, exp.Column) and c.name in ranks for c in where.find_all(exp.Column)
        )
    ):
        raise UnsupportedSQL(
            f"window functions are supported as top-N and dedup: {TOP_N_FORM}; give the "
            "rank a name and filter on it in the outer WHERE"
        )
    for window in ranked.find_all(exp.Window):
        if not isinstance(window.this, _RANKS):
            raise UnsupportedSQL(
                f"{window.sql('postgres')!r}: of the window functions, ROW_NUMBER, RANK and "
                "DENSE_RANK are supported (as top-N and dedup)"
            )


def _source(ranked: exp.Select, streams: Mapping[str, StreamPlan]) -> StreamPlan:
    from_ = ranked.args.get("from_")
    item = from_.this if from_ is not None else None
    if not isinstance(item, exp.Table):
        raise UnsupportedSQL(f"a top-N stream ranks a stream's rows: {TOP_N_FORM}")
    call = item.this
    name = (
        call.expressions[0].name
        if isinstance(call, exp.Anonymous) and call.expressions
        else item.name
    )
    source = streams.get(name)
    if source is None:
        raise UnknownSource(f"stream {name!r} does not exist")
    return source


def _rows(item: exp.Expr, source: StreamPlan) -> exp.Expr:
    """The source's rows under the item's alias; a TUMBLE window adds the window columns."""
    assert isinstance(item, exp.Table)
    alias = item.alias or source.name
    view = table(source.name, naming.PUBLIC_SCHEMA)
    call = item.this
    if not isinstance(call, exp.Anonymous):
        return exp.alias_(view, alias, table=True)
    args = call.expressions
    if (
        call.name.upper() != "TUMBLE"
        or len(args) != 3
        or not isinstance(args[1], exp.Column)
        or not isinstance(source, RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan)
    ):
        raise UnsupportedSQL(f"a top-N stream ranks a stream of rows, or its rows in {WINDOW_FORM}")
    check_shown_time(source.name, source.event_time, "a top-N over TUMBLE")
    if isinstance(source, WindowedAggregatePlan) or args[1].name != source.event_time:
        raise UnsupportedSQL(
            f"TUMBLE windows over the event-time column of {source.name!r}, {source.event_time!r}"
        )
    size = parse_interval(args[2])
    start = exp.func(
        "strata_window_start", exp.column(source.event_time, quoted=True), exp.Literal.number(size)
    )
    end = exp.Add(this=start.copy(), expression=fixed_interval(size))
    rows = exp.select(
        exp.Star(),
        exp.alias_(start, naming.WINDOW_START_COLUMN, quoted=True),
        exp.alias_(end, naming.WINDOW_END_COLUMN, quoted=True),
    ).from_(view)
    return exp.alias_(rows.subquery(), alias)


def _names(view: exp.Select, ranked: exp.Select, source: StreamPlan) -> list[str]:
    """The view's column names, stars expanded (the source's columns, then the ranking's)."""
    own = column_names(source)
    if isinstance(ranked.args["from_"].this.this, exp.Anonymous):
        own += [naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN]
    inner = output_names(ranked, own)
    return inner if view is ranked else output_names(view, inner)
