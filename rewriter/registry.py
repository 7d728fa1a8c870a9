"""Aggregate split rules as data: one entry per aggregate, its partial, reduce and final forms.

seeds/003: an aggregate is split into a *partial* aggregate computed per run (here by Spark),
a *reduce* aggregate (partial state -> partial state, PostgreSQL) and a *final* aggregate
(partial state -> answer, PostgreSQL, in the consolidating view). State columns are plain,
documented columns of the partial archive, never opaque blobs. The reduce and final forms
that PostgreSQL lacks are defined in sql/002_aggregates.sql; the Spark side of the states
that are more than one plain aggregate (sets, sketches, moments) in rewriter/sketches.py.

| aggregate | state column = partial (Spark) | reduce (PostgreSQL) | final (PostgreSQL, in the view) | result, error |
|---|---|---|---|---|
| count(*) | count = count(*) | sum | sum(count)::bigint | bigint, exact |
| count(x) | count = count(x) | sum | sum(count)::bigint | bigint, exact |
| sum(x) | sum = sum(x) | sum | sum(sum)::<type of sum(x)> | PostgreSQL's type, exact (floats: summation order) |
| min(x), max(x) | min = min(x), max = max(x) | min, max | min(min), max(max) | x's type, exact |
| avg(x) | sum = sum(x), count = count(x) | sum, sum | sum(sum) / nullif(sum(count), 0) | numeric or double precision, exact (floats: summation order) |
| stddev(x), stddev_samp(x), stddev_pop(x), variance(x), var_samp(x), var_pop(x) (1) | moments = {N, Sx, Sxx}: numeric[] for integer/numeric x, double precision[] for real/double x | strata_moments_merge | strata_stddev_samp(moments), strata_stddev_pop, strata_var_samp, strata_var_pop | numeric: PostgreSQL's own digits, exactly; double precision: within rounding, as accurate as PostgreSQL's own |
| bool_and(x), every(x) | bool_and = bool_and(x) | bool_and | bool_and(bool_and) | boolean, exact |
| bool_or(x) | bool_or = bool_or(x) | bool_or | bool_or(bool_or) | boolean, exact |
| count(DISTINCT x) (2) | set = collect_set(x), x[] | strata_set_union | cardinality(strata_set_union(set))::bigint | bigint, exact |
| approx_count_distinct(x) (3) | kmv = the 1024 smallest distinct xxhash64(x), bigint[] | strata_kmv_union | strata_kmv_estimate(strata_kmv_union(kmv)) | bigint; exact below 1024 distinct values, else relative standard error 3.1%, within 10% with probability > 99.8% |
| approx_percentile(x, p) (4) | ddsketch = jsonb {bucket: count} | strata_ddsketch_merge | strata_ddsketch_quantile(strata_ddsketch_merge(ddsketch), p), as one subquery over array_agg(ddsketch) | double precision, within 1% (relative) of percentile_disc(p) WITHIN GROUP (ORDER BY x) |
| agg(...) FILTER (WHERE c) | agg's states, each Spark aggregate in them FILTER (WHERE c) | agg's | agg's | agg's; count(*) FILTER is 0, not NULL, where no row matches |

(1) integer and numeric x: {count(x), sum(x), sum(x * x)}, exact. Where x * x could exceed
Spark's 38 digits (bigint, numeric of more than 13 digits) the unscaled digits of x are cut
into 13-digit limbs and the limb products summed per power of 10^13, then carried into one
exact number. Merging adds the three. The final is PostgreSQL's numeric_stddev_internal:
(N Sxx - Sx^2) / (N (N - 1)) (or N^2) at the scale numeric division picks, its square root
rounded half away from zero at that scale, 0 when the numerator is not positive. real and
double x: PostgreSQL's float8 state, Sxx = sum((x - mean)^2) = var_pop(x) * count(x) (Spark
computes it stably), merged by PostgreSQL's float8_combine (Chan et al.) and finished by its
float8_stddev_samp etc.
(2) The run's distinct non-NULL values, as PostgreSQL's array of x's type (timestamps as
bigint[] of epoch microseconds, dates as integer[] of epoch days; -0.0 counted as 0.0);
merged by union.
(3) KMV, k = 1024: the k smallest distinct 64-bit hashes. Merged by union, keeping the k
smallest. Fewer than k: the exact count; else (k - 1) / U_k, U_k the k-th smallest hash
mapped onto (0, 1]; relative standard error 1 / sqrt(k - 2) = 3.1% (10% = 3.2 of them).
(4) DDSketch, alpha = 1%, gamma = (1 + alpha) / (1 - alpha): bucket 100000 + ceil(ln(x) /
ln(gamma)) for x > 0, -(100000 + ceil(ln(-x) / ln(gamma))) for x < 0, 0 for 0; buckets sort
as their values. Merged by adding counts per bucket. The final walks the buckets to rank
max(1, ceil(p n)), percentile_disc's rank, and returns that bucket's value (1 - alpha)
gamma^i, within alpha of every value in the bucket. NULL (and NaN) values are skipped.

Adding an aggregate is one entry here plus its tests.
"""  # noqa: E501 - the table's rows are one line each

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from rewriter.errors import UnsupportedSQL
from rewriter.sketches import (
    DDSKETCH_ALPHA,
    ddsketch_partial,
    kmv_partial,
    moments_partial,
    moments_type,
    sum_input,
    value_set_partial,
    value_set_type,
)
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
    # Final form over the *reduced* states (each already wrapped in its reduce aggregate),
    # or with final_over_states over the state columns themselves: where the merge and the
    # final are each a function call per group, and one subquery over the group's states
    # gathered by a built-in aggregate does both (see final_form).
    final: Callable[[list[exp.Expr], SqlType | None], exp.Expr]
    result_type: Callable[[SqlType | None], str]
    accepts: Callable[[SqlType], bool]
    accepts_text: str
    final_over_states: bool = False


