"""Pass 4b: the plan of a derived stream: Spark partial query, partial archive, view, reduce."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import (
    archive_oid,
    column_def,
    create_index,
    create_table,
    create_view,
    create_waiting_trigger,
    create_windows_function,
    drop,
    function_call,
    table,
    unlist_waiting,
)
from rewriter.plan import (
    AggregateState,
    JoinStreamPlan,
    OutputColumn,
    ParallelAggregatePlan,
    PlannedAggregate,
    ProjectionStreamPlan,
    WindowedAggregatePlan,
)
from rewriter.resolve_window import WindowSpec, fixed_interval
from rewriter.split_query import SplitQuery
from rewriter.window_forms import window_start_spark


def partial_query(split: SplitQuery, input_view: str, time_column: str, pane_us: int) -> str:
    """Spark SQL computing one partial row per run, pane and group over a batch of runs."""
    start = window_start_spark(time_column, pane_us)
    run = exp.column(naming.RUN_COLUMN, quoted=True)
    projections: list[exp.Expr] = [
        run,
        exp.alias_(start, naming.WINDOW_START_COLUMN, quoted=True),
    ]
    projections += [exp.alias_(k.spark, k.column, quoted=True) for k in split.keys]
    projections += [
        exp.alias_(s.spark, s.column, quoted=True) for a in split.aggregates for s in a.states
    ]
    query = exp.select(*projections).from_(exp.table_(input_view))
    if split.where_spark is not None:
        query = query.where(split.where_spark)
    query = query.group_by(run.copy(), start.copy(), *(k.spark.copy() for k in split.keys))
    return query.sql("spark")


def _partial_columns(split: SplitQuery) -> list[tuple[str, str]]:
    columns = [(naming.RUN_COLUMN, "bigint"), (naming.WINDOW_START_COLUMN, "timestamptz")]
    columns += [(k.column, k.type.pg()) for k in split.keys]
    columns += [(s.column, s.pg_type) for a in split.aggregates for s in a.states]
    return columns


def _group_columns(split: SplitQuery) -> list[exp.Expr]:
    names = [naming.WINDOW_START_COLUMN, *(k.column for k in split.keys)]
    return [exp.column(name) for name in names]


def _unreduced_rows(name: str, split: SplitQuery, window: WindowSpec) -> exp.Expr:
    """The partial rows not yet reduced, one per window (not yet aliased): the partial
    archive itself for TUMBLE; for HOP, each pane's partial rows once for every window that
    contains the pane (strata_hop_windows in sql/), so overlapping windows share the panes'
    partials."""
    source: exp.Expr = table(naming.partial_archive_table(name))
    if not window.is_hop:
        return source
    columns = [c for c, _ in _partial_columns(split) if c != naming.WINDOW_START_COLUMN]
    return _expanded(source, columns, window).subquery()


def _expanded(source: exp.Expr, columns: list[str], window: WindowSpec) -> exp.Select:
    """``source``'s pane rows, once for every HOP window holding the pane."""
    windows = exp.func(
        "strata_hop_windows",
        exp.column(naming.WINDOW_START_COLUMN, table="p"),
        exp.Literal.number(window.pane_us),
        exp.Literal.number(window.slide_us),
        exp.Literal.number(window.size_us),
    )
    return (
        exp.select(
            exp.column(naming.WINDOW_START_COLUMN, table="w"),
            *(exp.column(c, table="p") for c in columns),
        )
        .from_(exp.alias_(source, "p", table=True))
        .join(
            exp.Lateral(
                this=windows,
                alias=exp.TableAlias(
                    this=exp.to_identifier("w"),
                    columns=[exp.to_identifier(naming.WINDOW_START_COLUMN)],
                ),
            ),
            join_type="CROSS",
        )
    )


def _state_columns(split: SplitQuery) -> list[str]:
    """The group (window start and keys) and the state columns, as both the partial archive
    and the consolidated table name them."""
    return [
        naming.WINDOW_START_COLUMN,
        *(k.column for k in split.keys),
        *(s.column for a in split.aggregates for s in a.states),
    ]


