"""Pass 3: split a grouped, windowed SELECT into partial (Spark) and final (PostgreSQL) parts.

Group keys and aggregate arguments are evaluated by Spark on each run's rows; every
aggregate becomes the state columns of its partial form (rewriter.registry); the
SELECT list and HAVING are re-expressed over the partial archive's columns, with each
aggregate replaced by its final form, for the consolidating view.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import check_clauses, output_name
from rewriter.errors import UnsupportedSQL
from rewriter.expressions import BOOLEAN, infer_type, to_spark
from rewriter.plan import WindowedAggregatePlan
from rewriter.positions import located
from rewriter.registry import contains_aggregate, filtered, final_form, parse_aggregate
from rewriter.resolve_window import WindowSpec
from rewriter.split_query import (
    FinalForms,
    GroupKey,
    SplitAggregate,
    SplitQuery,
    StateColumn,
    group_by_keys,
)
from rewriter.types import SqlType


def split_aggregates(select: exp.Select, window: WindowSpec) -> SplitQuery:
    check_clauses(select)
    assert not isinstance(window.source, WindowedAggregatePlan)
    schema = {c.name: c.type for c in window.source.columns}
    items = select.expressions
    keys = _group_keys(select, schema, windowed=not window.is_global)
    split = _Splitter(keys, schema, window)
    outputs = []
    seen: set[str] = set()
    for item in items:
        name = output_name(item)
        if name in seen:
            raise UnsupportedSQL(
                f"output column {name!r} appears twice; give each a distinct alias"
            )
        seen.add(name)
        expression = item.this if isinstance(item, exp.Alias) else item
        with located(item):
            outputs.append((name, split.final_form(expression)))
    having = select.args.get("having")
    where = select.args.get("where")
    where_spark = None
    if where is not None:
        with located(where):
            if contains_aggregate(where.this):
                raise UnsupportedSQL("aggregates are not allowed in WHERE; use HAVING")
            if infer_type(where.this, schema) != BOOLEAN:
                raise UnsupportedSQL(
                    f"WHERE needs a boolean condition: {where.this.sql('postgres')!r}"
                )
            where_spark = to_spark(where.this, schema)
    final_having = None
    if having is not None:
        with located(having):
            final_having = split.final_form(having.this)
    return SplitQuery(
        keys=tuple(keys),
        aggregates=tuple(split.aggregates),
        where_spark=where_spark,
        outputs=tuple(outputs),
        having=final_having,
    )


def _group_keys(
    select: exp.Select, schema: dict[str, SqlType], *, windowed: bool = True
) -> list[GroupKey]:
    keys = []
    with located(select.args.get("group")):
        for index, expression in enumerate(group_by_keys(select, schema, windowed=windowed)):
            with located(expression):
                keys.append(
                    GroupKey(
                        column=naming.key_column(index),
                        expression=expression.copy(),
                        spark=to_spark(expression, schema),
                        type=infer_type(expression, schema),
                    )
                )
    return keys


class _Splitter(FinalForms):
    """Final forms over the partial archive of a stream computed from raw rows."""

    def __init__(self, keys: list[GroupKey], schema: dict[str, SqlType], window: WindowSpec):
        super().__init__(keys, window)
        self.schema = schema

    def ungrouped(self, column: exp.Column) -> Exception:
        return UnsupportedSQL(
            f"column {column.name!r} must appear in GROUP BY or be used in an aggregate function"
        )

    def split(self, node: exp.Expr, call: str, index: int) -> SplitAggregate:
        parsed = parse_aggregate(node)
        rule, argument, condition = parsed.rule, parsed.argument, parsed.condition
        if argument is not None and contains_aggregate(argument):
            raise UnsupportedSQL(f"{call!r}: aggregates cannot be nested")
        if condition is not None:
            if contains_aggregate(condition) or infer_type(condition, self.schema) != BOOLEAN:
                raise UnsupportedSQL(
                    f"{call!r}: FILTER needs a boolean condition on the rows, without aggregates"
                )
            condition = to_spark(condition, self.schema)
        arg_type = infer_type(argument, self.schema) if argument is not None else None
        if arg_type is not None and not rule.accepts(arg_type):
            raise UnsupportedSQL(
                f"{call!r}: {rule.name} takes {rule.accepts_text}, not {arg_type.pg()}"
            )
        spark_arg = to_spark(argument, self.schema) if argument is not None else None
        states = tuple(
            StateColumn(
                column=naming.state_column(index, state.name),
                spark=filtered(state.spark_partial(spark_arg, arg_type), condition),
                pg_type=state.pg_type(arg_type),
                reduce=state.reduce,
                name=state.name,
            )
            for state in rule.states
        )
        split = SplitAggregate(
            call,
            states,
            final_form(rule, [s.column for s in states], arg_type),
            rule.result_type(arg_type),
            rule=rule.name,
            arg_type=arg_type.pg() if arg_type is not None else None,
        )
        return split
