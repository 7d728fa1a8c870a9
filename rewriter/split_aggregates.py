"""Pass 3: split a grouped, windowed SELECT into partial (Spark) and final (PostgreSQL) parts.

Group keys and aggregate arguments are evaluated by Spark on each run's rows; every
aggregate becomes the state columns of its partial form (rewriter.registry); the
SELECT list and HAVING are re-expressed over the partial archive's columns, with each
aggregate replaced by its final form, for the consolidating view.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.errors import UnsupportedSQL
from rewriter.expressions import BOOLEAN, infer_type, to_spark
from rewriter.plan import DerivedStreamPlan
from rewriter.positions import located
from rewriter.registry import contains_aggregate, filtered, is_aggregate, parse_aggregate
from rewriter.resolve_window import WindowSpec, interval_text
from rewriter.types import SqlType


@dataclass(frozen=True)
class GroupKey:
    column: str
    expression: exp.Expr  # as written, PostgreSQL
    spark: exp.Expr
    type: SqlType


@dataclass(frozen=True)
class StateColumn:
    column: str
    spark: exp.Expr  # Spark partial aggregate
    pg_type: str
    reduce: str  # PostgreSQL aggregate merging the state
    name: str = ""  # the registry's name of the state, e.g. "count"


@dataclass(frozen=True)
class SplitAggregate:
    call: str  # the aggregate as written
    states: tuple[StateColumn, ...]
    final: exp.Expr  # PostgreSQL, over the partial archive's state columns
    result_type: str
    rule: str = ""  # registry name, e.g. "count(*)"
    arg_type: str | None = None  # PostgreSQL type of the argument


@dataclass(frozen=True)
class SplitQuery:
    keys: tuple[GroupKey, ...]
    aggregates: tuple[SplitAggregate, ...]
    where_spark: exp.Expr | None
    outputs: tuple[tuple[str, exp.Expr], ...]  # view SELECT items over the archive
    having: exp.Expr | None


_UNSUPPORTED_CLAUSES = {
    "distinct": "SELECT DISTINCT",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "with_": "WITH (common table expressions)",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
}


def check_clauses(select: exp.Select) -> None:
    """Refuse the clauses and constructs no derived stream supports."""
    for clause, shown in _UNSUPPORTED_CLAUSES.items():
        if select.args.get(clause):
            raise UnsupportedSQL(f"{shown} is not supported in a derived stream")
    for node in select.find_all(exp.Subquery, exp.Window):
        kind = "subqueries" if isinstance(node, exp.Subquery) else "window functions (OVER)"
        raise UnsupportedSQL(f"{kind} are not supported yet: {node.sql('postgres')!r}")


def split_aggregates(select: exp.Select, window: WindowSpec) -> SplitQuery:
    check_clauses(select)
    assert not isinstance(window.source, DerivedStreamPlan)
    schema = {c.name: c.type for c in window.source.columns}
    items = select.expressions
    keys = _group_keys(select, schema)
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


def output_name(item: exp.Expr) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    if isinstance(item, exp.Column):
        return item.name
    if isinstance(item, exp.Func) and not isinstance(item, exp.Anonymous):
        # PostgreSQL names an unaliased call after its function, e.g. count(*) -> "count".
        # sqlglot folds some spellings together (variance and var_samp; bool_and and every):
        # those cannot be named back and need an alias.
        name = item.sql_name().lower()
        if name not in _FOLDED_NAMES:
            return _RENAMED.get(name, name)
    raise UnsupportedSQL(f"give the expression {item.sql('postgres')!r} a name with AS")


_RENAMED = {
    "variance_pop": "var_pop",
    "logical_or": "bool_or",
    "approx_distinct": "approx_count_distinct",
}
_FOLDED_NAMES = {"variance", "logical_and"}


def _is_window_ref(node: exp.Expr) -> bool:
    return isinstance(node, exp.Column) and node.name in (
        naming.WINDOW_START_COLUMN,
        naming.WINDOW_END_COLUMN,
    )


def group_by_keys(select: exp.Select, columns: Collection[str]) -> list[exp.Expr]:
    """The GROUP BY items other than the window, positions and aliases resolved, each once.

    ``columns`` are the source's column names (a source column wins over a SELECT alias,
    as in PostgreSQL). The window (window_start or window_end) must be among the items.
    """
    group = select.args.get("group")
    if group is None or not group.expressions:
        raise UnsupportedSQL(
            "a derived stream is a grouped aggregate: GROUP BY the window "
            "(window_start or window_end) and any keys"
        )
    items = select.expressions
    aliases = {i.alias: i.this for i in items if isinstance(i, exp.Alias)}
    keys: list[exp.Expr] = []
    has_window = False
    for raw in group.expressions:
        expression = raw
        if isinstance(raw, exp.Literal) and not raw.is_string:
            position = int(raw.this)
            if not 1 <= position <= len(items):
                raise UnsupportedSQL(f"GROUP BY position {position} is not in the SELECT list")
            chosen = items[position - 1]
            expression = chosen.this if isinstance(chosen, exp.Alias) else chosen
        elif isinstance(raw, exp.Column) and raw.name not in columns and raw.name in aliases:
            expression = aliases[raw.name]
        if _is_window_ref(expression):
            has_window = True
            continue
        if contains_aggregate(expression):
            raise UnsupportedSQL(
                f"GROUP BY {expression.sql('postgres')!r}: aggregates cannot be keys"
            )
        if expression not in keys:
            keys.append(expression)
    if not has_window:
        raise UnsupportedSQL("GROUP BY must include the window: window_start or window_end")
    return keys


def _group_keys(select: exp.Select, schema: dict[str, SqlType]) -> list[GroupKey]:
    keys = []
    with located(select.args.get("group")):
        for index, expression in enumerate(group_by_keys(select, schema)):
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


def key_or_window(node: exp.Expr, keys: list[GroupKey], window: WindowSpec) -> exp.Expr | None:
    """``node`` over the partial archive if it is a group key or the window, else None."""
    for key in keys:
        if node == key.expression:
            return exp.column(key.column)
    if isinstance(node, exp.Column) and node.name == naming.WINDOW_START_COLUMN:
        return exp.column(naming.WINDOW_START_COLUMN)
    if isinstance(node, exp.Column) and node.name == naming.WINDOW_END_COLUMN:
        return exp.Add(
            this=exp.column(naming.WINDOW_START_COLUMN),
            expression=exp.Interval(this=exp.Literal.string(interval_text(window.size_us))),
        )
    return None


class FinalForms:
    """Re-expresses SELECT/HAVING over the partial archive, collecting the aggregates.

    Keys and the window become archive columns, each distinct aggregate call is split once
    (``split``) and replaced by its final form; subclasses say what a column that is
    neither grouped nor aggregated means (``ungrouped``).
    """

    def __init__(self, keys: list[GroupKey], window: WindowSpec) -> None:
        self.keys = keys
        self.window = window
        self.aggregates: list[SplitAggregate] = []
        self._by_call: dict[str, SplitAggregate] = {}

    def final_form(self, node: exp.Expr) -> exp.Expr:
        grouped = key_or_window(node, self.keys, self.window)
        if grouped is not None:
            return grouped
        if isinstance(node, exp.Column):
            raise self.ungrouped(node)
        if is_aggregate(node):
            return self._aggregate(node).final.copy()
        copy = node.copy()
        for child in list(copy.iter_expressions()):
            child.replace(self.final_form(child))
        return copy

    def _aggregate(self, node: exp.Expr) -> SplitAggregate:
        call = node.sql("postgres")
        if call not in self._by_call:
            split = self.split(node, call, len(self.aggregates))
            self.aggregates.append(split)
            self._by_call[call] = split
        return self._by_call[call]

    def ungrouped(self, column: exp.Column) -> Exception:
        raise NotImplementedError

    def split(self, node: exp.Expr, call: str, index: int) -> SplitAggregate:
        raise NotImplementedError


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
        reduced: list[exp.Expr] = [exp.func(s.reduce, exp.column(s.column)) for s in states]
        split = SplitAggregate(
            call,
            states,
            rule.final(reduced, arg_type),
            rule.result_type(arg_type),
            rule=rule.name,
            arg_type=arg_type.pg() if arg_type is not None else None,
        )
        return split