def partial_rows(name: str, split: SplitQuery, window: WindowSpec) -> exp.Expr:
    """Every partial row of the stream, one per window and not yet aliased: the unreduced
    ones and the consolidated ones (their states), for views that merge them all on read
    (aggregates joined to a table on read)."""
    columns = _state_columns(split)
    unreduced = exp.select(*(exp.column(c) for c in columns)).from_(
        exp.alias_(_unreduced_rows(name, split, window), "u", table=True)
    )
    reduced = exp.select(*(exp.column(c) for c in columns)).from_(
        table(naming.consolidated_states_table(name))
    )
    return exp.union(unreduced, reduced, distinct=False).subquery()


def reduced_rows(name: str, split: SplitQuery) -> exp.Expr:
    """The consolidated rows of every window, in partial form (their states), not yet
    aliased: what a view merging them on read reads of the windows nothing waits in."""
    columns = _state_columns(split)
    return (
        exp.select(*(exp.column(c) for c in columns))
        .from_(table(naming.consolidated_states_table(name)))
        .subquery()
    )


def waiting_rows(name: str, split: SplitQuery, window: WindowSpec) -> exp.Expr:
    """The partial rows of the windows holding unreduced ones (late data the reducer has
    not folded yet), not yet aliased: the unreduced rows and those windows' consolidated
    states.

    For TUMBLE, both are read window by window from the list of waiting windows, whose
    window start each row then carries: a reader's filter on the window (a dashboard's
    hour, ``t`` >= ..., pushed down as ``window_start + size`` >= ...) narrows the list,
    not the partial archive, which no index serves such a condition on (a sequential scan
    of every partial row at every read: 288,000 with a fifth of a day late). Every window
    with partial rows is listed in the snapshot that sees them (the archive's trigger lists
    it in the statement that adds them, the fold unlists it in the one that takes them),
    which the merge already relies on: a consolidated row is read as it is unless its
    window is listed."""
    columns = _state_columns(split)
    if window.is_hop:
        unreduced = exp.select(*(exp.column(c) for c in columns)).from_(
            exp.alias_(_unreduced_rows(name, split, window), "u", table=True)
        )
        touched = (
            exp.select(*(exp.column(c) for c in columns))
            .from_(exp.alias_(table(naming.consolidated_states_table(name)), "c", table=True))
            .where(_in_touched(name, window))
        )
        return exp.union(unreduced, touched, distinct=False).subquery()
    unreduced = _by_listed_window(
        columns, table(naming.partial_archive_table(name)), "u", name
    ).where(_waiting(name))
    touched = _by_listed_window(
        columns, table(naming.consolidated_states_table(name)), "c", name
    ).where(_waiting(name))
    return exp.union(unreduced, touched, distinct=False).subquery()


def _by_listed_window(columns: list[str], rows: exp.Table, alias: str, name: str) -> exp.Select:
    """``columns`` of ``rows`` (as ``alias``) of the windows the stream ``name`` lists as
    waiting, the window start the list's."""
    start = naming.WINDOW_START_COLUMN
    listed = exp.alias_(function_call(naming.waiting_windows_function(name)), "w", table=True)
    return (
        exp.select(*(exp.column(c, table="w" if c == start else alias) for c in columns))
        .from_(listed)
        .join(
            exp.alias_(rows, alias, table=True),
            on=exp.EQ(this=exp.column(start, table=alias), expression=exp.column(start, table="w")),
        )
    )


def folded_rows(split: SplitQuery) -> exp.Expr:
    """The states of the windows a fold rewrote (its ``folded`` rows), not yet aliased: in
    an extra step of the reducer's statement (reduce_statement's ``also``)."""
    columns = _state_columns(split)
    return exp.select(*(exp.column(c) for c in columns)).from_("folded").subquery()


def in_waiting_window(name: str, window: WindowSpec, start: exp.Column) -> exp.Expr:
    """Whether the window starting at ``start`` holds unreduced partial rows: checked only
    once a partial row waits, and with one comparison for a window older than the oldest
    such (as view_query checks its consolidated rows)."""
    return exp.and_(
        _waiting(name),
        exp.GTE(this=start.copy(), expression=_oldest_touched(name, window)),
        _is_touched(name, window, start),
    )


def _consolidated_columns(split: SplitQuery, window: WindowSpec) -> list[tuple[str, str]]:
    columns = [(naming.WINDOW_START_COLUMN, "timestamptz")]
    if not window.is_global:
        columns.append((naming.WINDOW_END_COLUMN, "timestamptz"))
    columns += [(k.column, k.type.pg()) for k in split.keys]
    columns += [(naming.final_column(i), a.result_type) for i, a in enumerate(split.aggregates)]
    return columns