def final_form(rule: AggregateRule, columns: list[str], arg_type: SqlType | None) -> exp.Expr:
    """``rule``'s final over a group's rows of the state ``columns`` (its states' order)."""
    if rule.final_over_states:
        return rule.final([exp.column(c) for c in columns], arg_type)
    reduced: list[exp.Expr] = [
        exp.func(state.reduce, exp.column(c)) for state, c in zip(rule.states, columns, strict=True)
    ]
    return rule.final(reduced, arg_type)


@dataclass(frozen=True)
class AggregateCall:
    """An aggregate call taken apart: its rule, the row expression it aggregates (None for
    count(*)) and its FILTER (WHERE ...) condition."""

    rule: AggregateRule
    argument: exp.Expr | None
    condition: exp.Expr | None


def _arg(arg: exp.Expr | None) -> exp.Expr:
    assert arg is not None
    return arg


def _type(arg_type: SqlType | None) -> SqlType:
    assert arg_type is not None
    return arg_type


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

_SUM_STATE = StateSpec(
    "sum", lambda a, t: exp.Sum(this=sum_input(_arg(a), t)), "sum", _sum_state_type
)


def _is_number(t: SqlType) -> bool:
    return t.is_number


def _is_ordered(t: SqlType) -> bool:
    return t.name != "boolean"


def _is_boolean(t: SqlType) -> bool:
    return t.name == "boolean"


def _any(_t: SqlType) -> bool:
    return True


_MOMENTS_STATE = StateSpec(
    "moments",
    lambda a, t: moments_partial(_arg(a), _type(t)),
    "strata_moments_merge",
    lambda t: moments_type(_type(t)),
)


def _moments_rule(name: str, final_function: str) -> AggregateRule:
    return AggregateRule(
        name=name,
        takes_star=False,
        states=(_MOMENTS_STATE,),
        final=lambda reduced, t: _cast(exp.func(final_function, reduced[0]), _avg_type(t)),
        result_type=_avg_type,
        accepts=_is_number,
        accepts_text="number types",
    )


def _bool_rule(name: str, state_name: str, aggregate: type[exp.Func]) -> AggregateRule:
    state = StateSpec(
        state_name, lambda a, _t: aggregate(this=_arg(a)), state_name, lambda _t: "boolean"
    )
    return AggregateRule(
        name=name,
        takes_star=False,
        states=(state,),
        final=lambda reduced, _t: _cast(reduced[0], "boolean"),
        result_type=lambda _t: "boolean",
        accepts=_is_boolean,
        accepts_text="boolean",
    )


