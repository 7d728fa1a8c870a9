"""Aggregate split rules as data: one entry per aggregate, its partial, reduce and final forms.

seeds/003: an aggregate is split into a *partial* aggregate computed per run (here by Spark),
a *reduce* aggregate (partial state -> partial state, PostgreSQL) and a *final* aggregate
(partial state -> answer, PostgreSQL, in the consolidating view). State columns are plain,
documented columns of the partial archive, never opaque blobs.

| aggregate | state columns (partial, Spark) | reduce   | final (PostgreSQL)               |
|-----------|--------------------------------|----------|----------------------------------|
| count(*)  | count = count(*)               | sum      | sum(count)::bigint               |
| count(x)  | count = count(x)               | sum      | sum(count)::bigint               |
| sum(x)    | sum = sum(x)                   | sum      | sum(sum)::<type of sum(x)>       |
| min(x)    | min = min(x)                   | min      | min(min)                         |
| max(x)    | max = max(x)                   | max      | max(max)                         |
| avg(x)    | sum = sum(x), count = count(x) | sum, sum | sum(sum) / nullif(sum(count), 0) |

Adding an aggregate is one entry here plus its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from rewriter.errors import UnsupportedSQL
from rewriter.types import SqlType


@dataclass(frozen=True)
class StateSpec:
    """One state column of an aggregate's partial form."""

    name: str
    spark_partial: Callable[[exp.Expr | None, SqlType | None], exp.Expr]
    reduce: str  # PostgreSQL aggregate that merges this state (same form in and out)
    pg_type: Callable[[SqlType | None], str]


@dataclass(frozen=True)
class AggregateRule:
    name: str
    takes_star: bool
    states: tuple[StateSpec, ...]
    # Final form over the *reduced* states (each already wrapped in its reduce aggregate).
    final: Callable[[list[exp.Expr], SqlType | None], exp.Expr]
    result_type: Callable[[SqlType | None], str]
    accepts: Callable[[SqlType], bool]
    accepts_text: str


def _arg(arg: exp.Expr | None) -> exp.Expr:
    assert arg is not None
    return arg


def _sum_input(arg: exp.Expr | None, arg_type: SqlType | None) -> exp.Expr:
    # Spark sums bigint in bigint and overflows; PostgreSQL sums bigint in numeric. Sum in
    # decimal(38,0) instead, which is exact for any realistic run.
    value = _arg(arg)
    if arg_type is not None and arg_type.name == "bigint":
        return exp.cast(value, "decimal(38,0)")
    if arg_type is not None and arg_type.is_float:
        return exp.cast(value, "double")
    return value


def _sum_type(arg_type: SqlType | None) -> str:
    assert arg_type is not None
    if arg_type.name in ("smallint", "integer"):
        return "bigint"
    if arg_type.name in ("bigint", "numeric"):
        return "numeric"
    return arg_type.name


def _sum_state_type(arg_type: SqlType | None) -> str:
    assert arg_type is not None
    if arg_type.is_float:
        return "double precision"
    return _sum_type(arg_type)


def _avg_type(arg_type: SqlType | None) -> str:
    assert arg_type is not None
    return "double precision" if arg_type.is_float else "numeric"


def _minmax_type(arg_type: SqlType | None) -> str:
    assert arg_type is not None
    return arg_type.name


def _cast(node: exp.Expr, pg_type: str) -> exp.Expr:
    return exp.cast(node, exp.DataType.build(pg_type, dialect="postgres"))


def _avg_final(reduced: list[exp.Expr], arg_type: SqlType | None) -> exp.Expr:
    total, count = reduced
    result_type = _avg_type(arg_type)
    return exp.Div(
        this=_cast(total, result_type),
        expression=exp.func("nullif", _cast(count, result_type), exp.Literal.number(0)),
    )


_COUNT_STATE = StateSpec(
    "count",
    lambda arg, _t: exp.Count(this=exp.Star() if arg is None else arg),
    "sum",
    lambda _t: "bigint",
)


def _is_number(t: SqlType) -> bool:
    return t.is_number


def _is_ordered(t: SqlType) -> bool:
    return t.name != "boolean"


def _any(_t: SqlType) -> bool:
    return True


REGISTRY: dict[str, AggregateRule] = {
    "count(*)": AggregateRule(
        name="count(*)",
        takes_star=True,
        states=(_COUNT_STATE,),
        final=lambda reduced, _t: _cast(reduced[0], "bigint"),
        result_type=lambda _t: "bigint",
        accepts=_any,
        accepts_text="no argument",
    ),
    "count": AggregateRule(
        name="count",
        takes_star=False,
        states=(_COUNT_STATE,),
        final=lambda reduced, _t: _cast(reduced[0], "bigint"),
        result_type=lambda _t: "bigint",
        accepts=_any,
        accepts_text="any type",
    ),
    "sum": AggregateRule(
        name="sum",
        takes_star=False,
        states=(
            StateSpec("sum", lambda a, t: exp.Sum(this=_sum_input(a, t)), "sum", _sum_state_type),
        ),
        final=lambda reduced, t: _cast(reduced[0], _sum_type(t)),
        result_type=_sum_type,
        accepts=_is_number,
        accepts_text="number types",
    ),
    "min": AggregateRule(
        name="min",
        takes_star=False,
        states=(StateSpec("min", lambda a, _t: exp.Min(this=_arg(a)), "min", _minmax_type),),
        final=lambda reduced, t: _cast(reduced[0], _minmax_type(t)),
        result_type=_minmax_type,
        accepts=_is_ordered,
        accepts_text="numbers, text, timestamps and dates",
    ),
    "max": AggregateRule(
        name="max",
        takes_star=False,
        states=(StateSpec("max", lambda a, _t: exp.Max(this=_arg(a)), "max", _minmax_type),),
        final=lambda reduced, t: _cast(reduced[0], _minmax_type(t)),
        result_type=_minmax_type,
        accepts=_is_ordered,
        accepts_text="numbers, text, timestamps and dates",
    ),
    "avg": AggregateRule(
        name="avg",
        takes_star=False,
        states=(
            StateSpec("sum", lambda a, t: exp.Sum(this=_sum_input(a, t)), "sum", _sum_state_type),
            _COUNT_STATE,
        ),
        final=_avg_final,
        result_type=_avg_type,
        accepts=_is_number,
        accepts_text="number types",
    ),
}

SUPPORTED_AGGREGATES = "count(*), count(x), sum(x), min(x), max(x), avg(x)"

_NODE_TO_NAME: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "avg",
}


def is_aggregate(node: exp.Expr) -> bool:
    return isinstance(node, exp.AggFunc)


def rule_for(node: exp.Expr) -> AggregateRule:
    """The registry entry for an aggregate call, or an error naming what is supported."""
    name = _NODE_TO_NAME.get(type(node))
    shown = node.sql("postgres")
    if name is None:
        raise UnsupportedSQL(
            f"aggregate {shown!r} is not supported; supported aggregates: {SUPPORTED_AGGREGATES}"
        )
    if isinstance(node.this, exp.Distinct):
        raise UnsupportedSQL(
            f"{shown!r}: DISTINCT inside aggregates is not supported; "
            f"supported aggregates: {SUPPORTED_AGGREGATES}"
        )
    if name == "count" and isinstance(node.this, exp.Star):
        return REGISTRY["count(*)"]
    return REGISTRY[name]
