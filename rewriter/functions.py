"""PostgreSQL row functions Strata accepts, one entry each: argument types, result type,
and the Spark expression that evaluates identically (invariant 4).

An entry reads as a row of a table: the sqlglot node a call parses into, the name users
write, the argument slots of the node, a typing rule (PostgreSQL's result type, or a
refusal naming what to write instead) and a translation over the already translated
arguments. ``rewriter.expressions`` types and translates the arguments and consults this
table; tests/test_differential.py checks every entry against both engines.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from rewriter.text_patterns import PatternRefused, Regex, regex, replacement, to_char
from rewriter.types import INTEGER_DIGITS, SqlType, promote

TEXT = SqlType("text")
INTEGER = SqlType("integer")
BOOLEAN = SqlType("boolean")
DOUBLE = SqlType("double precision")
NUMERIC = SqlType("numeric")
TIMESTAMPTZ = SqlType("timestamptz")
TIMESTAMP = SqlType("timestamp")
DATE = SqlType("date")


class Refused(Exception):
    """A call the table does not accept; the message says what to write instead."""


@dataclass(frozen=True)
class Call:
    """A call being typed or translated: its PostgreSQL arguments (in order, absent
    optional ones as None), their types, and (when translating) their Spark forms."""

    node: exp.Expr
    args: list[exp.Expr | None]
    types: list[SqlType | None]
    spark: list[exp.Expr | None]

    def arg(self, k: int) -> exp.Expr:
        found = self.spark[k]
        assert found is not None
        return found

    def type(self, k: int) -> SqlType:
        found = self.types[k]
        assert found is not None
        return found


@dataclass(frozen=True)
class Function:
    name: str
    slots: tuple[str, ...]  # the node's argument keys, in PostgreSQL's order; "*" = a list
    result: Callable[[Call], SqlType]
    translate: Callable[[Call], exp.Expr]
    # For a node whose arguments are not its own slots (a subscript of a call): them.
    unpack: Callable[[exp.Expr], list[exp.Expr | None]] | None = None


# ---------------------------------------------------------------------------------------
# Small builders and checks.
# ---------------------------------------------------------------------------------------


def _f(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.func(name, *args, dialect="spark")


def _n(value: int) -> exp.Expr:
    return exp.Literal.number(value)


def _s(value: str) -> exp.Literal:
    return exp.Literal.string(value)


def _case(*branches: tuple[exp.Expr, exp.Expr], default: exp.Expr) -> exp.Expr:
    case = exp.Case()
    for condition, value in branches:
        case = case.when(condition, value)
    return case.else_(default)


def _double(value: exp.Expr) -> exp.Expr:
    return exp.cast(value, "double")


def _fail(message: str) -> exp.Expr:
    """Spark raises where PostgreSQL raises (``raise_error`` fails the query)."""
    return _f("raise_error", _s(message))


def _is_int4(t: SqlType | None) -> bool:
    # PostgreSQL's integer parameters take smallint and integer, not bigint.
    return t is not None and t.name in ("smallint", "integer")


def _texts(call: Call, *slots: int) -> None:
    for k in slots:
        if call.types[k] is not None and call.types[k] != TEXT:
            raise Refused(f"{_name(call)}() takes text, not {call.type(k).pg()}")


def _int4s(call: Call, *slots: int) -> None:
    for k in slots:
        if call.types[k] is not None and not _is_int4(call.types[k]):
            raise Refused(
                f"{_name(call)}() takes an integer here, not {call.type(k).pg()} "
                "(cast a bigint with CAST(x AS integer))"
            )


def _name(call: Call) -> str:
    entry = function_for(call.node)
    return entry.name if entry is not None else call.node.sql("postgres")


def _number(call: Call) -> SqlType:
    found = call.type(0)
    if not found.is_number:
        raise Refused(f"{_name(call)}() takes a number, not {found.pg()}")
    return found


def _int_literal(node: exp.Expr | None) -> int | None:
    """The value of an integer literal (``2``, ``-2``), else None."""
    negative = isinstance(node, exp.Neg)
    inner = node.this if isinstance(node, exp.Neg) else node
    if isinstance(inner, exp.Literal) and not inner.is_string and inner.this.isdigit():
        return -int(inner.this) if negative else int(inner.this)
    return None


def _as_decimal(value: exp.Expr, t: SqlType) -> exp.Expr:
    if t.is_integer:
        digits = INTEGER_DIGITS[t.name]
        return exp.cast(value, exp.DataType.build(f"decimal({digits},0)", dialect="spark"))
    return value


# ---------------------------------------------------------------------------------------
# Numbers. PostgreSQL has round/floor/ceil/sign for numeric and double precision only:
# integers become double precision (its preferred number type).
# ---------------------------------------------------------------------------------------


def _float_or_numeric(call: Call) -> SqlType:
    found = _number(call)
    return NUMERIC if found.is_numeric else DOUBLE


def _round_type(call: Call) -> SqlType:
    found = _number(call)
    if call.args[1] is None:
        return NUMERIC if found.is_numeric else DOUBLE
    places = _int_literal(call.args[1])
    if places is None or abs(places) > 38:
        raise Refused(
            "round(x, n) takes a whole-number literal n from -38 to 38 (e.g. round(x, 2))"
        )
    if found.is_float:
        raise Refused(
            "round(double precision, n) does not exist in PostgreSQL; round(x) rounds a "
            "double precision to a whole number, round(numeric, n) to n places"
        )
    return NUMERIC  # round(integer, n) computes in numeric


def _round(call: Call) -> exp.Expr:
    value, t = call.arg(0), call.type(0)
    if call.args[1] is None:
        if t.is_numeric:
            # numeric rounds ties away from zero, as Spark's round() does.
            return _f("round", value, _n(0))
        # double precision rounds ties to even (rint()), as Spark's rint() does.
        return _f("rint", _double(value))
    return _f("round", _as_decimal(value, t), call.arg(1))


def _floor_or_ceil(up: bool) -> Callable[[Call], exp.Expr]:
    def translate(call: Call) -> exp.Expr:
        value, t = call.arg(0), call.type(0)
        if t.is_numeric:
            return _f("ceil" if up else "floor", value)
        # Spark's floor()/ceil() of a double return a bigint (and overflow); step from
        # rint(), which is exact for doubles, keeping double precision as PostgreSQL does.
        x = _double(value)
        nearest = _f("rint", x)
        if up:
            return exp.If(
                this=exp.LT(this=nearest, expression=x),
                true=exp.Add(this=nearest, expression=_n(1)),
                false=nearest.copy(),
            )
        return exp.If(
            this=exp.GT(this=nearest, expression=x),
            true=exp.Sub(this=nearest, expression=_n(1)),
            false=nearest.copy(),
        )

    return translate


def _sign(call: Call) -> exp.Expr:
    value, t = call.arg(0), call.type(0)
    if t.is_numeric:
        return exp.cast(_f("signum", value), exp.DataType.build("decimal(1,0)", dialect="spark"))
    return _f("signum", _double(value))


def _double_only(call: Call) -> SqlType:
    """sqrt(), power(): double precision if an argument is one or all are integers (as
    PostgreSQL resolves them); numeric otherwise, which is refused."""
    found = [t for t in call.types if t is not None]
    for t in found:
        if not t.is_number:
            raise Refused(f"{_name(call)}() takes numbers, not {t.pg()}")
    if any(t.is_numeric for t in found) and not any(t.is_float for t in found):
        raise Refused(
            f"{_name(call)}() of numeric computes a numeric of PostgreSQL's own "
            f"precision, which Spark cannot reproduce; write {_name(call)}() of "
            "CAST(x AS double precision)"
        )
    return DOUBLE


def _sqrt(call: Call) -> exp.Expr:
    x = _double(call.arg(0))
    return _case(
        (exp.LT(this=x, expression=_n(0)), _fail("cannot take square root of a negative number")),
        default=_f("sqrt", x.copy()),
    )


def _power(call: Call) -> exp.Expr:
    x, y = _double(call.arg(0)), _double(call.arg(1))
    result = _f("pow", x, y)
    infinite = exp.cast(_s("Infinity"), "double")
    return _case(
        (
            exp.and_(
                exp.EQ(this=x.copy(), expression=_n(0)), exp.LT(this=y.copy(), expression=_n(0))
            ),
            _fail("zero raised to a negative power is undefined"),
        ),
        (
            exp.and_(
                exp.LT(this=x.copy(), expression=_n(0)),
                exp.NEQ(this=y.copy(), expression=_f("rint", y.copy())),
            ),
            _fail("a negative number raised to a non-integer power yields a complex result"),
        ),
        (
            exp.and_(
                exp.EQ(this=_f("abs", result.copy()), expression=infinite),
                exp.NEQ(this=_f("abs", x.copy()), expression=infinite.copy()),
                exp.NEQ(this=_f("abs", y.copy()), expression=infinite.copy()),
            ),
            _fail("value out of range: overflow"),
        ),
        (
            exp.and_(
                exp.EQ(this=result.copy(), expression=_n(0)),
                exp.NEQ(this=x.copy(), expression=_n(0)),
            ),
            _fail("value out of range: underflow"),
        ),
        default=result,
    )


def _common(call: Call) -> SqlType:
    """One type for all arguments (greatest, least): equal types, or numbers promoted."""
    found = [t for t, a in zip(call.types, call.args, strict=True) if not isinstance(a, exp.Null)]
    if not found:
        return TEXT
    result = found[0]
    for other in found[1:]:
        assert other is not None and result is not None
        if other == result:
            continue
        if not (result.is_number and other.is_number):
            raise Refused(f"{_name(call)}() mixes {result.pg()} and {other.pg()}")
        result = promote(result, other)
    assert result is not None
    return result


def _nullif_type(call: Call) -> SqlType:
    # PostgreSQL gives nullif() the type both arguments resolve to (as in CASE).
    return _common(call)


def _nullif(call: Call) -> exp.Expr:
    first, result = call.type(0), _common(call)
    value = call.arg(0)
    if result.is_float and not first.is_float:
        value = _double(value)
    elif result.is_numeric and first.is_integer:
        value = _as_decimal(value, first)
    return exp.Nullif(this=value, expression=call.arg(1))


# ---------------------------------------------------------------------------------------
# Text. Lengths and positions count characters (code points) in both engines.
# ---------------------------------------------------------------------------------------


def _text_result(
    *text_slots: int, ints: tuple[int, ...] = (), result: SqlType = TEXT
) -> Callable[[Call], SqlType]:
    """A typing rule: these arguments text, those integers; the result ``result``."""

    def typed(call: Call) -> SqlType:
        _texts(call, *text_slots)
        _int4s(call, *ints)
        if isinstance(call.node, exp.StrPosition) and call.args[2] is not None:
            raise Refused("strpos() takes two arguments")
        return result

    return typed


def _kept(text: exp.Expr, n: exp.Expr) -> exp.Expr:
    """Characters left() and right() keep: n, or all but -n when n is negative."""
    length = _f("char_length", text)
    return _case(
        (exp.GTE(this=n, expression=_n(0)), _f("least", n.copy(), length)),
        default=_f("greatest", exp.Add(this=length.copy(), expression=n.copy()), _n(0)),
    )


def _null_on_null(call: Call, result: exp.Expr) -> exp.Expr:
    """NULL if an argument is: Spark's greatest()/least() skip NULLs, which would turn a
    NULL position or count into a number."""
    present = [a.copy() for a in call.spark if a is not None]
    return exp.If(
        this=exp.or_(*(exp.Is(this=a, expression=exp.Null()) for a in present)),
        true=exp.Null(),
        false=result,
    )


def _left(call: Call) -> exp.Expr:
    text = call.arg(0)
    return _null_on_null(call, _f("substring", text, _n(1), _kept(text.copy(), call.arg(1))))


def _right(call: Call) -> exp.Expr:
    text = call.arg(0)
    start = exp.Add(
        this=exp.Sub(
            this=_f("char_length", text.copy()), expression=_kept(text.copy(), call.arg(1))
        ),
        expression=_n(1),
    )
    return _null_on_null(call, _f("substring", text, start))


def _substring_type(call: Call) -> SqlType:
    if call.types[1] == TEXT:  # substring(x FROM 'pattern'): a regular expression
        _texts(call, 0)
        if call.args[2] is not None:
            raise Refused(
                "substring(x FROM pattern FOR escape) (SQL regular expressions) is not "
                "supported; write substring(x FROM 'posix pattern')"
            )
        _regex(call, 1, extracting=True)
        return TEXT
    return _text_result(0, ints=(1, 2))(call)


def _substring(call: Call) -> exp.Expr:
    if call.types[1] == TEXT:
        # The first capture group's text (the whole match without one); NULL if no match.
        return _extracted(call.arg(0), _regex(call, 1, extracting=True), 1)
    # PostgreSQL: characters at positions start .. start+count-1 that exist (positions
    # below 1 just shorten the result); Spark counts negative positions from the end.
    text, start = call.arg(0), call.arg(1)
    first = _f("greatest", start, _n(1))
    if call.args[2] is None:
        return _null_on_null(call, _f("substring", text, first))
    count = call.arg(2)
    end = exp.Add(this=exp.cast(start.copy(), "bigint"), expression=count)
    length = _f(
        "least",
        _f("greatest", exp.Sub(this=end, expression=first.copy()), _n(0)),
        _n(2**31 - 1),
    )
    return _case(
        (
            exp.LT(this=count.copy(), expression=_n(0)),
            _fail("negative substring length not allowed"),
        ),
        default=_null_on_null(call, _f("substring", text, first.copy(), exp.cast(length, "int"))),
    )


def _concat_type(call: Call) -> SqlType:
    for t in call.types:
        if t is not None and t != TEXT and not t.is_integer:
            raise Refused(
                f"concat() takes text and integers here, not {t.pg()} (PostgreSQL writes "
                "values of other types its own way); cast them to text first"
            )
    return TEXT


def _concat(call: Call) -> exp.Expr:
    # PostgreSQL's concat() skips NULLs (|| does not); Spark's concat() gives NULL.
    parts = [
        _f("coalesce", exp.cast(a, "string") if t != TEXT else a, _s(""))
        for a, t in zip(call.spark, call.types, strict=True)
        if a is not None and t is not None
    ]
    return exp.Concat(expressions=parts)


def _trim(call: Call) -> exp.Expr:
    node = call.node
    copy = exp.Trim(this=call.arg(0), position=node.args.get("position"))
    if call.spark[1] is not None:
        copy.set("expression", call.arg(1))
    return copy


def _pad(call: Call) -> exp.Expr:
    args = [call.arg(0), call.arg(1)] + ([call.arg(2)] if call.spark[2] is not None else [])
    return _f("lpad" if call.node.args.get("is_left") else "rpad", *args)


def _like_type(call: Call) -> SqlType:
    _texts(call, 0, 1)
    pattern = call.args[1]
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise Refused("LIKE takes a string literal as its pattern (e.g. txt LIKE 'a%')")
    text = pattern.this
    k = 0
    while k < len(text):
        if text[k] == "\\":
            # PostgreSQL lets \ escape any character; Spark only %, _ and \ itself.
            if k + 1 >= len(text) or text[k + 1] not in "%_\\":
                raise Refused(
                    "in a LIKE pattern a backslash escapes %, _ or \\ only "
                    "(write the character itself)"
                )
            k += 1
        k += 1
    return BOOLEAN


def _like(call: Call) -> exp.Expr:
    # Both engines escape with a backslash by default, match _ to one character and %
    # to any run of them (newlines included). ILIKE folds ASCII letters only, as
    # PostgreSQL does under the archives' "C" collation.
    text, pattern = call.arg(0), call.arg(1)
    if isinstance(call.node, exp.ILike):
        text, pattern = ascii_lower(text), ascii_lower(pattern)
    like = exp.Like(this=text, expression=pattern)
    return exp.Not(this=like) if call.node.args.get("negate") else like


def ascii_lower(value: exp.Expr) -> exp.Expr:
    """Spark's lower() of ASCII letters only (PostgreSQL's under the "C" collation)."""
    return _f("translate", value, _s(string.ascii_uppercase), _s(string.ascii_lowercase))


# ---------------------------------------------------------------------------------------
# Regular expressions (rewriter.text_patterns: the subset both engines read alike).
# ---------------------------------------------------------------------------------------


def _regex(call: Call, slot: int, *, extracting: bool) -> Regex:
    pattern = call.args[slot]
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise Refused(f"{_name(call)}() takes a string literal as its pattern")
    try:
        return regex(pattern.this, extracting=extracting)
    except PatternRefused as refused:
        raise Refused(f"{_name(call)}(): {refused}") from None


def _extracted(text: exp.Expr, pattern: Regex, group: int) -> exp.Expr:
    """Capture group ``group`` (the whole match when the pattern has none) of the first
    match, NULL when nothing matches (Spark's regexp_extract gives '')."""
    java = _s(pattern.java)
    return exp.If(
        this=exp.RegexpLike(this=text, expression=java),
        true=_f("regexp_extract", text.copy(), java.copy(), _n(group if pattern.groups else 0)),
        false=exp.Null(),
    )


def _matches_type(call: Call) -> SqlType:
    _texts(call, 0)
    _regex(call, 1, extracting=False)
    return BOOLEAN


def _matches(call: Call) -> exp.Expr:
    java = _regex(call, 1, extracting=False).java
    return exp.RegexpLike(this=call.arg(0), expression=_s(java))


def _replace_type(call: Call) -> SqlType:
    _texts(call, 0, 2)
    _regex(call, 1, extracting=True)
    flags = call.args[3]
    if not (isinstance(flags, exp.Literal) and flags.this == "g"):
        raise Refused(
            "regexp_replace() is supported with the flag 'g' (every match): "
            "regexp_replace(x, pattern, replacement, 'g')"
        )
    if not (isinstance(call.args[2], exp.Literal) and call.args[2].is_string):
        raise Refused("regexp_replace() takes a string literal as its replacement")
    return TEXT


def _replace(call: Call) -> exp.Expr:
    pattern = _regex(call, 1, extracting=True)
    template = call.args[2]
    assert isinstance(template, exp.Literal)
    return _f("regexp_replace", call.arg(0), _s(pattern.java), _s(replacement(template.this)))


def _match_at(node: exp.Expr) -> list[exp.Expr | None]:
    """(regexp_match(x, pattern))[n]: x, pattern and n (nothing for other subscripts)."""
    if not isinstance(node, exp.Bracket):
        return []
    call = node.this.unnest()
    if (
        isinstance(call, exp.Anonymous)
        and call.name.lower() == "regexp_match"
        and len(call.expressions) == 2
        and len(node.expressions) == 1
    ):
        return [call.expressions[0], call.expressions[1], node.expressions[0]]
    return []


def _match_at_type(call: Call) -> SqlType:
    if not call.args:
        raise Refused(
            f"the subscript {call.node.sql('postgres')} is not supported; subscripts are "
            "supported on regexp_match(x, pattern) only: (regexp_match(x, pattern))[n]"
        )
    _texts(call, 0)
    pattern = _regex(call, 1, extracting=True)
    n = _subscript(call)
    if n is None or not 1 <= n <= max(pattern.groups, 1):
        raise Refused(
            f"(regexp_match(x, pattern))[n] takes n from 1 to {max(pattern.groups, 1)} "
            "(the pattern's capture groups) as a literal"
        )
    return TEXT


def _match_at_spark(call: Call) -> exp.Expr:
    pattern = _regex(call, 1, extracting=True)
    n = _subscript(call)
    assert n is not None
    return _extracted(call.arg(0), pattern, n)


def _subscript(call: Call) -> int | None:
    """The subscript as written (sqlglot keeps PostgreSQL's 1-based literals 0-based)."""
    stored = _int_literal(call.args[2])
    return None if stored is None else stored + 1


def _regexp_match_type(call: Call) -> SqlType:
    raise Refused(
        "regexp_match() returns an array: take one group, (regexp_match(x, pattern))[n], or "
        "write substring(x FROM pattern)"
    )


def _in_type(call: Call) -> SqlType:
    if call.node.args.get("query") is not None or call.node.args.get("unnest"):
        raise Refused("IN takes a list of values here, not a subquery")
    left = call.type(0)
    for a, t in zip(call.args[1:], call.types[1:], strict=True):
        if t is None or a is None:
            continue
        literal = isinstance(a, exp.Null) or (isinstance(a, exp.Literal) and a.is_string)
        if t.name != left.name and not literal and not (t.is_number and left.is_number):
            raise Refused(f"IN compares {left.pg()} with {t.pg()}")
    return BOOLEAN


def _in(call: Call) -> exp.Expr:
    return exp.In(this=call.arg(0), expressions=[a for a in call.spark[1:] if a is not None])


def _same_node(call: Call) -> exp.Expr:
    """The call as written, over translated arguments (the engines agree on it)."""
    copy = call.node.copy()
    entry = function_for(call.node)
    assert entry is not None
    for slot, value in zip(entry.slots, call.spark, strict=False):
        if value is not None and not slot.startswith("*"):
            copy.set(slot, value)
    return copy


def _variadic(call: Call) -> exp.Expr:
    """greatest()/least(): PostgreSQL and Spark both skip NULLs (NULL only if all are)."""
    args = [a for a in call.spark if a is not None]
    return type(call.node)(this=args[0], expressions=args[1:])


# ---------------------------------------------------------------------------------------
# Time. PostgreSQL truncates a timestamptz in its session's time zone; Strata's meaning is
# UTC, so timestamptz calls name the zone: date_trunc('day', ts, 'UTC'). Spark sessions
# run in UTC.
# ---------------------------------------------------------------------------------------

_TRUNC_UNITS = {
    "MICROSECOND": "MICROSECOND",
    "MICROSECONDS": "MICROSECOND",
    "MILLISECOND": "MILLISECOND",
    "MILLISECONDS": "MILLISECOND",
    "SECOND": "SECOND",
    "MINUTE": "MINUTE",
    "HOUR": "HOUR",
    "DAY": "DAY",
    "WEEK": "WEEK",
    "MONTH": "MONTH",
    "QUARTER": "QUARTER",
    "YEAR": "YEAR",
    # PostgreSQL's plural spellings
    "SECONDS": "SECOND",
    "MINUTES": "MINUTE",
    "HOURS": "HOUR",
    "DAYS": "DAY",
    "WEEKS": "WEEK",
    "MONTHS": "MONTH",
    "YEARS": "YEAR",
}


def _trunc_unit(call: Call) -> str:
    unit = call.node.args.get("unit")
    name = unit.name.upper() if unit is not None else ""
    if name not in _TRUNC_UNITS:
        raise Refused(
            f"date_trunc() unit {name.lower()!r} is not supported; units: "
            "microseconds, milliseconds, second, minute, hour, day, week, month, quarter, year"
        )
    return _TRUNC_UNITS[name]


def _utc_zone(node: exp.Expr | None) -> bool:
    return isinstance(node, exp.Literal) and node.is_string and node.this.upper() == "UTC"


def _date_trunc_type(call: Call) -> SqlType:
    _trunc_unit(call)
    moment = call.type(0)
    zone = call.node.args.get("zone")
    if moment == TIMESTAMPTZ:
        if not _utc_zone(zone):
            raise Refused(
                "date_trunc() of a timestamptz depends on PostgreSQL's session time zone; "
                "write date_trunc('day', ts, 'UTC')"
            )
        return TIMESTAMPTZ
    if moment == TIMESTAMP and zone is None:
        return TIMESTAMP
    raise Refused(f"date_trunc() takes timestamptz (with 'UTC') or timestamp, not {moment.pg()}")


def _date_trunc(call: Call) -> exp.Expr:
    truncated = _f("date_trunc", _s(_trunc_unit(call)), call.arg(0))
    if call.type(0) == TIMESTAMP:
        # Spark truncates a timestamp_ntz into a timestamp (in UTC, the session's zone).
        return exp.cast(truncated, exp.DataType.build("timestamp_ntz", dialect="spark"))
    return truncated


def _at_time_zone_type(call: Call) -> SqlType:
    if call.type(0) != TIMESTAMPTZ or not _utc_zone(call.node.args.get("zone")):
        raise Refused("AT TIME ZONE is supported as timestamptz AT TIME ZONE 'UTC' only")
    return TIMESTAMP


def _at_time_zone(call: Call) -> exp.Expr:
    # The UTC wall-clock time: Spark's session zone is UTC.
    return exp.cast(call.arg(0), exp.DataType.build("timestamp_ntz", dialect="spark"))


# extract(): PostgreSQL returns numeric. Per field: the Spark field, what to add to it,
# and whether it exists for a date. (dow counts from Sunday = 0, Spark's DOW from 1.)
_EXTRACT_FIELDS: dict[str, tuple[str, int, bool]] = {
    "YEAR": ("YEAR", 0, True),
    "ISOYEAR": ("YEAROFWEEK", 0, True),
    "QUARTER": ("QUARTER", 0, True),
    "MONTH": ("MONTH", 0, True),
    "WEEK": ("WEEK", 0, True),
    "DAY": ("DAY", 0, True),
    "DOY": ("DOY", 0, True),
    "DOW": ("DOW", -1, True),
    "ISODOW": ("DOW_ISO", 0, True),
    "HOUR": ("HOUR", 0, False),
    "MINUTE": ("MINUTE", 0, False),
    "SECOND": ("SECOND", 0, False),
    "MILLISECONDS": ("SECOND", 0, False),
    "MICROSECONDS": ("SECOND", 0, False),
    "EPOCH": ("EPOCH", 0, True),
}
_FIELD_SPELLINGS = {
    "MILLISECOND": "MILLISECONDS",
    "MICROSECOND": "MICROSECONDS",
    "SECONDS": "SECOND",
    "MINUTES": "MINUTE",
    "HOURS": "HOUR",
    "DAYS": "DAY",
    "MONTHS": "MONTH",
    "YEARS": "YEAR",
}


def _extract_field(call: Call) -> str:
    field = call.node.this
    name = field.name.upper() if isinstance(field, exp.Var | exp.Literal) else ""
    name = _FIELD_SPELLINGS.get(name, name)
    if name not in _EXTRACT_FIELDS:
        raise Refused(
            f"extract() field {name.lower()!r} is not supported; fields: "
            + ", ".join(f.lower() for f in _EXTRACT_FIELDS)
        )
    return name


def _extract_type(call: Call) -> SqlType:
    name = _extract_field(call)
    source = call.type(0)
    if source == TIMESTAMPTZ and name != "EPOCH":
        raise Refused(
            "extract() from a timestamptz depends on PostgreSQL's session time zone; "
            f"write extract({name.lower()} FROM ts AT TIME ZONE 'UTC')"
        )
    if source.name == "date" and not _EXTRACT_FIELDS[name][2]:
        raise Refused(f"extract() of {name.lower()} does not exist for a date in PostgreSQL")
    if not source.is_temporal:
        raise Refused(f"extract() takes a timestamp, date or timestamptz, not {source.pg()}")
    return NUMERIC


def _decimal(value: exp.Expr, spec: str) -> exp.Expr:
    return exp.cast(value, exp.DataType.build(spec, dialect="spark"))


def _extract(call: Call) -> exp.Expr:
    name = _extract_field(call)
    source, value = call.type(0), call.arg(0)
    spark_field, offset, _ = _EXTRACT_FIELDS[name]
    if name == "EPOCH":
        # Seconds since 1970-01-01 00:00 (UTC for a timestamptz, nominal for the others),
        # with PostgreSQL's six decimals: whole microseconds scaled exactly.
        if source.name == "date":
            days = _decimal(_f("unix_date", value), "decimal(20,0)")
            return exp.Mul(this=days, expression=_n(86400))
        moment = value if source == TIMESTAMPTZ else exp.cast(value, "timestamp")
        micros = _decimal(_f("unix_micros", moment), "decimal(20,0)")
        return exp.Mul(this=micros, expression=_decimal(_s("0.000001"), "decimal(7,6)"))
    part: exp.Expr = exp.Extract(this=exp.var(spark_field), expression=value)
    if name == "SECOND":
        return part  # decimal(8,6): seconds with microseconds, as PostgreSQL gives them
    if name == "MILLISECONDS":
        return exp.Mul(this=part, expression=_n(1000))
    if name == "MICROSECONDS":
        return _decimal(exp.Mul(this=part, expression=_n(1000000)), "decimal(10,0)")
    if offset:
        part = exp.Add(this=part, expression=_n(offset))
    return _decimal(part, "decimal(10,0)")


def _to_char_type(call: Call) -> SqlType:
    if len(call.args) != 2:
        raise Refused(
            "to_char() takes a value and a pattern: to_char(ts AT TIME ZONE 'UTC', 'YYYY')"
        )
    value = call.type(0)
    if value == TIMESTAMPTZ:
        raise Refused(
            "to_char() of a timestamptz depends on PostgreSQL's session time zone; write "
            "to_char(ts AT TIME ZONE 'UTC', pattern)"
        )
    if value not in (TIMESTAMP, DATE):
        raise Refused(f"to_char() takes a timestamp or a date here, not {value.pg()}")
    _to_char_pattern(call)
    return TEXT


def _to_char_pattern(call: Call) -> str:
    pattern = call.args[1]
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise Refused("to_char() takes a string literal as its pattern")
    try:
        to_char(exp.column("x"), pattern.this)
    except PatternRefused as refused:
        raise Refused(str(refused)) from None
    return str(pattern.this)


def _to_char(call: Call) -> exp.Expr:
    value = call.arg(0)
    return exp.If(
        this=exp.Is(this=value, expression=exp.Null()),
        true=exp.Null(),
        false=to_char(value.copy(), _to_char_pattern(call)),
    )


def _as_extract(call: Call) -> Call:
    """date_part('field', x) as the call extract(field FROM x)."""
    field = call.args[0] if call.args else None
    if len(call.args) != 2 or not (isinstance(field, exp.Literal) and field.is_string):
        raise Refused("date_part() takes a field name literal and a value: date_part('hour', x)")
    node = exp.Extract(this=exp.var(field.this.upper()), expression=call.args[1])
    return Call(node, call.args[1:], call.types[1:], call.spark[1:])


def _date_part_type(call: Call) -> SqlType:
    _extract_type(_as_extract(call))
    return DOUBLE


def _date_part(call: Call) -> exp.Expr:
    # PostgreSQL computes seconds as whole seconds + microseconds / 1e6 in double
    # precision (two roundings), the other fields exactly, rounded once to double.
    extract = _as_extract(call)
    name = _extract_field(extract)
    if name in ("SECOND", "MILLISECONDS"):
        seconds = exp.Extract(this=exp.var("SECOND"), expression=extract.arg(0))
        whole = _f("floor", seconds)
        fraction = exp.paren(exp.Sub(this=seconds.copy(), expression=whole))
        micros = exp.Mul(this=fraction, expression=_n(10**6))
        scale = 1 if name == "SECOND" else 1000
        return exp.Add(
            this=exp.Mul(this=_double(whole.copy()), expression=_double(_n(scale))),
            expression=exp.Div(this=_double(micros), expression=_double(_n(10**6 // scale))),
        )
    return _double(_extract(extract))


FUNCTIONS: dict[type[exp.Expr], Function] = {
    exp.Round: Function("round", ("this", "decimals"), _round_type, _round),
    exp.Floor: Function("floor", ("this",), _float_or_numeric, _floor_or_ceil(up=False)),
    exp.Ceil: Function("ceil", ("this",), _float_or_numeric, _floor_or_ceil(up=True)),
    exp.Sign: Function("sign", ("this",), _float_or_numeric, _sign),
    exp.Sqrt: Function("sqrt", ("this",), _double_only, _sqrt),
    exp.Pow: Function("power", ("this", "expression"), _double_only, _power),
    exp.Greatest: Function("greatest", ("this", "*expressions"), _common, _variadic),
    exp.Least: Function("least", ("this", "*expressions"), _common, _variadic),
    exp.Nullif: Function("nullif", ("this", "expression"), _nullif_type, _nullif),
    exp.Length: Function("length", ("this",), _text_result(0, result=INTEGER), _same_node),
    exp.Replace: Function(
        "replace", ("this", "expression", "replacement"), _text_result(0, 1, 2), _same_node
    ),
    exp.StrPosition: Function(
        "strpos",
        ("this", "substr", "position"),
        _text_result(0, 1, result=INTEGER),
        lambda c: _f("instr", c.arg(0), c.arg(1)),
    ),
    exp.Left: Function("left", ("this", "expression"), _text_result(0, ints=(1,)), _left),
    exp.Right: Function("right", ("this", "expression"), _text_result(0, ints=(1,)), _right),
    exp.Substring: Function("substring", ("this", "start", "length"), _substring_type, _substring),
    exp.SplitPart: Function(
        "split_part",
        ("this", "delimiter", "part_index"),
        _text_result(0, 1, ints=(2,)),
        lambda c: _f("split_part", c.arg(0), c.arg(1), c.arg(2)),
    ),
    exp.Trim: Function("trim", ("this", "expression"), _text_result(0, 1), _trim),
    exp.Concat: Function("concat", ("*expressions",), _concat_type, _concat),
    exp.Reverse: Function("reverse", ("this",), _text_result(0), _same_node),
    exp.Repeat: Function("repeat", ("this", "times"), _text_result(0, ints=(1,)), _same_node),
    exp.Pad: Function(
        "lpad", ("this", "expression", "fill_pattern"), _text_result(0, 2, ints=(1,)), _pad
    ),
    exp.StartsWith: Function(
        "starts_with",
        ("this", "expression"),
        _text_result(0, 1, result=BOOLEAN),
        lambda c: _f("startswith", c.arg(0), c.arg(1)),
    ),
    exp.Like: Function("LIKE", ("this", "expression"), _like_type, _like),
    exp.ILike: Function("ILIKE", ("this", "expression"), _like_type, _like),
    exp.RegexpLike: Function("~", ("this", "expression"), _matches_type, _matches),
    exp.RegexpReplace: Function(
        "regexp_replace",
        ("this", "expression", "replacement", "modifiers"),
        _replace_type,
        _replace,
    ),
    exp.Bracket: Function("regexp_match", (), _match_at_type, _match_at_spark, _match_at),
    exp.In: Function("IN", ("this", "*expressions"), _in_type, _in),
    exp.TimestampTrunc: Function("date_trunc", ("this",), _date_trunc_type, _date_trunc),
    exp.Extract: Function("extract", ("expression",), _extract_type, _extract),
    exp.AtTimeZone: Function("AT TIME ZONE", ("this",), _at_time_zone_type, _at_time_zone),
}


# Calls sqlglot parses as calls of an unknown name (rewriter.parse_stream keeps to_char and
# date_part so), by that name.
NAMED: dict[str, Function] = {
    "to_char": Function("to_char", ("*expressions",), _to_char_type, _to_char),
    "date_part": Function("date_part", ("*expressions",), _date_part_type, _date_part),
    "regexp_match": Function("regexp_match", ("*expressions",), _regexp_match_type, _same_node),
}


def function_for(node: exp.Expr) -> Function | None:
    """The table's entry for ``node``, None if the table has none."""
    if isinstance(node, exp.Anonymous):
        return NAMED.get(node.name.lower())
    return FUNCTIONS.get(type(node))


def arguments(node: exp.Expr, entry: Function) -> list[exp.Expr | None]:
    """The call's arguments in the entry's slot order (absent optional ones as None)."""
    if entry.unpack is not None:
        return entry.unpack(node)
    found: list[exp.Expr | None] = []
    for slot in entry.slots:
        if slot.startswith("*"):
            found.extend(node.args.get(slot[1:]) or [])
        else:
            found.append(node.args.get(slot))
    return found