def _states_columns(split: SplitQuery) -> list[tuple[str, str]]:
    columns = [(naming.WINDOW_START_COLUMN, "timestamptz")]
    columns += [(k.column, k.type.pg()) for k in split.keys]
    columns += [(s.column, s.pg_type) for a in split.aggregates for s in a.states]
    return columns


def _window_end(window: WindowSpec) -> exp.Expr:
    return exp.Add(
        this=exp.column(naming.WINDOW_START_COLUMN),
        expression=fixed_interval(window.size_us),
    )


def _over_finals(expression: exp.Expr, split: SplitQuery, window: WindowSpec) -> exp.Expr:
    """``expression`` (a view item over partial rows) over a consolidated row instead: each
    aggregate's final and the window end as the row keeps them."""
    end = None if window.is_global else _window_end(window)

    def swap(node: exp.Expr) -> exp.Expr:
        for index, aggregate in enumerate(split.aggregates):
            if node == aggregate.final:
                return exp.column(naming.final_column(index))
        if end is not None and node == end:
            return exp.column(naming.WINDOW_END_COLUMN)
        return node

    return expression.copy().transform(swap)


def _touched(name: str, window: WindowSpec) -> exp.Select:
    """The windows holding unreduced partial rows (late data the reducer has not folded
    yet): a consolidated row of such a window is merged on read. The stream's function
    (rewriter.ddl.create_windows_function) finds their starts by skipping through the
    partial archive's index, one probe per window; for HOP, each is every window holding
    the pane. Filtered with IN and NOT IN, which PostgreSQL evaluates once, as a hash the
    consolidated rows probe. ``SELECT DISTINCT`` over the archive instead read every
    unreduced row on every read: with a fifth of a day of 1,000 campaigns late (288,000
    partial rows), one campaign's hour took 24 ms, 3.4 ms with the function. A recursive
    query in the view itself would find them as fast but is parallel-restricted, which
    cost caught-up views 1.3-1.8x; a correlated EXISTS / NOT EXISTS (index probes per
    consolidated row) made PostgreSQL plan a merge anti-join without parallel workers."""
    call = function_call(naming.waiting_windows_function(name))
    if window.is_hop:
        return _expanded(call, [], window).distinct()
    return exp.select(exp.column(naming.WINDOW_START_COLUMN, table="w")).from_(
        exp.alias_(call, "w", table=True)
    )


def _oldest_touched(name: str, window: WindowSpec) -> exp.Subquery:
    """The start of the oldest window holding unreduced partial rows (NULL when none does),
    from the partial archive's index in one probe: its oldest pane's, for HOP the first of
    the windows holding that pane."""
    start = naming.WINDOW_START_COLUMN
    first = exp.select(exp.alias_(exp.Min(this=exp.column(start)), start)).from_(
        table(naming.partial_archive_table(name))
    )
    if not window.is_hop:
        return first.subquery()
    windows = _expanded(first.subquery(), [], window).subquery("t")
    return exp.select(exp.Min(this=exp.column(start, table="t"))).from_(windows).subquery()


def _waiting(name: str) -> exp.Exists:
    """Whether any partial row waits for the reducer: a check PostgreSQL makes once per read
    (an initial plan), before the windows' function, which caught up is never called."""
    return exp.Exists(
        this=exp.select(exp.Literal.number(1)).from_(table(naming.partial_archive_table(name)))
    )


def _is_touched(name: str, window: WindowSpec, start: exp.Column) -> exp.In:
    """Whether the window starting at ``start`` holds unreduced partial rows."""
    return exp.In(this=start, query=_touched(name, window).subquery())


def _in_touched(name: str, window: WindowSpec) -> exp.Expr:
    """Whether a consolidated row's window (``c.window_start``) is touched, once a partial
    row waits."""
    start = exp.column(naming.WINDOW_START_COLUMN, table="c")
    return exp.and_(_waiting(name), _is_touched(name, window, start))


