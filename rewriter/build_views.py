"""Pass 4b: the plan of a derived stream: Spark partial query, partial archive, view, reduce."""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.build_archive import column_def, create_table, create_view, drop, table
from rewriter.plan import DerivedStreamPlan, OutputColumn
from rewriter.resolve_window import WindowSpec
from rewriter.split_aggregates import SplitQuery


def window_start_spark(time_column: str, size_us: int) -> exp.Expr:
    """Start of the epoch-aligned window holding ``time_column``, computed in microseconds."""
    micros = exp.func("unix_micros", exp.column(time_column, quoted=True))
    offset = exp.func("pmod", micros.copy(), exp.Literal.number(size_us))
    return exp.func("timestamp_micros", exp.Sub(this=micros, expression=offset))


def partial_query(split: SplitQuery, window: WindowSpec) -> str:
    """Spark SQL computing one partial row per run, window and group over a batch of runs."""
    start = window_start_spark(window.time_column, window.size_us)
    run = exp.column(naming.RUN_COLUMN, quoted=True)
    projections: list[exp.Expr] = [
        run,
        exp.alias_(start, naming.WINDOW_START_COLUMN, quoted=True),
    ]
    projections += [exp.alias_(k.spark, k.column, quoted=True) for k in split.keys]
    projections += [
        exp.alias_(s.spark, s.column, quoted=True) for a in split.aggregates for s in a.states
    ]
    query = exp.select(*projections).from_(exp.table_(naming.RUN_ROWS_VIEW))
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


def view_query(name: str, split: SplitQuery) -> exp.Select:
    """The consolidating view: final aggregates over all partial rows of a window and group."""
    query = exp.select(*(exp.alias_(e, n, quoted=True) for n, e in split.outputs)).from_(
        table(naming.partial_archive_table(name))
    )
    query = query.group_by(*_group_columns(split))
    if split.having is not None:
        query = query.having(split.having)
    return query


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


def build_views(name: str, split: SplitQuery, window: WindowSpec) -> DerivedStreamPlan:
    archive = table(naming.partial_archive_table(name))
    partial_columns = _partial_columns(split)
    create_archive = create_table(
        archive,
        [
            column_def(c, t, not_null=c in (naming.RUN_COLUMN, naming.WINDOW_START_COLUMN))
            for c, t in partial_columns
        ],
    )
    index = exp.Create(
        this=exp.Index(
            this=exp.to_identifier(f"{naming.partial_archive_table(name)}_window"),
            table=archive.copy(),
            params=exp.IndexParameters(
                columns=[exp.Ordered(this=c) for c in _group_columns(split)]
            ),
        ),
        kind="INDEX",
    ).sql("postgres")
    view = view_query(name, split)
    result_types = {a.call: a.result_type for a in split.aggregates}
    outputs = tuple(OutputColumn(n, _output_type(e, split, result_types)) for n, e in split.outputs)
    return DerivedStreamPlan(
        name=name,
        source=window.source.name,
        window=window.describe(),
        window_size_us=window.size_us,
        parallelism="PP",
        parallelism_reason=(
            "every aggregate is decomposable (partial per run in Spark, final on read in "
            "PostgreSQL)"
        ),
        partial_query=partial_query(split, window),
        partial_columns=tuple(partial_columns),
        create_statements=(create_archive, index, create_view(name, view)),
        drop_statements=(
            drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),
            drop("TABLE", archive),
        ),
        reduce_query=reduce_query(name, split),
        view_query=view.sql("postgres"),
        outputs=outputs,
    )


def _output_type(
    expression: exp.Expr, split: SplitQuery, result_types: dict[str, str]
) -> str | None:
    if isinstance(expression, exp.Cast):
        return expression.to.sql("postgres").lower()
    if isinstance(expression, exp.Column):
        if expression.name == naming.WINDOW_START_COLUMN:
            return "timestamptz"
        key = next((k for k in split.keys if k.column == expression.name), None)
        return key.type.pg() if key else None
    if isinstance(expression, exp.Add) and isinstance(expression.this, exp.Column):
        return "timestamptz" if expression.this.name == naming.WINDOW_START_COLUMN else None
    return None
