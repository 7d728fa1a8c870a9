"""Pass 4c: a serial (SP) stream: the query, as written, over the consolidated source.

A gather point (seeds/003: MAX over COUNT, a HAVING or WHERE on final values, DISTINCT
over aggregates) cannot stay partial: it runs the user's query over the source's view
(final values), with the windows recomputed from the source's window start.

When its windows close, the workers compute them once into the stream's archive (table
``<name>__serial``, one column more: the window start). The stream's view reads the
archive for materialized windows, except those late data has touched since (listed in
the corrections table until the repair worker recomputes them), and computes every other
window on read. Each window is either archived or computed, never both, in every snapshot:
the view is exact at every instant, and fast over history.

The two branches computed on read are skipped outright when they cannot have a row, by
conditions on the query's bounds alone, which PostgreSQL checks once (a one-time filter)
before it runs the branch: windows awaiting repair only when some are listed; windows not
materialized yet only when the source has a window that starts at or after the end of
the materialized ones. Without that, a read while late partial rows wait for the reducer
would merge every touched window of the source on read only to drop it by the bound on
the source's time (``window_start + size`` there, which no index of the source serves).

The windows awaiting repair are also joined with their list, from which the view shows
their window's columns: a reader's filter on those reaches the list, and one that keeps
none of them (an hour late data did not touch) does not compute them.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import create_index, create_set_function, create_view, drop, function_call, table
from rewriter.derived_select import check_shown_time, output_name, positional_item
from rewriter.errors import UnsupportedSQL
from rewriter.plan import (
    OutputColumn,
    ParallelAggregatePlan,
    RawStreamPlan,
    SerialAggregatePlan,
    SerialStatements,
    WindowedAggregatePlan,
)
from rewriter.registry import exact_in_postgres
from rewriter.resolve_window import WindowSpec, fixed_interval

# Adds a condition on the source's rows to a query per window, where it reads them.
Restrict = Callable[[exp.Select, exp.Expr], exp.Select]


def _source_window_start(window: WindowSpec) -> exp.Expr:
    """Each source row's time, moved to the start of its source window."""
    source = window.source
    column = exp.column(window.time_column, table="src", quoted=True)
    if isinstance(source, WindowedAggregatePlan):
        output = source.output(window.time_column)
        if output is not None and output.role == "window_end":
            return exp.Sub(this=column, expression=fixed_interval(source.window_size_us))
    return column


def window_start(window: WindowSpec) -> exp.Expr:
    """The start of the serial window of each source row (the row as ``src``)."""
    return exp.func(
        "strata_window_start", _source_window_start(window), exp.Literal.number(window.size_us)
    )


def _source_from(window: WindowSpec, bound: exp.Expr) -> exp.Expr:
    """Source rows whose source window starts at or after ``bound``, as a condition on the
    source's time column itself (an index can serve it)."""
    return exp.GTE(
        this=exp.column(window.time_column, table="src", quoted=True),
        expression=_shifted(window, bound),
    )


def _source_before(window: WindowSpec, bound: exp.Expr) -> exp.Expr:
    """Source rows whose source window starts before ``bound``."""
    return exp.LT(
        this=exp.column(window.time_column, table="src", quoted=True),
        expression=_shifted(window, bound),
    )


def _listed_windows(window: WindowSpec) -> list[exp.Expr]:
    """Source rows of the windows from ``bounds.lowest`` to ``bounds.highest`` (a range
    of the source's time column, narrowed further by the windows listed)."""
    last_end = exp.Add(
        this=exp.column("highest", table="bounds"), expression=fixed_interval(window.size_us)
    )
    return [
        _source_from(window, exp.column("lowest", table="bounds")),
        _source_before(window, last_end),
    ]


def _shifted(window: WindowSpec, bound: exp.Expr) -> exp.Expr:
    source = window.source
    if isinstance(source, WindowedAggregatePlan):
        output = source.output(window.time_column)
        if output is not None and output.role == "window_end":
            return exp.Add(this=bound, expression=fixed_interval(source.window_size_us))
    return bound


