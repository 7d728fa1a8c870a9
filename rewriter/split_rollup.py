"""Pass 3b: a stream over a parallel derived stream, rewritten onto that stream's partials.

seeds/003: "impsn_sum ... is rewritten to operate over the previously generated stream of
partials": a legal composition (SUM over COUNT, SUM over SUM, MIN over MIN, MAX over MAX,
AVG over AVG) merges the lower stream's partial states with the reduce aggregate, grouped
by the upper window and keys, and stays in partial form. AVG over AVG merges the
<sum, count> states, so it is the average of the underlying rows, never an average of
averages. Each lower window is placed by its *start* (a window [00:04, 00:05) belongs to
[00:00, 00:05) whether the lower stream exposes window_start or window_end).

Anything else (MAX over COUNT, a key or a WHERE on aggregate values, arithmetic inside
the upper aggregate, a serial source) needs final values: a gather point. GatherPoint
carries the reason; the stream is then serial (SP).
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import check_clauses, output_name
from rewriter.errors import UnsupportedSQL
from rewriter.expressions import BOOLEAN, infer_type, to_spark
from rewriter.plan import (
    OutputColumn,
    ParallelAggregatePlan,
    PlannedAggregate,
    WindowedAggregatePlan,
)
from rewriter.registry import REGISTRY, final_form, rule_for
from rewriter.resolve_window import WindowSpec
from rewriter.split_query import (
    FinalForms,
    GroupKey,
    SplitAggregate,
    SplitQuery,
    StateColumn,
    group_by_keys,
)
from rewriter.types import SqlType, sql_type_from_sqlglot

# (upper aggregate, lower aggregate) -> the lower rule the upper one computes.
COMPOSITIONS: dict[tuple[str, str], str] = {
    ("sum", "count(*)"): "count(*)",
    ("sum", "count"): "count",
    ("sum", "sum"): "sum",
    ("min", "min"): "min",
    ("max", "max"): "max",
    ("avg", "avg"): "avg",
    ("bool_and", "bool_and"): "bool_and",
    ("bool_or", "bool_or"): "bool_or",
}
COMPOSITIONS_TEXT = (
    "SUM over COUNT, SUM over SUM, MIN over MIN, MAX over MAX, AVG over AVG, "
    "BOOL_AND over BOOL_AND, BOOL_OR over BOOL_OR"
)


class GatherPoint(Exception):  # noqa: N818 - a classification, not a failure
    """The query needs the lower stream's final values: it runs serially (SP)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _type(pg_type: str | None, column: str) -> SqlType:
    if pg_type is None:
        raise GatherPoint(f"the type of {column!r} is only known to PostgreSQL")
    return sql_type_from_sqlglot(exp.DataType.build(pg_type, dialect="postgres"), column=column)


def split_rollup(select: exp.Select, window: WindowSpec) -> SplitQuery:
    lower = window.source
    assert isinstance(lower, WindowedAggregatePlan)
    if not isinstance(lower, ParallelAggregatePlan):
        raise GatherPoint(f"{lower.name!r} is a serial stream: only its final values exist")
    if lower.window_slide_us != lower.window_size_us:
        raise GatherPoint(f"{lower.name!r} has overlapping (HOP) windows")
    check_clauses(select)
    outputs = {o.name: o for o in lower.outputs}
    key_outputs = {o.name: o for o in lower.outputs if o.role == "key"}
    key_schema = {name: _type(o.pg_type, name) for name, o in key_outputs.items()}
    splitter = _RollupSplitter(lower, outputs, key_outputs, key_schema, window)
    keys = splitter.group_keys(select)
    items = []
    seen: set[str] = set()
    for item in select.expressions:
        name = output_name(item)
        if name in seen:
            raise UnsupportedSQL(
                f"output column {name!r} appears twice; give each a distinct alias"
            )
        seen.add(name)
        items.append(
            (name, splitter.final_form(item.this if isinstance(item, exp.Alias) else item))
        )
    where = select.args.get("where")
    having = select.args.get("having")
    return SplitQuery(
        keys=tuple(keys),
        aggregates=tuple(splitter.aggregates),
        where_spark=splitter.key_condition(where.this) if where is not None else None,
        outputs=tuple(items),
        having=splitter.final_form(having.this) if having is not None else None,
    )