def _fraction(node: exp.Expr, shown: str) -> float:
    """approx_percentile's p: a constant between 0 and 1."""
    text = node.sql("postgres")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (isinstance(node, exp.Literal | exp.Neg) and 0 <= value <= 1):
        raise UnsupportedSQL(
            f"{shown!r}: approx_percentile(x, p) takes a constant fraction p between 0 and 1, "
            f"not {text}"
        )
    return value


# strata_ddsketch_quantile(strata_ddsketch_merge(sketch), p) in one subquery per group: the
# group's sketches gathered by array_agg, their counts added per bucket, the bucket at rank
# max(1, ceil(p n)) found by a running sum. The same value as the two functions in 40-60%
# of their time (each is a function call per group, 20-40 us): a sketch view's merge on
# read and the reducer's fold. array_agg holds a group's sketches as the partial archive
# does (the merge compacted every 64). Its aliases start with strata$, so that no table
# alias of the user's query (a join with a table qualifies the state with one) hides them.
PERCENTILE_OF_SKETCHES = sqlglot.parse_one(
    """
(SELECT strata_ddsketch_value(strata$rank.bucket) FROM (
  SELECT strata$buckets.bucket FROM (
    SELECT CAST(strata$counts.key AS INT) AS bucket,
           SUM(SUM(CAST(strata$counts.value AS BIGINT)))
             OVER (ORDER BY CAST(strata$counts.key AS INT)) AS ranks_so_far,
           SUM(SUM(CAST(strata$counts.value AS BIGINT))) OVER () AS n
    FROM UNNEST(ARRAY_AGG(strata$sketch)) AS strata$sketches(sketch),
         JSONB_EACH_TEXT(strata$sketches.sketch) AS strata$counts
    GROUP BY CAST(strata$counts.key AS INT)) AS strata$buckets
  WHERE strata$buckets.ranks_so_far >= GREATEST(1, CEIL(strata$fraction * strata$buckets.n))
  ORDER BY strata$buckets.bucket LIMIT 1) AS strata$rank)
""",
    read="postgres",
)


def _percentile_of_sketches(
    fraction: float,
) -> Callable[[list[exp.Expr], SqlType | None], exp.Expr]:
    def final(states: list[exp.Expr], _t: SqlType | None) -> exp.Expr:
        p = _cast(exp.Literal.number(repr(fraction)), "double precision")

        def fill(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.name == "strata$sketch":
                return states[0].copy()
            if isinstance(node, exp.Column) and node.name == "strata$fraction":
                return p.copy()
            return node

        return _cast(PERCENTILE_OF_SKETCHES.copy().transform(fill), "double precision")

    return final


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
        states=(_SUM_STATE,),
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
            _SUM_STATE,
            _COUNT_STATE,
        ),
        final=_avg_final,
        result_type=_avg_type,
        accepts=_is_number,
        accepts_text="number types",
    ),
    "stddev": _moments_rule("stddev", "strata_stddev_samp"),
    "stddev_samp": _moments_rule("stddev_samp", "strata_stddev_samp"),
    "stddev_pop": _moments_rule("stddev_pop", "strata_stddev_pop"),
    "var_samp": _moments_rule("var_samp", "strata_var_samp"),  # also variance(x)
    "var_pop": _moments_rule("var_pop", "strata_var_pop"),
    "bool_and": _bool_rule("bool_and", "bool_and", exp.LogicalAnd),
    "every": _bool_rule("every", "bool_and", exp.LogicalAnd),
    "bool_or": _bool_rule("bool_or", "bool_or", exp.LogicalOr),
    "count(DISTINCT)": AggregateRule(
        name="count(DISTINCT)",
        takes_star=False,
        states=(
            StateSpec(
                "set",
                lambda a, t: value_set_partial(_arg(a), _type(t)),
                "strata_set_union",
                lambda t: value_set_type(_type(t)),
            ),
        ),
        final=lambda reduced, _t: _cast(
            exp.func("coalesce", exp.func("cardinality", reduced[0]), exp.Literal.number(0)),
            "bigint",
        ),
        result_type=lambda _t: "bigint",
        accepts=_any,
        accepts_text="any type",
    ),
    "approx_count_distinct": AggregateRule(
        name="approx_count_distinct",
        takes_star=False,
        states=(
            StateSpec(
                "kmv",
                lambda a, t: kmv_partial(_arg(a), _type(t)),
                "strata_kmv_union",
                lambda _t: "bigint[]",
            ),
        ),
        final=lambda reduced, _t: _cast(exp.func("strata_kmv_estimate", reduced[0]), "bigint"),
        result_type=lambda _t: "bigint",
        accepts=_any,
        accepts_text="any type",
    ),
    "approx_percentile": AggregateRule(
        name="approx_percentile",
        takes_star=False,
        states=(
            StateSpec(
                "ddsketch",
                lambda a, _t: ddsketch_partial(_arg(a)),
                "strata_ddsketch_merge",
                lambda _t: "jsonb",
            ),
        ),
        final=_percentile_of_sketches(0.5),  # the call's own p replaces it (parse_aggregate)
        final_over_states=True,
        result_type=lambda _t: "double precision",
        accepts=_is_number,
        accepts_text="number types",
    ),
}