def view_query(name: str, split: SplitQuery, window: WindowSpec) -> exp.Query:
    """The consolidating view. Windows whose partial rows are all reduced read the
    consolidated table's final values as they are, like a plain table (a filter on the window
    end is an index condition there); windows that also hold unreduced partial rows (late
    data the reducer has not folded yet) merge both on read. Reader and reducer see one
    snapshot, and each fold is one statement leaving one consolidated row per window and
    group, so every read is exact.

    The consolidated rows of the windows merged on read are left out by a filter over the
    UNION ALL of both branches, on a window start and a flag each branch carries under the
    outputs, not by a WHERE in the first branch: PostgreSQL flattens a UNION ALL branch
    without WHERE into the query (the consolidated table is scanned as a plain table is),
    and runs one with a WHERE as a subquery, whose scan node cost every caught-up read of a
    day of 1,000 campaigns 13% more (59 against 51 ms for a sum over every row)."""
    outputs = list(split.outputs)
    if window.is_global and not split.keys:
        # Without a window and keys the aggregate has one row even over no rows, as in
        # PostgreSQL, where the counts are 0 (their finals sum no partial rows: NULL).
        counts = [a.final for a in split.aggregates if a.rule in _COUNTS]
        merged = exp.select(
            *(exp.alias_(_zero_counts(e, counts), n, quoted=True) for n, e in outputs)
        ).from_(exp.alias_(partial_rows(name, split, window), "partials", table=True))
        return merged.having(split.having) if split.having is not None else merged
    window_start, stored = naming.VIEW_WINDOW_COLUMN, naming.VIEW_STORED_COLUMN
    reduced = exp.select(
        *(exp.alias_(_over_finals(e, split, window), n, quoted=True) for n, e in outputs),
        exp.alias_(exp.column(naming.WINDOW_START_COLUMN, table="c"), window_start, quoted=True),
        exp.alias_(exp.true(), stored, quoted=True),
    ).from_(exp.alias_(table(naming.consolidated_table(name)), "c", table=True))
    if split.having is not None:
        reduced = reduced.where(_over_finals(split.having, split, window))
    merged = (
        exp.select(
            *(exp.alias_(e, n, quoted=True) for n, e in outputs),
            exp.alias_(exp.column(naming.WINDOW_START_COLUMN), window_start, quoted=True),
            exp.alias_(exp.false(), stored, quoted=True),
        )
        .from_(exp.alias_(waiting_rows(name, split, window), "partials", table=True))
        .group_by(*_group_columns(split))
    )
    if split.having is not None:
        merged = merged.having(split.having)
    # Which rows are consolidated rows of windows merged on read: a row of an older window
    # than the oldest of them is not, found with one comparison where a hash probe would
    # follow; while a live system's newest window waits for its next fold, that is nearly
    # every row.
    start = exp.column(window_start, table="v", quoted=True)
    merged_windows = exp.and_(
        _waiting(name),
        exp.GTE(this=start.copy(), expression=_oldest_touched(name, window)),
        _is_touched(name, window, start.copy()),
    )
    return (
        exp.select(*(exp.column(n, table="v", quoted=True) for n, _ in outputs))
        .from_(exp.union(reduced, merged, distinct=False).subquery("v"))
        .where(
            exp.Not(
                this=exp.paren(exp.and_(exp.column(stored, table="v", quoted=True), merged_windows))
            )
        )
    )


_COUNTS = ("count(*)", "count", "count(DISTINCT)", "approx_count_distinct")


def _zero_counts(expression: exp.Expr, counts: list[exp.Expr]) -> exp.Expr:
    if any(expression == c for c in counts):
        return exp.Coalesce(this=expression.copy(), expressions=[exp.Literal.number(0)])
    copy = expression.copy()
    for child in list(copy.iter_expressions()):
        child.replace(_zero_counts(child, counts))
    return copy


def reduce_query(name: str, split: SplitQuery) -> str:
    """Partial rows -> one partial row per window and group (still in partial form)."""
    states = [
        exp.alias_(exp.func(s.reduce, exp.column(s.column)), s.column)
        for a in split.aggregates
        for s in a.states
    ]
    query = (
        exp.select(*_group_columns(split), *states)
        .from_(table(naming.partial_archive_table(name)))
        .group_by(*_group_columns(split))
    )
    return query.sql("postgres")