class _RollupSplitter(FinalForms):
    """Final forms over the partial archive of a stream rolled up onto ``lower``'s partials."""

    def __init__(
        self,
        lower: ParallelAggregatePlan,
        outputs: dict[str, OutputColumn],
        key_outputs: dict[str, OutputColumn],
        key_schema: dict[str, SqlType],
        window: WindowSpec,
    ) -> None:
        super().__init__([], window)
        self.lower = lower
        self.outputs = outputs
        self.key_outputs = key_outputs
        self.key_schema = key_schema

    def _on_partials(self, node: exp.Expr) -> exp.Expr:
        """A Spark expression over the lower stream's key outputs, on its partial columns."""

        def rename(column: exp.Expr) -> exp.Expr:
            if isinstance(column, exp.Column):
                ref = self.key_outputs[column.name].ref
                assert ref is not None
                return exp.column(ref, quoted=True)
            return column

        return to_spark(node, self.key_schema).transform(rename)

    def _only_keys(self, node: exp.Expr, where: str) -> None:
        for column in node.find_all(exp.Column):
            if column.name in self.key_outputs:
                continue
            if column.name in self.outputs:
                raise GatherPoint(
                    f"{where} uses {column.name!r}, a value of {self.lower.name!r} that is only "
                    "final after consolidation"
                )
            raise UnsupportedSQL(f"column {column.name!r} does not exist in {self.lower.name!r}")

    def key_condition(self, condition: exp.Expr) -> exp.Expr:
        self._only_keys(condition, "WHERE")
        if infer_type(condition, self.key_schema) != BOOLEAN:
            raise UnsupportedSQL(f"WHERE needs a boolean condition: {condition.sql('postgres')!r}")
        return self._on_partials(condition)

    def group_keys(self, select: exp.Select) -> list[GroupKey]:
        for expression in group_by_keys(select, self.outputs):
            self._only_keys(expression, f"GROUP BY {expression.sql('postgres')}")
            self.keys.append(
                GroupKey(
                    column=naming.key_column(len(self.keys)),
                    expression=expression.copy(),
                    spark=self._on_partials(expression),
                    type=infer_type(expression, self.key_schema),
                )
            )
        return self.keys

    def ungrouped(self, column: exp.Column) -> Exception:
        if column.name in self.outputs:
            return GatherPoint(
                f"{column.name!r} of {self.lower.name!r} is used outside an aggregate and "
                "outside GROUP BY"
            )
        return UnsupportedSQL(f"column {column.name!r} does not exist in {self.lower.name!r}")

    def split(self, node: exp.Expr, call: str, index: int) -> SplitAggregate:
        outer = rule_for(node)
        argument = node.this
        if outer.takes_star or not isinstance(argument, exp.Column):
            raise GatherPoint(
                f"{call} is not one of the compositions that stay partial ({COMPOSITIONS_TEXT})"
            )
        source = self.outputs.get(argument.name)
        if source is None:
            raise UnsupportedSQL(f"column {argument.name!r} does not exist in {self.lower.name!r}")
        if source.role != "aggregate" or source.ref is None:
            raise GatherPoint(
                f"{call}: {argument.name!r} is not an aggregate of {self.lower.name!r}"
            )
        inner: PlannedAggregate = self.lower.aggregates[int(source.ref)]
        composed = COMPOSITIONS.get((outer.name, inner.rule))
        if composed is None:
            raise GatherPoint(
                f"{call} over {inner.rule} is not decomposable: the {outer.name} of partial "
                f"results is not the {outer.name} of final results (a gather point; legal "
                f"compositions: {COMPOSITIONS_TEXT})"
            )
        rule = REGISTRY[composed]
        states = tuple(
            StateColumn(
                column=naming.state_column(index, state.name),
                spark=exp.func(state.reduce, exp.column(state.column, quoted=True)),
                pg_type=state.pg_type,
                reduce=state.reduce,
                name=state.name,
            )
            for state in inner.states
        )
        arg_type = _type(inner.arg_type, argument.name) if inner.arg_type else None
        final = final_form(rule, [s.column for s in states], arg_type)
        # The upper aggregate's type is PostgreSQL's for it over the lower column (sum of a
        # bigint count is numeric), except AVG over AVG, which is the rows' average.
        result_type = outer.result_type(_type(inner.result_type, argument.name))
        if outer.name != "avg":
            final = exp.cast(final, exp.DataType.build(result_type, dialect="postgres"))
        return SplitAggregate(
            call, states, final, result_type, rule=composed, arg_type=inner.arg_type
        )