SUPPORTED_AGGREGATES = (
    "count(*), count(x), sum(x), min(x), max(x), avg(x), stddev(x), stddev_samp(x), "
    "stddev_pop(x), variance(x), var_samp(x), var_pop(x), bool_and(x), bool_or(x), every(x), "
    "count(DISTINCT x), approx_count_distinct(x), approx_percentile(x, p); each may take "
    "FILTER (WHERE condition)"
)

_NODE_TO_NAME: dict[type[exp.Expr], str] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "avg",
    exp.Stddev: "stddev",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
    exp.LogicalAnd: "bool_and",
    exp.LogicalOr: "bool_or",
    exp.ApproxDistinct: "approx_count_distinct",
}
# Aggregates sqlglot reads as plain (anonymous) function calls.
_ANONYMOUS_AGGREGATES = {"every", "approx_percentile"}
# Aggregates of the same kind Strata refuses: known as aggregates all the same, so that the
# refusal names them (and not a column missing from GROUP BY).
_REFUSED_ANONYMOUS = {"listagg"}
# Aggregates that put values in a row order (string_agg, array_agg, LISTAGG), which runs
# arriving late change: refused with what to write instead.
_ORDERED_COLLECTIONS = (exp.GroupConcat, exp.ArrayAgg)


def is_aggregate(node: exp.Expr) -> bool:
    """An aggregate call, with or without FILTER (also ones Strata refuses, to say so)."""
    if isinstance(node, exp.Filter | exp.WithinGroup):
        return True
    if isinstance(node, exp.Anonymous):
        return node.name.lower() in _ANONYMOUS_AGGREGATES | _REFUSED_ANONYMOUS
    return isinstance(node, exp.AggFunc)


def contains_aggregate(node: exp.Expr) -> bool:
    return any(is_aggregate(n) for n in node.walk())


def _unsupported(shown: str, node: exp.Expr) -> UnsupportedSQL:
    if isinstance(node, _ORDERED_COLLECTIONS) or (
        isinstance(node, exp.Anonymous) and node.name.lower() in _REFUSED_ANONYMOUS
    ):
        return UnsupportedSQL(
            f"aggregate {shown!r} is not supported: it lists values in the order rows come, "
            "and late runs change that order; make a stream of the rows instead (CREATE "
            "STREAM s AS SELECT key, value, t FROM source: a view of every row received) "
            "and aggregate them when you read it (SELECT key, string_agg(value, ',' ORDER BY "
            "t) FROM s GROUP BY key)"
        )
    return UnsupportedSQL(
        f"aggregate {shown!r} is not supported; supported aggregates: {SUPPORTED_AGGREGATES}"
    )