def reduce_statement(
    name: str,
    split: SplitQuery,
    window: WindowSpec,
    also: Sequence[tuple[str, exp.Expr]] = (),
) -> str:
    """The reducer's statement: move the partial rows of at most %(max_groups)s panes that
    hold more than %(min_rows)s partial rows (the oldest first) into the consolidated
    tables, merged with what they hold for the panes' windows: one row per window and group
    with each aggregate's final value (what the view reads), and the same in partial form
    (what later late data of the window merges with). ``also``: more steps (name, data
    modifying statement) that keep rows derived from the rewritten windows in step, over
    ``placed`` (the windows' new partial rows) and ``folded`` (their states).

    One statement, so one transaction: a view sees the rows before or after, never half.
    Rows that commit while it runs are not in its snapshot and stay as they are. What the
    fold takes out of the consolidated tables is every row of the (window, group) pairs it
    writes (``_rewritten``), so a window never has two consolidated rows for a group: the
    pairs of ``placed`` when the stream has keys and nothing else derives rows from whole
    windows (``also``), else every group of ``placed``'s windows.
    """
    archive = table(naming.partial_archive_table(name))
    start = naming.WINDOW_START_COLUMN
    targets = (
        exp.select(exp.column(start))
        .from_(archive.copy())
        .group_by(exp.column(start))
        .having(
            exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Placeholder(this="min_rows"))
        )
        .order_by(exp.column(start))
        .limit(exp.Placeholder(this="max_groups"))
    )
    gone = exp.Delete(
        this=exp.alias_(archive.copy(), "p", table=True),
        using=[exp.table_("targets")],
        where=exp.Where(
            this=exp.EQ(
                this=exp.column(start, table="p"), expression=exp.column(start, table="targets")
            )
        ),
        returning=exp.Returning(
            expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier("p"))]
        ),
    )
    columns = _state_columns(split)
    if window.is_hop:
        placed: exp.Expr = _expanded(
            exp.table_("gone"), [c for c in columns if c != start], window
        ).subquery("placed")
    else:
        placed = exp.table_("gone")
    by_group = bool(split.keys) and not also
    kept_steps, replaced_steps = _rewritten(name, split, window, columns, by_group=by_group)
    merged_rows = exp.union(
        exp.select(*(exp.column(c) for c in columns)).from_("placed"),
        *(exp.select(*(exp.column(c) for c in columns)).from_(alias) for alias, _ in kept_steps),
        distinct=False,
    ).subquery("merged")
    states = [s for a in split.aggregates for s in a.states]
    folded = (
        exp.select(
            *_group_columns(split),
            *(exp.alias_(exp.func(s.reduce, exp.column(s.column)), s.column) for s in states),
            *(
                exp.alias_(a.final.copy(), naming.final_column(i))
                for i, a in enumerate(split.aggregates)
            ),
        )
        .from_(merged_rows)
        .group_by(*_group_columns(split))
        .order_by(*_group_columns(split))
    )
    # Both tables in window and key order (sorted once, in folded), so that a window's rows
    # are a range of pages: the merge on read fetches a waiting window's states through
    # the index on the window start, which over states in the fold's hash order touched a
    # page per row (a fifth of a day of 1,000 campaigns late: 290,000 pages a read).
    states_columns = [c for c, _ in _states_columns(split)]
    store_states = exp.insert(
        exp.select(*(exp.column(c) for c in states_columns))
        .from_("folded")
        .order_by(*_group_columns(split)),
        table(naming.consolidated_states_table(name)),
        columns=states_columns,
    )
    final_columns = [c for c, _ in _consolidated_columns(split, window)]
    finals = exp.select(
        *(
            _window_end(window) if c == naming.WINDOW_END_COLUMN else exp.column(c)
            for c in final_columns
        )
    ).from_("folded")
    # In window order, so that a time range of the table is a range of its pages.
    finals = finals.order_by(*_group_columns(split))
    statement = exp.insert(finals, table(naming.consolidated_table(name)), columns=final_columns)
    ctes: list[tuple[str, exp.Expr]] = [
        ("targets", targets),
        ("gone", gone),
        ("placed", exp.select(exp.Star()).from_(placed)),
        *kept_steps,
        *replaced_steps,
        ("folded", folded),
        ("stored", store_states),
        *_unlisted(archive),
        *also,
    ]
    for alias, query in ctes:
        statement = statement.with_(alias, as_=query)
    return statement.sql("postgres")