def _source_reaches(window: WindowSpec, bound: exp.Expr) -> exp.Expr | None:
    """Whether the source has a window starting at or after ``bound``, from the newest
    window start of its partial archive and of its consolidated table (each one step of
    the index on the window start): every row of its view comes from one of the two, and
    a HOP window starts at or before its panes, which the partial archive keeps. None for
    other sources, where the view's bound on the time column decides alone."""
    source = window.source
    if not isinstance(source, ParallelAggregatePlan) or source.tables:
        return None
    output = source.output(window.time_column)
    if output is None or output.role not in (
        naming.WINDOW_START_COLUMN,
        naming.WINDOW_END_COLUMN,
    ):
        return None
    newest = [
        exp.select(exp.Max(this=exp.column(naming.WINDOW_START_COLUMN))).from_(table(name))
        for name in (
            naming.partial_archive_table(source.name),
            naming.consolidated_table(source.name),
        )
    ]
    return exp.GTE(
        this=exp.Greatest(this=newest[0].subquery(), expressions=[newest[1].subquery()]),
        expression=bound,
    )


def _bounds(stream: exp.Expr) -> exp.Expr:
    """One row: the end of the materialized windows (until), the first and last of the
    windows awaiting repair (lowest, highest; NULL when there are none) and those windows
    as a multirange (ranges), which a row is checked against by binary search where ANY
    over their array compares it with every window."""
    state = exp.select(
        exp.alias_(exp.func("strata_serial_until", stream), "until"),
        exp.alias_(exp.func("strata_serial_corrected", stream.copy()), "corrected"),
    ).subquery("state")

    def over_corrected(aggregate: exp.Expr) -> exp.Expr:
        return (
            exp.select(aggregate)
            .from_(
                exp.Unnest(
                    expressions=[exp.column("corrected", table="state")],
                    alias=exp.TableAlias(
                        this=exp.to_identifier("c"), columns=[exp.to_identifier("w")]
                    ),
                )
            )
            .subquery()
        )

    # OFFSET 0 keeps PostgreSQL from pulling the subquery up into the query, which would
    # call the functions once per source row instead of once.
    return (
        exp.select(
            exp.column("until", table="state"),
            exp.alias_(over_corrected(exp.Min(this=exp.column("w"))), "lowest"),
            exp.alias_(over_corrected(exp.Max(this=exp.column("w"))), "highest"),
            exp.alias_(over_corrected(_ranges_of(exp.column("w"))), "ranges"),
        )
        .from_(state)
        .offset(0)
        .subquery("bounds")
    )


def _until(stream: exp.Expr) -> exp.Expr:
    """One row: the end of the materialized windows (until)."""
    # OFFSET 0, as in _bounds.
    return (
        exp.select(exp.alias_(exp.func("strata_serial_until", stream), "until"))
        .offset(0)
        .subquery("bounds")
    )


def _ranges_of(window: exp.Expr) -> exp.Expr:
    """The aggregate of window starts into a multirange, each start a one-point range."""
    point = exp.func("tstzrange", window, window.copy(), exp.Literal.string("[]"))
    return exp.func("range_agg", point)


def _in_ranges(window_start: exp.Expr, ranges: exp.Expr) -> exp.Expr:
    return exp.ArrayContainedBy(this=window_start, expression=ranges)


def _listed_bounds(windows: exp.Expr, start: exp.Expr, end: exp.Expr) -> exp.Expr:
    """One row, computed once per statement: the windows ``windows`` (an array) names as a
    multirange (ranges), the first and last of them (lowest, highest), and ``start`` and
    ``end`` (range_from, range_to). Read from this row, not from the
    settings in the query's conditions, which PostgreSQL would evaluate (parse an array of
    timestamps) once per source row: a repair of 60 windows spent 25 of its 26 s doing so."""

    def edge(aggregate: type[exp.Min] | type[exp.Max]) -> exp.Expr:
        return exp.alias_(
            aggregate(this=exp.column("w")), "lowest" if aggregate is exp.Min else "highest"
        )

    return (
        exp.select(
            edge(exp.Min),
            edge(exp.Max),
            exp.alias_(_ranges_of(exp.column("w")), "ranges"),
            exp.alias_(start, "range_from"),
            exp.alias_(end, "range_to"),
        )
        .from_(
            exp.Unnest(
                expressions=[windows],
                alias=exp.TableAlias(this=exp.to_identifier("c"), columns=[exp.to_identifier("w")]),
            )
        )
        .offset(0)
        .subquery("bounds")
    )


def _lateral(bounds: exp.Expr, windows: exp.Select, columns: list[exp.Column]) -> exp.Select:
    """``windows`` (the query per window over the source, its conditions on ``bounds``) for
    the one row of ``bounds``."""
    return (
        exp.select(*(exp.column(c.name, table="live", quoted=True) for c in columns))
        .from_(bounds.copy())
        .join(
            exp.Lateral(
                this=windows.subquery(), alias=exp.TableAlias(this=exp.to_identifier("live"))
            ),
            join_type="CROSS",
        )
    )


