"""Row-level expressions that Spark evaluates on a run's rows: type them and translate them.

Spark computes group keys, WHERE conditions and aggregate arguments; PostgreSQL is the
oracle. Only expressions whose meaning is the same in both engines are accepted
(invariant 4): an allowlist of node types, PostgreSQL's typing rules, and translations
where the engines differ (``int / int`` is integer division in PostgreSQL, ``DIV`` in Spark;
casts to integers round in PostgreSQL and truncate in Spark; lower()/upper() change ASCII
letters only under the archives' "C" collation). tests/test_differential.py checks each
against both engines.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from decimal import Decimal

from sqlglot import exp

from rewriter.errors import UnsupportedSQL
from rewriter.functions import Call, Refused, arguments, function_for
from rewriter.positions import position_of
from rewriter.types import INTEGER_DIGITS, SqlType, promote, sql_type_from_sqlglot

Schema = Mapping[str, SqlType]

SUPPORTED_EXPRESSIONS = (
    "columns, literals, + - * / %, comparisons, AND/OR/NOT, IS [NOT] NULL, "
    "CASE, COALESCE, CAST to a number type (or to the value's own type), CAST of integers, "
    "booleans, dates and numeric(p,s) to text, CAST(timestamp AS date), ||, lower(), upper(), "
    "abs(), BETWEEN, [NOT] IN (list), [NOT] LIKE, round(), floor(), ceil(), sign(), sqrt(), "
    "power(), mod(), greatest(), least(), nullif(), length(), replace(), strpos(), position(), "
    "left(), right(), substring(), split_part(), trim()/btrim()/ltrim()/rtrim(), concat(), "
    "reverse(), repeat(), lpad(), rpad(), starts_with(), date_trunc(unit, ts, 'UTC'), "
    "extract(field FROM ts AT TIME ZONE 'UTC'), extract(epoch FROM ts), date_part(), "
    "to_char(ts AT TIME ZONE 'UTC', pattern), ~, !~, substring(x FROM pattern), "
    "(regexp_match(x, pattern))[n], regexp_replace(x, pattern, text, 'g'), ILIKE, "
    "ts AT TIME ZONE 'UTC', timestamptz + or - a fixed INTERVAL"
)

_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
_COMPARISON = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)

BOOLEAN = SqlType("boolean")
TEXT = SqlType("text")


def conjuncts(*conditions: exp.Expr | None) -> list[exp.Expr]:
    """The ANDed parts of ``conditions``, parentheses dropped (absent conditions have none)."""
    flat: list[exp.Expr] = []
    for condition in conditions:
        if condition is None:
            continue
        parts = condition.flatten() if isinstance(condition, exp.And) else [condition]
        flat.extend(part.unnest() for part in parts)
    return flat


def _position(node: exp.Expr) -> str:
    sql = node.sql("postgres")
    return sql if len(sql) <= 60 else sql[:57] + "..."


# Constructs sqlglot parses into nodes whose class names are not what the user wrote.
_CONSTRUCTS: dict[type[exp.Expr], str] = {
    exp.Window: "a window function (OVER)",
    exp.Subquery: "a subquery",
    exp.Exists: "EXISTS (subquery) (a semi-join as a condition of WHERE, see CREATE STREAM AS)",
    exp.RegexpILike: "~* (case-insensitive regular expression match)",
    exp.SimilarTo: "SIMILAR TO",
    exp.Array: "an ARRAY",
    exp.Interval: "an INTERVAL here",
    exp.Placeholder: "a parameter placeholder",
    exp.Star: "*",
}
# The time of reading: no value of the row, so a stream's rows cannot keep it; a read can.
# READING_TIMES: the calls of it, as written (user functions' bodies refuse them too).
_AT_READING = (
    "{} (the time of reading, not a value of the row: filter by it when reading the view, as "
    "in SELECT ... FROM view WHERE window_end > now() - INTERVAL '1 hour')"
)
READING_TIMES: dict[type[exp.Expr], str] = {
    exp.CurrentTimestamp: "now()",
    exp.CurrentDate: "current_date",
    exp.CurrentTime: "current_time",
    exp.Localtimestamp: "localtimestamp",
}


def construct_name(node: exp.Expr) -> str:
    """What the user wrote, named in SQL's words (not the parser's class names)."""
    if isinstance(node, exp.Anonymous):
        if node.name.lower() == "mz_now":  # Materialize's temporal filters
            return _AT_READING.format("mz_now()")
        return f"{node.name}()"
    reading = next((n for cls, n in READING_TIMES.items() if isinstance(node, cls)), None)
    if reading is not None:
        return _AT_READING.format(reading)
    named = next((n for cls, n in _CONSTRUCTS.items() if isinstance(node, cls)), None)
    if named is not None:
        return named
    if isinstance(node, exp.Func):
        head = node.sql("postgres").split("(", 1)[0].strip()
        if head.replace("_", "").isalnum():
            return f"{head.lower()}()"
    return "this expression"


def unsupported(node: exp.Expr, what: str) -> UnsupportedSQL:
    """``what`` is not supported at ``node``: where it is (line and column, when the statement
    recorded them), as written, and what is supported instead."""
    return UnsupportedSQL(
        f"{what} in {_position(node)!r}; supported here: {SUPPORTED_EXPRESSIONS}",
        position=position_of(node),
    )


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
            if _decimal_literal(text)[1] > 38:
                raise unsupported(node, "numeric literals hold at most 38 digits (Spark's limit)")
            return SqlType("numeric")
        value = int(text)
        if -(2**31) <= value < 2**31:
            return SqlType("integer")
        if -(2**63) <= value < 2**63:
            return SqlType("bigint")
        if len(text) > 38:
            raise unsupported(node, "numeric literals hold at most 38 digits (Spark's limit)")
        return SqlType("numeric")  # as in PostgreSQL: too large for bigint
    if isinstance(node, exp.Boolean):
        return BOOLEAN
    if isinstance(node, exp.Null):
        return TEXT
    if isinstance(node, exp.Neg | exp.Abs):
        return _require_number(node, infer_type(node.this, schema))
    if isinstance(node, exp.Add | exp.Sub) and _interval_us(node.expression) is not None:
        # A moment shifted by a fixed duration (join bands: s2.t - INTERVAL '1 minute').
        moment = infer_type(node.this, schema)
        if moment.name != "timestamptz":
            raise unsupported(node, f"an INTERVAL is added to timestamptz, not {moment.pg()}")
        return moment
    if isinstance(node, exp.Between):
        _require_comparable(node, node.this, node.args["low"], schema)
        _require_comparable(node, node.this, node.args["high"], schema)
        return BOOLEAN
    if isinstance(node, _ARITHMETIC):
        left = _require_number(node, infer_type(node.this, schema))
        right = _require_number(node, infer_type(node.expression, schema))
        if isinstance(node, exp.Mod) and (left.is_float or right.is_float):
            raise unsupported(node, "% is not defined for real and double precision in PostgreSQL")
        return promote(left, right)
    if isinstance(node, _COMPARISON):
        _require_comparable(node, node.this, node.expression, schema)
        return BOOLEAN
    if isinstance(node, exp.And | exp.Or | exp.Not):
        for operand in node.iter_expressions():
            _require_boolean(node, operand, schema)
        return BOOLEAN
    if isinstance(node, exp.Is):
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
        target = sql_type_from_sqlglot(node.to, column=_position(node))
        if target == inner:
            return inner  # an identity cast (b::boolean on a boolean, d::date on a date)
        if target == TEXT:
            return _cast_to_text(node, inner)
        if target.name == "date" and inner.name == "timestamp":
            return target
        if (inner, target.name) in _OTHER_CASTS or (
            inner == TEXT and (target.is_integer or target.name in _FROM_TEXT)
        ):
            return target
        if target.name == "date" and inner.name == "timestamptz":
            raise unsupported(
                node,
                "CAST of a timestamptz to date depends on PostgreSQL's session time zone; "
                "write CAST(ts AT TIME ZONE 'UTC' AS date)",
            )
        if not (target.is_number and inner.is_number):
            raise unsupported(
                node,
                f"CAST of {inner.pg()} to {target.pg()} is not supported; casts go between "
                "number types, to text (from integers, booleans, dates, timestamps and "
                "numeric(p,s)), from text (to integers, booleans, dates and timestamps), "
                "between integer and boolean, from date to timestamp and from timestamp to "
                "date",
            )
        if inner.is_float and target.is_numeric:
            raise unsupported(
                node,
                "CAST from real or double precision to numeric is not supported, because "
                "PostgreSQL first rounds the value to 15 significant digits and Spark does not",
            )
        return target
    if isinstance(node, exp.Coalesce):
        return _common(node, [node.this, *node.expressions], schema)
    if isinstance(node, exp.Case):
        for branch in node.args.get("ifs") or []:
            if node.this is None:
                _require_boolean(node, branch.this, schema)
            else:
                _require_comparable(node, node.this, branch.this, schema)
        results = [b.args["true"] for b in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            results.append(node.args["default"])
        return _common(node, results, schema)
    entry = function_for(node)
    if entry is not None:
        args = arguments(node, entry)
        types = [None if a is None else infer_type(a, schema) for a in args]
        try:
            return entry.result(Call(node, args, types, []))
        except Refused as refused:
            raise unsupported(node, str(refused)) from None
    raise unsupported(node, f"{construct_name(node)} is not supported")


# Casts PostgreSQL and Spark make alike, beyond numbers: (from, to).
_OTHER_CASTS = {
    (SqlType("boolean"), "integer"),
    (SqlType("integer"), "boolean"),
    (SqlType("date"), "timestamp"),
}
_FROM_TEXT = ("boolean", "date", "timestamp")
_SPACE = "\\s*"
# The text a cast to these types reads, in both engines (PostgreSQL reads more spellings
# of dates and times; Spark fails the run on those, it never reads them otherwise).
_TEXT_FORMS = {
    "date": f"^{_SPACE}[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}{_SPACE}$",
    "timestamp": f"^{_SPACE}[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}([ T][0-9]{{2}}:[0-9]{{2}}(:[0-9]{{2}}"
    f"([.][0-9]{{1,6}})?)?)?{_SPACE}$",
}
# PostgreSQL's boolin: a prefix of true/false/yes/no, on/off (two letters at least), 1/0,
# in any case, around spaces.
_TRUE = ("t", "tr", "tru", "true", "y", "ye", "yes", "on", "1")
_FALSE = ("f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0")


def _from_text(value: exp.Expr, target: SqlType) -> exp.Expr:
    """A cast of text that reads what PostgreSQL reads, or fails the run as it does."""
    if target.is_integer:
        # ANSI casts fail on what PostgreSQL refuses (letters, fractions, overflow).
        return exp.cast(value, exp.DataType.build(target.spark(), dialect="spark"))
    if target.name == "boolean":
        word = exp.Lower(
            this=exp.func(
                "regexp_replace",
                value,
                exp.Literal.string(f"^{_SPACE}|{_SPACE}$"),
                exp.Literal.string(""),
            )
        )
        invalid = exp.func(
            "raise_error", exp.Literal.string("invalid input syntax for type boolean")
        )
        return (
            exp.Case()
            .when(exp.Is(this=value.copy(), expression=exp.Null()), exp.Null())
            .when(
                exp.In(this=word, expressions=[exp.Literal.string(w) for w in _TRUE]),
                exp.true(),
            )
            .when(
                exp.In(this=word.copy(), expressions=[exp.Literal.string(w) for w in _FALSE]),
                exp.false(),
            )
            .else_(invalid)
        )
    form = exp.Literal.string(_TEXT_FORMS[target.name])
    message = exp.Literal.string(
        f"only ISO text ({'YYYY-MM-DD' if target.name == 'date' else 'YYYY-MM-DD HH:MI:SS'})"
        f" is cast to {target.pg()} here"
    )
    return exp.If(
        this=exp.or_(
            exp.Is(this=value, expression=exp.Null()),
            exp.RegexpLike(this=value.copy(), expression=form),
        ),
        true=exp.cast(
            exp.func("trim", value.copy()), exp.DataType.build(target.spark(), dialect="spark")
        ),
        false=exp.func("raise_error", message),
    )


def _cast_to_text(node: exp.Expr, inner: SqlType) -> SqlType:
    # Both engines write integers, booleans ('true'/'false'), dates (ISO) and decimals of a
    # fixed scale alike; other types have engine-specific spellings.
    if inner.is_integer or inner.name in ("boolean", "date", "timestamp"):
        return TEXT
    if inner.is_numeric and inner.precision is not None:
        return TEXT
    raise unsupported(
        node,
        f"CAST of {inner.pg()} to text is not supported (the engines write it differently); "
        "casts to text take integers, booleans, dates and numeric(p,s)",
    )


def _require_number(node: exp.Expr, sql_type: SqlType) -> SqlType:
    if not sql_type.is_number:
        raise unsupported(node, f"arithmetic needs numbers, not {sql_type.pg()}")
    return sql_type


def _interval_us(node: exp.Expr) -> int | None:
    """Microseconds of a fixed-length INTERVAL literal (None if ``node`` is none). A day is
    24 hours, as in UTC; months and years have no fixed length and are refused."""
    if not isinstance(node, exp.Interval):
        return None
    from rewriter.resolve_window import parse_interval  # one reading of interval literals

    return parse_interval(node, "interval in an expression")


def _untyped(node: exp.Expr) -> bool:
    """A NULL or a string literal: PostgreSQL gives it the type its context needs."""
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Null) or (isinstance(node, exp.Literal) and node.is_string)


def _require_boolean(node: exp.Expr, operand: exp.Expr, schema: Schema) -> None:
    found = infer_type(operand, schema)
    if found != BOOLEAN and not isinstance(operand, exp.Null):
        raise unsupported(node, f"needs a boolean, not {found.pg()}")


def _require_comparable(node: exp.Expr, left: exp.Expr, right: exp.Expr, schema: Schema) -> None:
    # PostgreSQL refuses e.g. text > integer; Spark would cast the text at run time (and fail
    # on the first value that is no number). timestamptz vs timestamp or date would depend
    # on PostgreSQL's session time zone.
    types = (infer_type(left, schema), infer_type(right, schema))
    if _untyped(left) or _untyped(right) or types[0].name == types[1].name:
        return
    if not (types[0].is_number and types[1].is_number):
        raise unsupported(node, f"compares {types[0].pg()} with {types[1].pg()}")


def _decimal_literal(text: str) -> tuple[str, int, int]:
    """A numeric literal in plain notation (2.5e3 -> 2500), its precision and its scale."""
    plain = format(Decimal(text), "f")
    scale = len(plain.split(".", 1)[1]) if "." in plain else 0
    precision = len(plain.replace("-", "").replace(".", ""))
    return plain, max(precision, scale, 1), scale


def _common(node: exp.Expr, parts: list[exp.Expr], schema: Schema) -> SqlType:
    types = [infer_type(p, schema) for p in parts if not isinstance(p, exp.Null)]
    if not types:
        return TEXT
    result = types[0]
    for other in types[1:]:
        if result == other:
            continue
        if result.is_number and other.is_number:
            result = promote(result, other)
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
    if isinstance(node, exp.Literal) and not node.is_string:
        if not infer_type(node, schema).is_numeric:
            return node.copy()
        # A decimal literal (1.5, 2.5e3, or an integer beyond bigint) is numeric in
        # PostgreSQL; Spark would read 2.5e3 as a double: write it out as an exact decimal.
        plain, precision, scale = _decimal_literal(node.this)
        return exp.cast(exp.Literal.number(plain), f"decimal({precision},{scale})")
    entry = function_for(node)
    if entry is not None:
        args = arguments(node, entry)
        return entry.translate(
            Call(
                node,
                args,
                [None if a is None else infer_type(a, schema) for a in args],
                [None if a is None else _translate(a, schema) for a in args],
            )
        )
    shift = _interval_us(node.expression) if isinstance(node, exp.Add | exp.Sub) else None
    if shift is not None:
        # Microsecond arithmetic: exact, and the same instant PostgreSQL computes in UTC.
        micros = exp.func("unix_micros", _translate(node.this, schema))
        step = exp.Literal.number(shift)
        moved = (
            exp.Add(this=micros, expression=step)
            if isinstance(node, exp.Add)
            else exp.Sub(this=micros, expression=step)
        )
        return exp.func("timestamp_micros", moved)
    copy = node.copy()
    for original, duplicate in zip(
        list(node.iter_expressions()), list(copy.iter_expressions()), strict=True
    ):
        duplicate.replace(_translate(original, schema))
    if isinstance(node, exp.Lower | exp.Upper):
        # The archives' text columns are COLLATE "C", under which PostgreSQL's lower() and
        # upper() change ASCII letters only ('Ä' stays 'Ä'); Spark's would change all.
        pair = (string.ascii_uppercase, string.ascii_lowercase)
        source, target = pair if isinstance(node, exp.Lower) else pair[::-1]
        return exp.func(
            "translate", copy.this, exp.Literal.string(source), exp.Literal.string(target)
        )
    if isinstance(node, exp.Cast):
        inner = infer_type(node.this, schema)
        cast_to = infer_type(node, schema)
        value = copy.this
        if cast_to == inner:
            return value
        if inner == TEXT and cast_to != TEXT:
            return _from_text(value, cast_to)
        if (
            cast_to == TEXT
            or cast_to.name in ("date", "timestamp", "boolean")
            or inner.name == "boolean"
        ):
            return exp.cast(value, exp.DataType.build(cast_to.spark(), dialect="spark"))
        if cast_to.is_numeric and cast_to.precision is None:
            # Unbounded numeric keeps every digit (PostgreSQL's scale): a numeric value
            # keeps the exact decimal type Spark gives it, an integer becomes a decimal
            # wide enough for every value of its type.
            if inner.is_numeric:
                return value
            digits = INTEGER_DIGITS[inner.name]
            return exp.cast(value, exp.DataType.build(f"decimal({digits},0)", dialect="spark"))
        if cast_to.is_integer and inner.is_float:
            # PostgreSQL rounds to the nearest integer (ties to even, rint()); Spark truncates.
            value = exp.func("rint", value)
        elif cast_to.is_integer and inner.is_numeric:
            # PostgreSQL rounds ties away from zero, as Spark's round() does; Spark's CAST
            # truncates.
            value = exp.func("round", value, exp.Literal.number(0))
        # Spark's own spelling: plain DECIMAL would be decimal(10,0) there.
        return exp.cast(value, exp.DataType.build(cast_to.spark(), dialect="spark"))
    if not isinstance(node, exp.Div):
        return copy
    left = infer_type(node.this, schema)
    right = infer_type(node.expression, schema)
    if left.is_integer and right.is_integer:
        # PostgreSQL divides integers to an integer, truncating toward zero; so does DIV.
        # DIV always yields a bigint: cast back, so -2147483648 / -1 overflows as in
        # PostgreSQL (and the result type matches).
        quotient = exp.IntDiv(this=copy.this, expression=copy.expression)
        result = promote(left, right)
        if result.name == "bigint":
            return quotient
        return exp.cast(quotient, exp.DataType.build(result.spark(), dialect="spark"))
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