def _rewritten(
    name: str, split: SplitQuery, window: WindowSpec, columns: list[str], *, by_group: bool
) -> tuple[list[tuple[str, exp.Expr]], list[tuple[str, exp.Expr]]]:
    """The fold's steps that take out of the consolidated tables what it rewrites: from the
    states (returning them, to merge with ``placed``) and from the finals.

    Without ``by_group``, every group of ``placed``'s windows, found by the window start.
    With it, only the (window, group) pairs of ``placed``, found by equality through the
    indexes (the states' on window start and keys, the finals' on window end and keys):
    a late run touching five groups of a window of a million rewrites five rows, and a
    long window receiving runs in order is not rewritten whole at every pass. Equality
    never matches a NULL key, and comparing keys NULL-safely is a join filter, row by row
    (a wide window took minutes that way): so a window where ``placed`` has a group with a
    NULL key is rewritten whole, by the window start, in a step of its own, and the
    group step leaves it out (each row is taken out by one step)."""
    start = naming.WINDOW_START_COLUMN
    keys = [k.column for k in split.keys]
    states = table(naming.consolidated_states_table(name))
    finals = table(naming.consolidated_table(name))
    returning = exp.Returning(expressions=[exp.column(c, table="c") for c in columns])

    def any_null(alias: str | None = None) -> exp.Expr:
        return exp.or_(
            *(exp.Is(this=exp.column(k, table=alias), expression=exp.Null()) for k in keys)
        )

    whole = exp.select(exp.column(start)).distinct().from_("placed")
    if by_group:
        whole = whole.where(any_null())
    whole_steps = _taken_out(states, finals, returning, whole.subquery("changed"), [start])
    if not by_group:
        return [("kept", whole_steps[0])], [("replaced", whole_steps[1])]
    null_window = (
        exp.select(exp.Literal.number(1))
        .from_(exp.alias_(exp.table_("placed"), "n", table=True))
        .where(
            exp.and_(
                exp.EQ(this=exp.column(start, table="n"), expression=exp.column(start, table="g")),
                any_null("n"),
            )
        )
    )
    groups = (
        exp.select(*(exp.column(c, table="g") for c in (start, *keys)))
        .distinct()
        .from_(exp.alias_(exp.table_("placed"), "g", table=True))
        .where(exp.Not(this=exp.Exists(this=null_window)))
    )

    # The finals' index leads with the window end, then the keys (but for the global
    # window's, on its start and keys).
    end = None if window.is_global else _window_end(window)
    group_steps = _taken_out(
        states,
        finals,
        returning,
        groups.subquery("changed"),
        [start, *keys],
        end,
        finals_of=exp.alias_(exp.table_("kept"), "changed", table=True),
    )
    return (
        [("kept", group_steps[0]), ("kept_whole", whole_steps[0])],
        [("replaced", group_steps[1]), ("replaced_whole", whole_steps[1])],
    )


def _taken_out(
    states: exp.Table,
    finals: exp.Table,
    returning: exp.Returning,
    changed: exp.Subquery,
    matched: list[str],
    end: exp.Expr | None = None,
    *,
    finals_of: exp.Expr | None = None,
) -> tuple[exp.Delete, exp.Delete]:
    """The deletes of the states (returning them) and of the finals whose columns
    ``matched`` equal those of ``changed``; a final's window start found by its window end,
    ``end`` (over the window start), when given. With ``finals_of`` (the states' delete,
    named ``changed``), the finals are looked up only for the states it took out: a fold
    writes a (window, group)'s state and final row together and nothing else writes
    either, so a pair has a final row exactly when it has a state row, and a fold of new
    groups (every record its own group, as HiBench's repartition) does not probe the
    finals' index for rows that are not there."""
    start = naming.WINDOW_START_COLUMN

    def where(alias: str, by_end: exp.Expr | None) -> exp.Where:
        conditions: list[exp.Expr] = []
        for c in matched:
            if c == start and by_end is not None:
                at_end = by_end.transform(
                    lambda n: (
                        exp.column(n.name, table="changed") if isinstance(n, exp.Column) else n
                    )
                )
                place = exp.column(naming.WINDOW_END_COLUMN, table=alias)
                conditions.append(exp.EQ(this=place, expression=at_end))
            else:
                conditions.append(
                    exp.EQ(
                        this=exp.column(c, table=alias), expression=exp.column(c, table="changed")
                    )
                )
        return exp.Where(this=exp.and_(*conditions))

    kept = exp.Delete(
        this=exp.alias_(states.copy(), "c", table=True),
        using=[changed.copy()],
        where=where("c", None),
        returning=returning.copy(),
    )
    replaced = exp.Delete(
        this=exp.alias_(finals.copy(), "f", table=True),
        using=[changed.copy() if finals_of is None else finals_of],
        where=where("f", end),
    )
    return kept, replaced


