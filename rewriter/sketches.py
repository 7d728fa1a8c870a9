"""Spark builders of the partial states that are more than one plain aggregate: value sets
(count(DISTINCT)), KMV and DDSketch sketches, and exact moments (stddev, variance).

Spark cannot hand arrays to COPY, so a state that is an array (or a jsonb object) leaves
Spark as the text PostgreSQL reads it from; sql/002_aggregates.sql merges and finishes
them. The encodings are described under the table of rewriter/registry.py.
"""

from __future__ import annotations

from functools import cache

import sqlglot
from sqlglot import exp

from rewriter.types import SqlType

# KMV sketch size (sql/002_aggregates.sql spells the same number).
KMV_K = 1024
# DDSketch relative accuracy, ln(gamma) for gamma = (1 + alpha) / (1 - alpha), the offset of
# the bucket indexes and their cap (beyond any finite double: the infinities). The SQL file
# spells the same constants; tests check that both engines bucket alike.
DDSKETCH_ALPHA = 0.01
DDSKETCH_LN_GAMMA = 0.020000666706669435
DDSKETCH_OFFSET = 100000
DDSKETCH_MAX_INDEX = 40000


@cache
def _parsed_template(template: str) -> exp.Expr:
    return sqlglot.parse_one(template, read="spark")


def _spark(template: str, **values: exp.Expr) -> exp.Expr:
    """A Spark expression from a template whose :name placeholders take ``values``."""

    def fill(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder):
            return values[node.name].copy()
        return node

    return _parsed_template(template).copy().transform(fill)


def sum_input(x: exp.Expr, arg_type: SqlType | None) -> exp.Expr:
    """x as Spark should sum it to get PostgreSQL's sum(x).

    Spark sums bigint in bigint and overflows; PostgreSQL sums bigint in numeric. Sum in
    decimal(38,0) instead, which is exact for any realistic run.
    """
    if arg_type is not None and arg_type.name == "bigint":
        return exp.cast(x, "decimal(38,0)")
    if arg_type is not None and arg_type.is_float:
        return exp.cast(x, "double")
    return x


def _pg_array(elements: exp.Expr) -> exp.Expr:
    """PostgreSQL's literal of a Spark array<string> of (already quoted) elements."""
    return _spark("concat('{', array_join(:elements, ','), '}')", elements=elements)


# Where x * x fits Spark's 38 digits with room to sum 10^10 rows, Sxx is summed directly.
_DIRECT_SQUARE_DIGITS = 13
_LIMB_DIGITS = 13


def _exact_sum_of_squares(x: exp.Expr, arg_type: SqlType) -> exp.Expr:
    """sum(x * x), exactly, as the text of a PostgreSQL numeric at twice x's scale.

    Squares of bigint and wide numeric values need up to 77 digits: the unscaled digits of
    |x| are cut into 13-digit limbs, the limb products summed per power of 10^13 (each sum
    stays far below 10^38) and the sums carried into one digit string, 'E-<2 * scale>'.
    """
    if arg_type.name in ("smallint", "integer") or (
        arg_type.is_numeric
        and arg_type.precision is not None
        and arg_type.precision <= _DIRECT_SQUARE_DIGITS
    ):
        if arg_type.is_numeric:
            exact = f"decimal({arg_type.precision},{arg_type.scale or 0})"
        else:
            exact = "decimal(10,0)"
        value = exp.cast(x, exact)
        return _spark("CAST(sum(:x * :x) AS STRING)", x=value)
    limbs = 2 if arg_type.name == "bigint" else 3  # 19 or up to 38 digits
    digits = _spark(
        f"lpad(translate(CAST(:x AS STRING), '-.', ''), {limbs * _LIMB_DIGITS}, '0')", x=x
    )

    def limb(i: int) -> exp.Expr:  # limb 0 is the least significant
        start = (limbs - 1 - i) * _LIMB_DIGITS + 1
        return _spark(
            f"CAST(substr(:digits, {start}, {_LIMB_DIGITS}) AS DECIMAL({_LIMB_DIGITS},0))",
            digits=digits,
        )

    sums: list[exp.Expr] = []
    for power in range(2 * limbs - 1):
        terms: list[exp.Expr] = []
        for i in range(limbs):
            j = power - i
            if i <= j < limbs:
                product: exp.Expr = exp.Mul(this=limb(i), expression=limb(j))
                if i != j:
                    product = exp.Mul(this=exp.Literal.number(2), expression=product)
                terms.append(product)
        total = terms[0]
        for term in terms[1:]:
            total = exp.Add(this=total, expression=term)
        sums.append(exp.Sum(this=total))
    if arg_type.is_numeric:
        # The scale of x's Spark type (a numeric expression's scale is PostgreSQL's too),
        # inside an aggregate as the query is grouped.
        scale = _spark("substring_index(substring_index(max(typeof(:x)), ',', -1), ')', 1)", x=x)
        exponent = _spark("CAST(2 * CAST(:scale AS INT) AS STRING)", scale=scale)
    else:
        exponent = exp.Literal.string("0")
    # Carry the sums (least significant first) into one digit string: each step keeps the
    # low 13 digits of sum + carry and carries the rest (all parts are non-negative).
    return _spark(
        "aggregate(:sums, named_struct('carry', CAST(0 AS DECIMAL(38,0)), 'digits', ''), "
        "(acc, part) -> named_struct("
        "'carry', CAST(substr(concat('0000000000000', CAST(part + acc.carry AS STRING)), 1, "
        "length(concat('0000000000000', CAST(part + acc.carry AS STRING))) - 13) "
        "AS DECIMAL(38,0)), "
        "'digits', concat(substr(concat('0000000000000', CAST(part + acc.carry AS STRING)), "
        "-13), acc.digits)), "
        "acc -> concat(CAST(acc.carry AS STRING), acc.digits, 'E-', :exponent))",
        sums=exp.Array(expressions=sums),
        exponent=exponent,
    )


