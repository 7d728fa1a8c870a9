"""Pass 3c: a stream without aggregates: selection, computed columns, UNION ALL (seeds/004).

Every branch is ``SELECT expressions FROM raw_stream [WHERE conditions]``; branches of a
UNION ALL have the same column names and types. The stream keeps its sources' event time:
the output column that is, in every branch, the source's event-time column itself, or,
when no branch selects it (Nexmark q2: ``SELECT auction, price FROM bid WHERE ...``), a
column of its own (naming.HIDDEN_EVENT_TIME) that the branches compute and the view does
not show. It is a view over the raw views in PostgreSQL; a windowed aggregate over it
runs, per run of each source, over that source's branch (Spark SQL over the run's rows).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import check_clauses, output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.expressions import BOOLEAN, infer_type, to_spark
from rewriter.plan import ProjectionBranch, ProjectionStreamPlan, RawStreamPlan, StreamPlan
from rewriter.types import ColumnSpec


def is_projection(query: exp.Expr) -> bool:
    """A derived stream without a window and aggregates (a plain SELECT or a UNION ALL)."""
    if isinstance(query, exp.Union):
        return True
    if not isinstance(query, exp.Select):
        return False
    from_ = query.args.get("from_")
    source = from_.this if from_ is not None else None
    windowed = isinstance(source, exp.Table) and isinstance(source.this, exp.Anonymous)
    return not windowed and not query.args.get("group") and not query.find(exp.AggFunc)


def _branches(query: exp.Expr) -> list[exp.Select]:
    if isinstance(query, exp.Union):
        if query.args.get("distinct"):
            raise UnsupportedSQL("UNION removes duplicates across runs; use UNION ALL")
        return _branches(query.this) + _branches(query.expression)
    if not isinstance(query, exp.Select):
        raise UnsupportedSQL(f"{type(query).__name__.upper()} is not supported in a stream")
    return [query]


def build_projection(
    name: str, query: exp.Expr, streams: Mapping[str, StreamPlan]
) -> ProjectionStreamPlan:
    branches = _branches(query)
    planned: list[ProjectionBranch] = []
    columns: list[ColumnSpec] | None = None
    event_time: str | None = None
    for branch in branches:
        check_clauses(branch)
        if branch.args.get("joins"):
            raise UnsupportedSQL("joins are not supported in a derived stream")
        from_ = branch.args.get("from_")
        source_table = from_.this if from_ is not None else None
        if not isinstance(source_table, exp.Table) or not isinstance(
            source_table.this, exp.Identifier
        ):
            raise UnsupportedSQL("a stream without aggregates selects FROM one raw stream")
        source = streams.get(source_table.name)
        if source is None:
            raise UnknownSource(f"stream {source_table.name!r} does not exist")
        if not isinstance(source, RawStreamPlan):
            raise UnsupportedSQL(
                f"{source.name!r} is not a raw stream; a stream without aggregates selects "
                "from raw streams"
            )
        if any(b.source == source.name for b in planned):
            raise UnsupportedSQL(f"{source.name!r} appears in two branches of the UNION ALL")
        schema = {c.name: c.type for c in source.columns}
        items: list[exp.Expr] = []
        for item in branch.expressions:  # SELECT *, x AS y: the source's columns, then y
            if isinstance(item, exp.Star):
                items += [exp.column(c.name) for c in source.columns]
            else:
                items.append(item)
        branch_columns = []
        spark_items: list[exp.Expr] = []
        branch_event_time = None
        for item in items:
            column = naming.check_column_name(output_name(item))
            expression = item.this if isinstance(item, exp.Alias) else item
            branch_columns.append(ColumnSpec(column, infer_type(expression, schema)))
            spark_items.append(exp.alias_(to_spark(expression, schema), column, quoted=True))
            if isinstance(expression, exp.Column) and expression.name == source.event_time:
                branch_event_time = column
        if branch_event_time is None:
            # Not selected: kept for the streams built on this one, out of its view.
            branch_event_time = naming.HIDDEN_EVENT_TIME
            branch_columns.append(ColumnSpec(branch_event_time, schema[source.event_time]))
            spark_items.append(
                exp.alias_(
                    exp.column(source.event_time, quoted=True), branch_event_time, quoted=True
                )
            )
        if columns is None:
            columns, event_time = branch_columns, branch_event_time
        elif branch_event_time != event_time:
            raise UnsupportedSQL(
                "the branches of a UNION ALL keep their sources' event time: select each "
                "source's event-time column under the same name in every branch, or in none"
            )
        elif branch_columns != columns:
            raise UnsupportedSQL(
                "the branches of a UNION ALL must have the same column names and types: "
                f"{_describe(columns)} vs {_describe(branch_columns)}"
            )
        spark = exp.select(*spark_items, exp.column(naming.RUN_COLUMN, quoted=True)).from_(
            exp.table_(naming.RUN_ROWS_VIEW)
        )
        where = branch.args.get("where")
        if where is not None:
            if infer_type(where.this, schema) != BOOLEAN:
                raise UnsupportedSQL(
                    f"WHERE needs a boolean condition: {where.this.sql('postgres')!r}"
                )
            spark = spark.where(to_spark(where.this, schema))
        planned.append(ProjectionBranch(source.name, spark.sql("spark")))
    assert columns is not None and event_time is not None
    view = _view(query)
    return ProjectionStreamPlan(
        name=name,
        columns=tuple(columns),
        event_time=event_time,
        branches=tuple(planned),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _view(query: exp.Expr) -> exp.Query:
    """The user's query over the raw views, with every source schema-qualified."""
    copy = query.copy()
    for source in copy.find_all(exp.Table):
        source.replace(table(source.name, naming.PUBLIC_SCHEMA))
    assert isinstance(copy, exp.Query)
    return copy


def _describe(columns: list[ColumnSpec]) -> str:
    return "(" + ", ".join(f"{c.name} {c.type.pg()}" for c in columns) + ")"