def _unlisted(archive: exp.Table) -> list[tuple[str, exp.Expr]]:
    """The fold's step that unlists the windows it empties from the table of waiting
    windows: those it folds (``targets``) and those listed without a partial row (a fold
    that skipped them). A run that lists a window again while the fold runs writes a new
    version of its row (sql/006_waiting_windows.sql): if it has not committed, the row is
    locked and the fold skips it (SKIP LOCKED: the fold never waits for a commit, which
    may wait for the fold's rows); if it committed after the fold's snapshot, the fold
    locks the new version, whose ctid the DELETE's snapshot does not see, so the row stays
    listed. Runs after the main statement (a data-modifying step nothing reads), so after
    ``gone``."""
    start = naming.WINDOW_START_COLUMN
    listed = exp.table_(naming.WAITING_WINDOWS_TABLE, db=naming.INTERNAL_SCHEMA)
    rows_left = (
        exp.select(exp.Literal.number(1))
        .from_(exp.alias_(archive.copy(), "a", table=True))
        .where(exp.EQ(this=exp.column(start, table="a"), expression=exp.column(start, table="l")))
    )
    emptied = (
        exp.select(exp.column("ctid", table="l"))
        .from_(exp.alias_(listed.copy(), "l", table=True))
        .where(
            exp.EQ(
                this=exp.column(naming.WAITING_ARCHIVE_COLUMN, table="l"),
                expression=archive_oid(archive),
            )
        )
        .where(
            exp.or_(
                exp.In(
                    this=exp.column(start, table="l"),
                    query=exp.select(exp.column(start)).from_("targets").subquery(),
                ),
                exp.Not(this=exp.Exists(this=rows_left)),
            )
        )
    )
    emptied.set("locks", [exp.Lock(update=True, expressions=[exp.to_table("l")], wait=False)])
    unlisted = exp.delete(
        exp.alias_(listed.copy(), "w", table=True),
        where=exp.In(this=exp.column("ctid", table="w"), query=emptied.subquery()),
    )
    return [("unlisted", unlisted)]


def consolidated_statements(
    name: str, split: SplitQuery, window: WindowSpec, *, if_not_exists: bool = False
) -> tuple[str, ...]:
    """The consolidated table and its indexes: on the window start (the reducer and the
    merge on read find windows by it), on the window end and keys (a dashboard's time
    filter, and its filter on a key) and on the keys and window end (a filter on a key
    alone, or a key's time range: one range of the index, where the index on the window
    end skips through every window); without a window, on the keys."""
    target = table(naming.consolidated_table(name))
    states = table(naming.consolidated_states_table(name))
    not_null = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)
    tables = [
        create_table(
            t,
            [column_def(c, pg, not_null=c in not_null) for c, pg in columns],
            if_not_exists=if_not_exists,
        )
        for t, columns in (
            (target, _consolidated_columns(split, window)),
            (states, _states_columns(split)),
        )
    ]
    keys = [exp.column(k.column) for k in split.keys]
    start = exp.column(naming.WINDOW_START_COLUMN)
    indexed: list[tuple[str, exp.Table, list[exp.Expr]]] = [
        ("state_window", states, [start, *(k.copy() for k in keys)])
    ]
    if window.is_global:
        indexed.append(("window", target, [start.copy(), *keys]))
    else:
        indexed.append(("window", target, [start.copy()]))
        indexed.append(("end", target, [exp.column(naming.WINDOW_END_COLUMN), *keys]))
        if keys:
            key_end: list[exp.Expr] = [
                *(k.copy() for k in keys),
                exp.column(naming.WINDOW_END_COLUMN),
            ]
            indexed.append(("key_end", target, key_end))
    indexes = [
        create_index(
            naming.consolidated_index(name, purpose), on, columns, if_not_exists=if_not_exists
        )
        for purpose, on, columns in indexed
    ]
    return (*tables, *indexes)


