"""Pass 4c: a serial (SP) stream: the query, as written, over the consolidated source.

A gather point (seeds/003: MAX over COUNT, a HAVING or WHERE on final values, DISTINCT
over aggregates) cannot stay partial. Until the workers materialize serial streams when
their windows close, a serial stream is a PostgreSQL view running the user's query over
the source's view (final values), with the windows recomputed from the source's window
start: correct on read, whatever arrived late.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.build_archive import create_view, drop, table
from rewriter.errors import UnsupportedSQL
from rewriter.plan import DerivedStreamPlan, OutputColumn, RawStreamPlan
from rewriter.registry import exact_in_postgres
from rewriter.resolve_window import WindowSpec, interval_text
from rewriter.split_aggregates import output_name


def _interval(size_us: int) -> exp.Interval:
    return exp.Interval(this=exp.Literal.string(interval_text(size_us)))


def _source_window_start(window: WindowSpec) -> exp.Expr:
    """Each source row's time, moved to the start of its source window."""
    source = window.source
    column = exp.column(window.time_column, table="src", quoted=True)
    if isinstance(source, DerivedStreamPlan):
        output = source.output(window.time_column)
        if output is not None and output.role == "window_end":
            return exp.Sub(this=column, expression=_interval(source.window_size_us))
    return column


def build_serial(
    name: str, select: exp.Select, window: WindowSpec, reason: str
) -> DerivedStreamPlan:
    if window.is_hop:
        raise UnsupportedSQL(f"HOP windows are not supported in a serial stream ({reason})")
    start = exp.func(
        "strata_window_start", _source_window_start(window), exp.Literal.number(window.size_us)
    )

    def place(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table:
            if node.name == naming.WINDOW_START_COLUMN:
                return start.copy()
            if node.name == naming.WINDOW_END_COLUMN:
                return exp.Add(this=start.copy(), expression=_interval(window.size_us))
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
    source = window.source
    raw_sources = source.raw_sources if not isinstance(source, RawStreamPlan) else (source.name,)
    return DerivedStreamPlan(
        name=name,
        source=source.name,
        window=window.describe(),
        window_size_us=window.size_us,
        window_slide_us=window.slide_us,
        pane_us=window.pane_us,
        parallelism="SP",
        parallelism_reason=f"serial: {reason}",
        partial_query="",
        partial_input="",
        partial_columns=(),
        create_statements=(create_view(name, named),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        reduce_query="",
        reduce_statement="",
        view_query=named.sql("postgres"),
        outputs=tuple(outputs),
        aggregates=(),
        raw_sources=raw_sources,
    )