def moments_partial(x: exp.Expr, sql_type: SqlType) -> exp.Expr:
    """{N, Sx, Sxx} of x, the text of the PostgreSQL array moments_type names."""
    if sql_type.is_float:
        # PostgreSQL's float8 state {N, Sx, Sxx}, Sxx the sum of squared deviations from the
        # mean: Spark's var_pop is computed stably (Welford), times N gives it back.
        return _spark(
            "concat('{', CAST(count(:x) AS STRING), ',', CAST(sum(:x) AS STRING), ',', "
            "CAST(var_pop(:x) * count(:x) AS STRING), '}')",
            x=exp.cast(x, "double"),
        )
    # NULL (no row) when sum(x) is NULL, like PostgreSQL's state.
    return _spark(
        "concat('{', CAST(count(:x) AS STRING), ',', CAST(sum(:sx) AS STRING), ',', :sxx, '}')",
        x=x,
        sx=sum_input(x, sql_type),
        sxx=_exact_sum_of_squares(x, sql_type),
    )


def moments_type(sql_type: SqlType) -> str:
    return "double precision[]" if sql_type.is_float else "numeric[]"


def _comparable(x: exp.Expr, arg_type: SqlType) -> exp.Expr:
    """x as Spark should compare it for distinctness the way PostgreSQL does."""
    if arg_type.is_float:  # -0.0 = 0.0 in PostgreSQL; keep one of them
        zero = exp.cast(exp.Literal.number(0), arg_type.spark())
        return exp.If(this=exp.EQ(this=x.copy(), expression=zero), true=zero.copy(), false=x.copy())
    return x


def value_set_partial(x: exp.Expr, sql_type: SqlType) -> exp.Expr:
    """The distinct non-NULL values of x, the text of the array value_set_type names."""
    if sql_type.name == "text":
        # Quote every element: "..." with backslash and double quote escaped.
        elements = _spark(
            "transform(collect_set(:x), v -> concat('\"', "
            "replace(replace(v, :backslash, :two_backslashes), '\"', :escaped_quote), '\"'))",
            x=x,
            backslash=exp.Literal.string("\\"),
            two_backslashes=exp.Literal.string("\\\\"),
            escaped_quote=exp.Literal.string('\\"'),
        )
        return _pg_array(elements)
    if sql_type.name == "date":
        values = _spark("collect_set(unix_date(:x))", x=x)
    elif sql_type.is_temporal:
        values = _spark("collect_set(unix_micros(CAST(:x AS TIMESTAMP)))", x=x)
    else:
        values = exp.ArrayUniqueAgg(this=_comparable(x, sql_type))
    return _pg_array(_spark("CAST(:collected AS ARRAY<STRING>)", collected=values))


def value_set_type(sql_type: SqlType) -> str:
    if sql_type.name == "date":
        return "integer[]"
    if sql_type.is_temporal:
        return "bigint[]"
    return f"{sql_type.name}[]"


def kmv_partial(x: exp.Expr, sql_type: SqlType) -> exp.Expr:
    """The KMV_K smallest distinct hashes of x, the text of a PostgreSQL bigint[]."""
    x = _comparable(x, sql_type)
    smallest = _spark(
        f"slice(array_sort(collect_set(CASE WHEN :x IS NOT NULL THEN xxhash64(:x) END)), "
        f"1, {KMV_K})",
        x=x,
    )
    return _pg_array(_spark("CAST(:hashes AS ARRAY<STRING>)", hashes=smallest))


def ddsketch_bucket(x: exp.Expr) -> exp.Expr:
    """Spark: the DDSketch bucket of a double x (strata_ddsketch_bucket in sql/002)."""
    ln_gamma = f"CAST({DDSKETCH_LN_GAMMA!r} AS DOUBLE)"
    index = f"least(ceil(ln({{x}}) / {ln_gamma}), {DDSKETCH_MAX_INDEX})"
    return _spark(
        f"CASE WHEN :x > 0 THEN {DDSKETCH_OFFSET} + {index.format(x=':x')} "
        f"WHEN :x < 0 THEN -{DDSKETCH_OFFSET} - {index.format(x='-:x')} "
        "WHEN :x = 0 THEN 0 END",
        x=x,
    )


def ddsketch_partial(x: exp.Expr) -> exp.Expr:
    """The DDSketch of x, the text of a jsonb object {bucket: count}."""
    bucket = ddsketch_bucket(exp.cast(x, "double"))
    # Run-length count of the sorted buckets without an O(n^2) step: the positions where a
    # new bucket starts (and the end), then the differences of consecutive positions.
    # element_at(transform(array(value), name -> ...), 1) binds a value to a name once.
    return _spark(
        "element_at(transform(array(array_sort(collect_list(:bucket))), buckets -> "
        "element_at(transform(array(filter(transform(zip_with(buckets, "
        "concat(array(NULL), buckets), (this, previous) -> this <=> previous), "
        "(same, i) -> IF(same, -1, i)), i -> i >= 0)), starts -> "
        "to_json(map_from_arrays(array_distinct(buckets), "
        "filter(zip_with(slice(starts, 2, size(starts)), starts, "
        "(following, start) -> following - start), n -> n IS NOT NULL)))), 1)), 1)",
        bucket=bucket,
    )