def build_views(name: str, split: SplitQuery, window: WindowSpec) -> ParallelAggregatePlan:
    archive = table(naming.partial_archive_table(name))
    partial_columns = _partial_columns(split)
    create_archive = create_table(
        archive,
        [
            column_def(c, t, not_null=c in (naming.RUN_COLUMN, naming.WINDOW_START_COLUMN))
            for c, t in partial_columns
        ],
    )
    index = create_index(naming.partial_window_index(name), archive, _group_columns(split))
    view = view_query(name, split, window)
    consolidated = consolidated_statements(name, split, window)
    source = window.source
    if isinstance(source, WindowedAggregatePlan):
        raw_sources = source.raw_sources
        input_view = naming.partial_view(source.name)
        time_column = naming.WINDOW_START_COLUMN  # the lower window's start places it
        reason = (
            f"rolled up onto the partials of {source.name!r} with the reduce aggregate "
            "(partial per run in Spark, final on read in PostgreSQL)"
        )
    elif isinstance(source, ProjectionStreamPlan):
        raw_sources = source.raw_sources
        input_view = naming.projection_view(source.name)
        time_column = window.time_column
        reason = (
            f"every aggregate is decomposable; computed per run of {', '.join(raw_sources)} "
            f"through {source.name!r}"
        )
    elif isinstance(source, JoinStreamPlan):
        raw_sources = source.raw_sources
        input_view = naming.join_view(source.name)
        time_column = window.time_column
        reason = (
            "every aggregate is decomposable; computed per run over the rows each run adds "
            f"to the join {source.name!r}"
        )
    else:
        raw_sources = (source.name,)
        input_view = naming.RUN_ROWS_VIEW
        time_column = window.time_column
        reason = (
            "every aggregate is decomposable (partial per run in Spark, final on read in "
            "PostgreSQL)"
        )
    return ParallelAggregatePlan(
        name=name,
        source=source.name,
        window=window.describe(),
        window_size_us=window.size_us,
        window_slide_us=window.slide_us,
        pane_us=window.pane_us,
        parallelism_reason=reason,
        partial_query=partial_query(split, input_view, time_column, window.pane_us),
        partial_input=input_view,
        partial_columns=tuple(partial_columns),
        create_statements=(
            create_archive,
            index,
            *consolidated,
            create_windows_function(naming.waiting_windows_function(name), archive),
            create_waiting_trigger(archive),
            create_view(name, view),
        ),
        drop_statements=(
            drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),
            drop("FUNCTION", table(naming.waiting_windows_function(name))),
            unlist_waiting(archive),
            drop("TABLE", archive),
            drop("TABLE", table(naming.consolidated_table(name))),
            drop("TABLE", table(naming.consolidated_states_table(name))),
        ),
        reduce_query=reduce_query(name, split),
        reduce_statement=reduce_statement(name, split, window),
        view_query=view.sql("postgres"),
        outputs=tuple(_output(n, e, split) for n, e in split.outputs),
        aggregates=tuple(
            PlannedAggregate(
                rule=a.rule,
                states=tuple(
                    AggregateState(s.name, s.column, s.pg_type, s.reduce) for s in a.states
                ),
                result_type=a.result_type,
                arg_type=a.arg_type,
            )
            for a in split.aggregates
        ),
        raw_sources=raw_sources,
    )


def _output(name: str, expression: exp.Expr, split: SplitQuery) -> OutputColumn:
    """What a view column is, for the streams that will be built on this one."""
    for index, aggregate in enumerate(split.aggregates):
        if expression == aggregate.final:
            return OutputColumn(name, aggregate.result_type, "aggregate", str(index))
    if isinstance(expression, exp.Column):
        if expression.name == naming.WINDOW_START_COLUMN:
            return OutputColumn(name, "timestamptz", "window_start")
        key = next((k for k in split.keys if k.column == expression.name), None)
        if key is not None:
            return OutputColumn(name, key.type.pg(), "key", key.column)
    if (
        isinstance(expression, exp.Add)
        and isinstance(expression.this, exp.Column)
        and expression.this.name == naming.WINDOW_START_COLUMN
    ):
        return OutputColumn(name, "timestamptz", "window_end")
    if isinstance(expression, exp.Cast):
        return OutputColumn(name, expression.to.sql("postgres").lower())
    return OutputColumn(name, None)
