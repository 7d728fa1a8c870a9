"""Row-level expressions that Spark evaluates on a run's rows: type them and translate them.

Spark computes group keys, WHERE conditions and aggregate arguments; PostgreSQL is the
oracle. Only expressions whose meaning is the same in both engines are accepted
(invariant 4): an allowlist of node types, PostgreSQL's typing rules, and translations
where the engines differ (``int / int`` is integer division in PostgreSQL, ``DIV`` in Spark).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter.errors import UnsupportedSQL
from rewriter.types import SqlType

Schema = Mapping[str, SqlType]

SUPPORTED_EXPRESSIONS = (
    "columns, literals, + - * / %, comparisons, AND/OR/NOT, IS [NOT] NULL, "
    "CASE, COALESCE, CAST to a number type, ||, lower(), upper(), abs()"
)

_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
_COMPARISON = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_INT_RANK = {"smallint": 0, "integer": 1, "bigint": 2}

BOOLEAN = SqlType("boolean")
TEXT = SqlType("text")


def _position(node: exp.Expr) -> str:
    sql = node.sql("postgres")
    return sql if len(sql) <= 60 else sql[:57] + "..."


def unsupported(node: exp.Expr, what: str) -> UnsupportedSQL:
    return UnsupportedSQL(f"{what} in {_position(node)!r}; supported here: {SUPPORTED_EXPRESSIONS}")


def infer_type(node: exp.Expr, schema: Schema) -> SqlType:
    """PostgreSQL's result type of a supported row-level expression."""
    if isinstance(node, exp.Paren):
        return infer_type(node.this, schema)
    if isinstance(node, exp.Column):
        found = schema.get(node.name)
        if found is None:
            raise UnsupportedSQL(
                f"column {node.name!r} does not exist; columns: {', '.join(schema) or '(none)'}"
            )
        return found
    if isinstance(node, exp.Literal):
        if node.is_string:
            return TEXT
        text = node.this
        if "." in text or "e" in text.lower():
            return SqlType("numeric")
        value = int(text)
        return SqlType("integer") if -(2**31) <= value < 2**31 else SqlType("bigint")
    if isinstance(node, exp.Boolean):
        return BOOLEAN
    if isinstance(node, exp.Null):
        return TEXT
    if isinstance(node, exp.Neg | exp.Abs):
        return _require_number(node, infer_type(node.this, schema))
    if isinstance(node, _ARITHMETIC):
        left = _require_number(node, infer_type(node.this, schema))
        right = _require_number(node, infer_type(node.expression, schema))
        return _promote(node, left, right)
    if isinstance(node, (*_COMPARISON, exp.And, exp.Or, exp.Not, exp.Is)):
        for child in node.iter_expressions():
            infer_type(child, schema)
        return BOOLEAN
    if isinstance(node, exp.DPipe):
        for side in (node.this, node.expression):
            if infer_type(side, schema) != TEXT:
                raise unsupported(node, "|| joins text values only")
        return TEXT
    if isinstance(node, exp.Lower | exp.Upper):
        if infer_type(node.this, schema) != TEXT:
            raise unsupported(node, "lower() and upper() take text")
        return TEXT
    if isinstance(node, exp.Cast):
        inner = infer_type(node.this, schema)
        from rewriter.types import sql_type_from_sqlglot

        target = sql_type_from_sqlglot(node.to, column=_position(node))
        if not (target.is_number and inner.is_number):
            raise unsupported(node, "CAST is supported between number types only")
        return target
    if isinstance(node, exp.Coalesce):
        return _common(node, [node.this, *node.expressions], schema)
    if isinstance(node, exp.Case):
        for branch in node.args.get("ifs") or []:
            infer_type(branch.this, schema)
        results = [b.args["true"] for b in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            results.append(node.args["default"])
        return _common(node, results, schema)
    raise unsupported(node, f"{type(node).__name__.lower()} is not supported")


def _require_number(node: exp.Expr, sql_type: SqlType) -> SqlType:
    if not sql_type.is_number:
        raise unsupported(node, f"arithmetic needs numbers, not {sql_type.pg()}")
    return sql_type


def _promote(node: exp.Expr, left: SqlType, right: SqlType) -> SqlType:
    if left.is_float or right.is_float:
        # PostgreSQL has no float4-with-integer operators that stay float4 in general:
        # anything mixed with a float computes in double precision.
        if left.name == right.name == "real":
            return left
        return SqlType("double precision")
    if left.is_numeric or right.is_numeric:
        return SqlType("numeric")
    return left if _INT_RANK[left.name] >= _INT_RANK[right.name] else right


def _common(node: exp.Expr, parts: list[exp.Expr], schema: Schema) -> SqlType:
    types = [infer_type(p, schema) for p in parts if not isinstance(p, exp.Null)]
    if not types:
        return TEXT
    result = types[0]
    for other in types[1:]:
        if result == other:
            continue
        if result.is_number and other.is_number:
            result = _promote(node, result, other)
        else:
            raise unsupported(node, f"mixes {result.pg()} and {other.pg()}")
    return result


def to_spark(node: exp.Expr, schema: Schema) -> exp.Expr:
    """Translate a PostgreSQL row-level expression into one Spark evaluates identically."""
    infer_type(node, schema)  # validates the whole tree against the allowlist
    return _translate(node, schema)


def _translate(node: exp.Expr, schema: Schema) -> exp.Expr:
    # Types are read off the original (PostgreSQL) tree; children are translated first.
    if isinstance(node, exp.Column):
        return exp.column(node.name, quoted=True)
    if isinstance(node, exp.Literal) and not node.is_string and "." in node.this:
        # A decimal literal is numeric in PostgreSQL; make Spark's type explicit too.
        digits = node.this.replace("-", "").replace(".", "")
        scale = len(node.this.split(".", 1)[1])
        precision = max(len(digits), scale, 1)
        return exp.cast(node.copy(), f"decimal({precision},{scale})")
    copy = node.copy()
    for original, duplicate in zip(
        list(node.iter_expressions()), list(copy.iter_expressions()), strict=True
    ):
        duplicate.replace(_translate(original, schema))
    if not isinstance(node, exp.Div):
        return copy
    left = infer_type(node.this, schema)
    right = infer_type(node.expression, schema)
    if left.is_integer and right.is_integer:
        # PostgreSQL divides integers to an integer, truncating toward zero; so does DIV.
        return exp.IntDiv(this=copy.this, expression=copy.expression)
    if left.is_float or right.is_float:
        return exp.Div(
            this=exp.cast(copy.this, "double"), expression=exp.cast(copy.expression, "double")
        )
    raise unsupported(
        node,
        "division of numeric values inside a row expression is not supported, because "
        "PostgreSQL and Spark round numeric quotients differently; divide after "
        "aggregating (e.g. sum(x) / count(*)) or cast to double precision",
    )