def parse_aggregate(node: exp.Expr) -> AggregateCall:
    """Take an aggregate call apart, or raise an error naming what is supported."""
    shown = node.sql("postgres")
    condition: exp.Expr | None = None
    if isinstance(node, exp.Filter):
        where = node.expression
        condition = where.this if isinstance(where, exp.Where) else where
        node = node.this
    if isinstance(node, exp.WithinGroup):
        raise UnsupportedSQL(
            f"{shown!r}: ordered-set aggregates (WITHIN GROUP) are not supported; for "
            f"percentiles use approx_percentile(x, p) (within {DDSKETCH_ALPHA:.0%}, relative)"
        )
    if isinstance(node, exp.Anonymous):
        name: str | None = node.name.lower() if node.name.lower() in _ANONYMOUS_AGGREGATES else None
        arguments = list(node.expressions)
    else:
        name = _NODE_TO_NAME.get(type(node))
        arguments = [node.this] if node.this is not None else []
        arguments += [v for k, v in node.args.items() if k != "this" and isinstance(v, exp.Expr)]
        arguments += node.expressions
    if name is None:
        raise _unsupported(shown, node)
    if arguments and isinstance(arguments[0], exp.Distinct):
        distinct = arguments[0]
        if name != "count":
            raise UnsupportedSQL(
                f"{shown!r}: DISTINCT inside aggregates is not supported except in "
                "count(DISTINCT x)"
            )
        if len(distinct.expressions) != 1 or len(arguments) != 1:
            raise UnsupportedSQL(f"{shown!r}: count(DISTINCT x) takes one expression")
        return AggregateCall(REGISTRY["count(DISTINCT)"], distinct.expressions[0], condition)
    if name == "count" and arguments and isinstance(arguments[0], exp.Star):
        return AggregateCall(REGISTRY["count(*)"], None, condition)
    rule = REGISTRY[name]
    if name == "approx_percentile":
        if len(arguments) != 2:
            raise UnsupportedSQL(f"{shown!r}: approx_percentile takes (x, p), two arguments")
        fraction = _fraction(arguments[1], shown)
        rule = dataclasses.replace(rule, final=_percentile_of_sketches(fraction))
    elif len(arguments) != 1:
        raise UnsupportedSQL(f"{shown!r}: {name} takes one argument")
    return AggregateCall(rule, arguments[0], condition)


def rule_for(node: exp.Expr) -> AggregateRule:
    """The registry entry for an aggregate call, or an error naming what is supported."""
    return parse_aggregate(node).rule


def filtered(partial: exp.Expr, condition: exp.Expr | None) -> exp.Expr:
    """A Spark partial with each aggregate call in it restricted by FILTER (WHERE condition)."""
    if condition is None:
        return partial

    def restrict(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.AggFunc):
            return exp.Filter(this=node.copy(), expression=exp.Where(this=condition.copy()))
        return node

    return partial.transform(restrict)


def exact_in_postgres(node: exp.Expr) -> exp.Expr:
    """PostgreSQL's exact twin of an approximate aggregate, for queries PostgreSQL runs as
    written (serial streams): approx_count_distinct(x) -> count(DISTINCT x), and
    approx_percentile(x, p) -> percentile_disc(p) WITHIN GROUP (ORDER BY x) as a double.
    Both are within the approximations' bounds. Use as ``query.transform(exact_in_postgres)``.
    """
    if isinstance(node, exp.ApproxDistinct) and not node.args.get("accuracy"):
        return exp.Count(this=exp.Distinct(expressions=[node.this.copy()]), big_int=True)
    call, condition = (node.this, node.expression) if isinstance(node, exp.Filter) else (node, None)
    if (
        isinstance(call, exp.Anonymous)
        and call.name.lower() == "approx_percentile"
        and len(call.expressions) == 2
    ):
        value, fraction = call.expressions
        ordered: exp.Expr = exp.WithinGroup(
            this=exp.PercentileDisc(this=fraction.copy()),
            expression=exp.Order(expressions=[exp.Ordered(this=value.copy())]),
        )
        if condition is not None:
            ordered = exp.Filter(this=ordered, expression=condition.copy())
        return _cast(ordered, "double precision")
    return node
