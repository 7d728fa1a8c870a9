"""A grouped, windowed SELECT split into partial and final parts: the split passes
(split_aggregates over raw rows, split_rollup over a stream's partials) build a SplitQuery,
build_views turns it into a plan.

The pieces both split passes share live here too: the GROUP BY keys (``group_by_keys``)
and the re-expression of SELECT and HAVING over the partial archive (``FinalForms``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.errors import UnsupportedSQL
from rewriter.registry import contains_aggregate, is_aggregate
from rewriter.resolve_window import WindowSpec, fixed_interval
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


def _is_window_ref(node: exp.Expr) -> bool:
    return isinstance(node, exp.Column) and node.name in (
        naming.WINDOW_START_COLUMN,
        naming.WINDOW_END_COLUMN,
    )


def group_by_keys(
    select: exp.Select, columns: Collection[str], *, windowed: bool = True
) -> list[exp.Expr]:
    """The GROUP BY items other than the window, positions and aliases resolved, each once.

    ``columns`` are the source's column names (a source column wins over a SELECT alias,
    as in PostgreSQL). The window (window_start or window_end) must be among the items,
    unless the aggregate has no window (``windowed`` False: it may have no GROUP BY).
    """
    group = select.args.get("group")
    if not windowed:
        if group is not None and any(_is_window_ref(g) for g in group.expressions):
            raise UnsupportedSQL(
                "GROUP BY names a window, but the stream reads no window: read FROM "
                "TUMBLE(stream, time_column, INTERVAL '...')"
            )
        if group is None or not group.expressions:
            return []
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
    if not has_window and windowed:
        raise UnsupportedSQL("GROUP BY must include the window: window_start or window_end")
    return keys


def key_or_window(node: exp.Expr, keys: list[GroupKey], window: WindowSpec) -> exp.Expr | None:
    """``node`` over the partial archive if it is a group key or the window, else None."""
    for key in keys:
        if node == key.expression:
            return exp.column(key.column)
    if window.is_global:
        return None
    if isinstance(node, exp.Column) and node.name == naming.WINDOW_START_COLUMN:
        return exp.column(naming.WINDOW_START_COLUMN)
    if isinstance(node, exp.Column) and node.name == naming.WINDOW_END_COLUMN:
        return exp.Add(
            this=exp.column(naming.WINDOW_START_COLUMN),
            expression=fixed_interval(window.size_us),
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