def _setting(name: str, pg_type: str) -> exp.Expr:
    return exp.cast(exp.func("current_setting", exp.Literal.string(name)), pg_type)


def _in_windows(window_start: exp.Expr, windows: exp.Expr) -> exp.Expr:
    return exp.EQ(this=window_start, expression=exp.Any(this=exp.paren(windows)))


def _in_range(window_start: exp.Expr) -> exp.Expr:
    """Windows starting in [SERIAL_FROM, SERIAL_TO): a range is checked in constant time
    per row, where ANY over a long list of windows costs a comparison per window."""
    return exp.and_(
        exp.GTE(this=window_start, expression=_setting(naming.SERIAL_FROM_SETTING, "timestamptz")),
        exp.LT(
            this=window_start.copy(), expression=_setting(naming.SERIAL_TO_SETTING, "timestamptz")
        ),
    )


def _and_where(query: exp.Select, condition: exp.Expr) -> exp.Select:
    where = query.args.get("where")
    if where is not None:
        condition = exp.and_(exp.paren(where.this.copy()), exp.paren(condition))
    query = query.copy()
    query.set("where", exp.Where(this=condition))
    return query


def _groups_by_window(select: exp.Select) -> bool:
    group = select.args.get("group")
    for item in group.expressions if group else ():
        by_position = positional_item(select, item)
        key = item if by_position is None else by_position
        if any(
            c.name in (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN) and not c.table
            for c in key.find_all(exp.Column)
        ):
            return True
    return False


