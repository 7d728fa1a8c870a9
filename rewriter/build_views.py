"""Pass 4b: the plan of a derived stream: Spark partial query, partial archive, view, reduce."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import column_def, create_index, create_table, create_view, drop, table
from rewriter.plan import (
    AggregateState,
    JoinStreamPlan,
    OutputColumn,
    ParallelAggregatePlan,
    PlannedAggregate,
    ProjectionStreamPlan,
    WindowedAggregatePlan,
)
from rewriter.resolve_window import WindowSpec
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


def partial_rows(name: str, split: SplitQuery, window: WindowSpec) -> exp.Expr:
    """The partial rows a view consolidates, one per window (not yet aliased): the partial
    archive itself for TUMBLE; for HOP, each pane's partial rows once for every window that
    contains the pane (strata_hop_windows in sql/), so overlapping windows share the panes'
    partials."""
    source: exp.Expr = table(naming.partial_archive_table(name))
    if not window.is_hop:
        return source
    columns = [c for c, _ in _partial_columns(split) if c != naming.WINDOW_START_COLUMN]
    windows = exp.func(
        "strata_hop_windows",
        exp.column(naming.WINDOW_START_COLUMN, table="p"),
        exp.Literal.number(window.pane_us),
        exp.Literal.number(window.slide_us),
        exp.Literal.number(window.size_us),
    )
    expanded = (
        exp.select(
            exp.column(naming.WINDOW_START_COLUMN, table="w"),
            *(exp.column(c, table="p") for c in columns),
        )
        .from_(exp.alias_(source, "p"))
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
    return expanded.subquery()


def view_query(name: str, split: SplitQuery, window: WindowSpec) -> exp.Select:
    """The consolidating view: final aggregates over all partial rows of a window and group."""
    source = partial_rows(name, split, window)
    if window.is_hop:
        source = exp.alias_(source, exp.to_identifier("panes"))
    outputs = [(n, e) for n, e in split.outputs]
    if window.is_global and not split.keys:
        # Without a window and keys the aggregate has one row even over no rows, as in
        # PostgreSQL, where the counts are 0 (their finals sum no partial rows: NULL).
        counts = [a.final for a in split.aggregates if a.rule in _COUNTS]
        outputs = [(n, _zero_counts(e, counts)) for n, e in outputs]
    query = exp.select(*(exp.alias_(e, n, quoted=True) for n, e in outputs)).from_(source)
    if not (window.is_global and not split.keys):
        query = query.group_by(*_group_columns(split))
    if split.having is not None:
        query = query.having(split.having)
    return query


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


def reduce_statement(name: str, split: SplitQuery) -> str:
    """The reducer's statement: fold the partial rows of (window, group)s holding more than
    %(min_rows)s rows into one row each, still in partial form, at most %(max_groups)s
    groups at a time.

    One statement, so one transaction: a view sees the rows before or after, never half
    (the reduce aggregate over the folded rows merges to the same final value). Rows that
    commit while it runs are not in its snapshot and stay as they are. The folded row
    belongs to no run (REDUCED_RUN).
    """
    archive = table(naming.partial_archive_table(name))
    groups = [naming.WINDOW_START_COLUMN, *(k.column for k in split.keys)]
    targets = (
        exp.select(*(exp.column(c) for c in groups))
        .from_(archive.copy())
        .group_by(*(exp.column(c) for c in groups))
        .having(
            exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Placeholder(this="min_rows"))
        )
        .limit(exp.Placeholder(this="max_groups"))
    )
    matches = [
        exp.EQ(
            this=exp.column(naming.WINDOW_START_COLUMN, table="p"),
            expression=exp.column(naming.WINDOW_START_COLUMN, table="targets"),
        ),
        *(match for k in split.keys for match in _null_safe_match(k.column)),
    ]
    gone = exp.Delete(
        this=exp.alias_(archive.copy(), "p", table=True),
        using=[exp.table_("targets")],
        where=exp.Where(this=exp.and_(*matches)),
        returning=exp.Returning(
            expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier("p"))]
        ),
    )
    states = [s for a in split.aggregates for s in a.states]
    folded = (
        exp.select(
            exp.Literal.number(naming.REDUCED_RUN),
            *(exp.column(c) for c in groups),
            *(exp.func(s.reduce, exp.column(s.column)) for s in states),
        )
        .from_("gone")
        .group_by(*(exp.column(c) for c in groups))
    )
    columns = [naming.RUN_COLUMN, *groups, *(s.column for s in states)]
    statement = exp.insert(folded, archive.copy(), columns=columns)
    statement = statement.with_("targets", as_=targets).with_("gone", as_=gone)
    return statement.sql("postgres")


def _null_safe_match(column: str) -> list[exp.Expression]:
    """``p.column`` and ``targets.column`` are the same group key, NULL keys a group of their
    own, as equalities PostgreSQL can hash or merge on: ``IS NOT DISTINCT FROM`` cannot, so
    with one wide window and many groups the join compared every target with every row of
    the window (ten thousand targets by 300K rows took minutes). Keys compare by their text,
    which equal values of a column share but for numerics of different scales
    (1.5, 1.50): those rows are left for a later fold, never folded wrongly, as the
    statement re-inserts exactly the rows it deleted."""

    def sides(build: Callable[[exp.Column], exp.Expression]) -> exp.Expression:
        return exp.EQ(
            this=build(exp.column(column, table="p")),
            expression=build(exp.column(column, table="targets")),
        )

    return [
        sides(lambda c: exp.Paren(this=exp.Is(this=c, expression=exp.Null()))),
        sides(
            lambda c: exp.Coalesce(this=exp.cast(c, "text"), expressions=[exp.Literal.string("")])
        ),
    ]


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
        create_statements=(create_archive, index, create_view(name, view)),
        drop_statements=(
            drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),
            drop("TABLE", archive),
        ),
        reduce_query=reduce_query(name, split),
        reduce_statement=reduce_statement(name, split),
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