def build_serial(
    name: str, select: exp.Select, window: WindowSpec, reason: str
) -> SerialAggregatePlan:
    if window.is_hop:
        raise UnsupportedSQL(f"HOP windows are not supported in a serial stream ({reason})")
    check_shown_time(window.source.name, window.time_column, f"a serial stream ({reason})")
    if not _groups_by_window(select):
        raise UnsupportedSQL(
            f"a serial stream ({reason}) must GROUP BY its window (window_start or window_end)"
        )
    start = window_start(window)

    def place(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table:
            if node.name == naming.WINDOW_START_COLUMN:
                return start.copy()
            if node.name == naming.WINDOW_END_COLUMN:
                return exp.Add(this=start.copy(), expression=fixed_interval(window.size_us))
        return node

    query = select.copy()
    query.set(
        "from_", exp.From(this=exp.alias_(table(window.source.name, naming.PUBLIC_SCHEMA), "src"))
    )
    # Sketches are Spark-side partial forms; on final values PostgreSQL computes exactly.
    placed = query.transform(place).transform(exact_in_postgres)
    assert isinstance(placed, exp.Select)
    query = placed
    outputs = []
    for item in select.expressions:
        expression = item.this if isinstance(item, exp.Alias) else item
        role = "expression"
        if isinstance(expression, exp.Column) and expression.name in (
            naming.WINDOW_START_COLUMN,
            naming.WINDOW_END_COLUMN,
        ):
            role = expression.name
        outputs.append(OutputColumn(output_name(item), None, role))
    named = query.copy()
    named.set(
        "expressions",
        [
            exp.alias_(e.this if isinstance(e, exp.Alias) else e, o.name, quoted=True)
            for e, o in zip(query.expressions, outputs, strict=True)
        ],
    )
    # The query per window: the window start as the last column (GROUP BY positions hold),
    # and among the grouping keys (it is a function of the window key already there).
    per_window = named.copy()
    per_window.set(
        "expressions",
        [*per_window.expressions, exp.alias_(start.copy(), naming.SERIAL_WINDOW_COLUMN)],
    )
    group = per_window.args.get("group")
    if group is not None:
        group.set("expressions", [*group.expressions, start.copy()])
    distinct = bool(select.args.get("distinct"))
    return serial_plan(name, window, reason, per_window, tuple(outputs), _and_where, distinct)


def _repaired_columns(
    window: WindowSpec, outputs: tuple[OutputColumn, ...], indexed: tuple[str, ...], start: exp.Expr
) -> list[exp.Expr]:
    """The view's columns of a window awaiting repair (its rows as ``live``), those
    that are the window's start or end, or the source's window column shown as it is
    (``indexed``: a top-N ranks each window of its source), from the window's ``start``."""
    end = exp.Add(this=start.copy(), expression=fixed_interval(window.size_us))
    source = window.source
    source_time = (
        source.output(window.time_column) if isinstance(source, WindowedAggregatePlan) else None
    )
    ends = source_time is not None and source_time.role == naming.WINDOW_END_COLUMN
    shown = end if ends else start
    items: list[exp.Expr] = []
    for output in outputs:
        value: exp.Expr = exp.column(output.name, table="live", quoted=True)
        if output.role == naming.WINDOW_START_COLUMN:
            value = start.copy()
        elif output.role == naming.WINDOW_END_COLUMN:
            value = end.copy()
        elif output.name in indexed and _one_source_window(window):
            value = shown.copy()
        items.append(exp.alias_(value, output.name, quoted=True))
    return items


def _one_source_window(window: WindowSpec) -> bool:
    """Whether each serial window is one window of its (windowed) source."""
    source = window.source
    return isinstance(source, WindowedAggregatePlan) and source.window_size_us == window.size_us


def serial_plan(
    name: str,
    window: WindowSpec,
    reason: str,
    per_window: exp.Select,
    outputs: tuple[OutputColumn, ...],
    restrict: Restrict,
    distinct: bool,
    indexed: tuple[str, ...] = (),
) -> SerialAggregatePlan:
    """The serial stream whose query per window is ``per_window`` (its columns the
    ``outputs``, then the window's start), over the source's rows as ``src``; ``restrict``
    adds a condition on those rows (where the query reads them). Its archive is indexed
    on the window start, and on each output ``indexed`` names (the source's window column
    shown as it is, which the view shows from the window's start where it computes the
    window on read)."""
    start = window_start(window)
    archive = table(naming.serial_archive_table(name))
    window_column = exp.column(naming.SERIAL_WINDOW_COLUMN, quoted=True)
    windows = _setting(naming.SERIAL_WINDOWS_SETTING, "timestamptz[]")
    stream = exp.Literal.string(name)
    # A scalar subquery: PostgreSQL evaluates it once per query (an InitPlan), not per row.
    corrected = exp.cast(  # an array expression, not ANY over a subquery's rows
        exp.select(exp.func("strata_serial_corrected", stream)).subquery(), "timestamptz[]"
    )

    columns = [exp.column(o.name, quoted=True) for o in outputs]
    archived = (
        exp.select(*columns)
        .from_(archive.copy())
        .where(exp.not_(_in_windows(window_column.copy(), corrected.copy())))
    )
    # Windows not materialized yet, and windows awaiting repair: computed on read, each kind
    # by a function, over the source rows of those windows only. The bounds are read once
    # per query and reach the source as parameters of a LATERAL subquery, so a range of the
    # source's time column (an index condition on the source's consolidated table) and not
    # a filter of every source row: a materialized range never touches the source. Each
    # also has a condition on the bounds alone (see the module docstring): PostgreSQL
    # checks it once and skips the branch when it is false.
    # Functions, which PostgreSQL plans once per session: planning them in the view, over
    # the source's view twice, took three times as long as reading a caught-up archive
    # (0.49 ms of planning to 0.16 ms of execution, the plain table's read 0.13 ms in all).
    after = exp.column("until", table="bounds")
    reaches = _source_reaches(window, after.copy())
    fresh = restrict(
        per_window,
        exp.and_(_source_from(window, after), *([reaches] if reaches is not None else [])),
    )
    repaired = restrict(
        per_window,
        exp.and_(
            *_listed_windows(window),
            _source_before(window, after.copy()),
            _in_ranges(start.copy(), exp.column("ranges", table="bounds")),
            exp.not_(exp.Is(this=exp.column("lowest", table="bounds"), expression=exp.Null())),
        ),
    )
    per_window_columns = [
        *(exp.column(o.name) for o in outputs),
        exp.column(naming.SERIAL_WINDOW_COLUMN),
    ]
    live_function = naming.serial_live_function(name)
    create_live = create_set_function(
        live_function, archive, _lateral(_until(stream), fresh, per_window_columns)
    )
    awaiting_function = naming.serial_awaiting_function(name)
    create_awaiting = create_set_function(
        awaiting_function, archive, _lateral(_bounds(stream), repaired, per_window_columns)
    )
    # The view joins the windows awaiting repair listed with the function's rows and shows
    # the window's columns (its start, its end, the source's window column a top-N shows)
    # from the list, so that a reader's filter on them reaches the list (PostgreSQL pushes
    # it into the branch): when it keeps none of them, the function is not called (the
    # join's other side is empty) and a dashboard's hour untouched by late data reads at
    # caught-up speed. When it keeps some, the function computes every window awaiting
    # repair, once, as before.
    awaiting = exp.column("w", table="c")
    computed = (
        exp.select(*_repaired_columns(window, outputs, indexed, awaiting))
        .from_(
            exp.Unnest(
                expressions=[corrected.copy()],
                alias=exp.TableAlias(this=exp.to_identifier("c"), columns=[exp.to_identifier("w")]),
            )
        )
        .join(
            exp.alias_(function_call(awaiting_function), "live", table=True),
            on=exp.EQ(
                this=exp.column(naming.SERIAL_WINDOW_COLUMN, table="live"),
                expression=awaiting.copy(),
            ),
        )
    )
    view: exp.Query = exp.union(
        exp.union(
            archived,
            exp.select(*(c.copy() for c in columns)).from_(
                exp.alias_(function_call(live_function), "live", table=True)
            ),
            distinct=False,
        ),
        computed,
        distinct=False,
    )
    if distinct:
        view = exp.select(*columns).distinct().from_(view.subquery("serial"))
    # What the workers recompute: the windows of the source rows in [SERIAL_FROM,
    # SERIAL_TO) and the windows SERIAL_WINDOWS lists, each read as a range of the source's
    # time column (an index condition on the source's consolidated table).
    in_range = exp.and_(
        _source_from(window, _setting(naming.SERIAL_FROM_SETTING, "timestamptz")),
        _source_before(window, _setting(naming.SERIAL_TO_SETTING, "timestamptz")),
    )
    listed_bounds = _listed_bounds(
        windows.copy(),
        _setting(naming.SERIAL_FROM_SETTING, "timestamptz"),
        _setting(naming.SERIAL_TO_SETTING, "timestamptz"),
    )
    listed = restrict(
        per_window,
        exp.and_(
            *_listed_windows(window),
            _in_ranges(start.copy(), exp.column("ranges", table="bounds")),
            exp.not_(
                exp.paren(
                    exp.and_(
                        _source_from(window, exp.column("range_from", table="bounds")),
                        _source_before(window, exp.column("range_to", table="bounds")),
                    )
                )
            ),
        ),
    )
    serial = SerialStatements(
        windows_query=exp.select(exp.alias_(start.copy(), naming.SERIAL_WINDOW_COLUMN))
        .distinct()
        .from_(exp.alias_(table(window.source.name, naming.PUBLIC_SCHEMA), "src"))
        .where(in_range.copy())
        .order_by(exp.column(naming.SERIAL_WINDOW_COLUMN))
        .limit(_setting(naming.SERIAL_LIMIT_SETTING, "integer"))
        .sql("postgres"),
        delete_statement=exp.Delete(
            this=archive.copy(),
            where=exp.Where(
                this=exp.or_(
                    _in_windows(window_column.copy(), windows.copy()),
                    _in_range(window_column.copy()),
                )
            ),
        ).sql("postgres"),
        insert_statement=exp.Insert(
            this=archive.copy(),
            expression=exp.union(
                restrict(per_window, in_range.copy()),
                _lateral(listed_bounds, listed, per_window_columns),
                distinct=False,
            ),
        ).sql("postgres"),
    )
    # The archive takes its column types from the query itself.
    create_archive = exp.Create(
        this=archive.copy(), kind="TABLE", expression=per_window.copy().limit(0)
    ).sql("postgres")
    archive_index = create_index(naming.serial_window_index(name), archive, [window_column.copy()])
    time_indexes = tuple(
        create_index(naming.serial_time_index(name, c), archive, [exp.column(c, quoted=True)])
        for c in indexed
    )
    source = window.source
    raw_sources = source.raw_sources if not isinstance(source, RawStreamPlan) else (source.name,)
    return SerialAggregatePlan(
        name=name,
        source=source.name,
        window=window.describe(),
        window_size_us=window.size_us,
        window_slide_us=window.slide_us,
        pane_us=window.pane_us,
        parallelism_reason=f"serial: {reason}",
        create_statements=(
            create_archive,
            archive_index,
            *time_indexes,
            create_live,
            create_awaiting,
            create_view(name, view),
        ),
        drop_statements=(
            drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),
            drop("FUNCTION", table(awaiting_function)),
            drop("FUNCTION", table(live_function)),
            drop("TABLE", archive.copy()),
        ),
        view_query=view.sql("postgres"),
        outputs=outputs,
        raw_sources=raw_sources,
        serial=serial,
    )
