"""PostgreSQL's regular expressions and to_char() patterns, for the subset of each that
Spark can evaluate identically (invariant 4), translated; the rest refused by name.

Regular expressions: PostgreSQL's are POSIX "advanced" REs, Spark's are Java's. They agree
on literals, ``.``, bracket classes, ``^``, quantifiers, groups and ``\\d \\s \\w`` over
ASCII, once two defaults are aligned: PostgreSQL's ``.`` matches a newline and its ``$``
only the very end (Java: DOTALL off, ``$`` also before a final newline). Where PostgreSQL
reports *which* text matched (substring, regexp_match, regexp_replace), it takes the
longest match with alternation and follows other rules for lazy quantifiers, while Java
takes the first alternative: there, lazy quantifiers are refused, and alternation is
accepted only where rewriter.regex_choices proves both engines choose the same match
(both stay allowed in ``~``, which only asks whether anything matches); so is a
quantified group holding a capture group refused (PostgreSQL gives NULL for a group that
did not take part, Spark an empty string), and a capture group inside an alternative.

to_char(): the fields below, each evaluated by Spark as PostgreSQL writes it (English
names; Month and Day blank-padded to 9 characters unless FM), with non-letters and
"quoted text" kept as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from rewriter.regex_choices import Nondeterministic, capture_in_alternative, check_choices


class PatternRefused(Exception):
    """A pattern outside the subset; the message names what and says what to write."""


@dataclass(frozen=True)
class Regex:
    """A checked pattern: the Java pattern that means the same, and its capture groups."""

    java: str
    groups: int


_ESCAPES = set(".^$*+?()[]{}|\\/-")
_CLASSES = set("dDsSwW")
_QUANTIFIERS = set("*+?{")


def regex(pattern: str, *, extracting: bool) -> Regex:
    """Check ``pattern`` against the subset and translate it; ``extracting``: the caller
    reports which text matched (so alternation and lazy quantifiers are refused)."""
    out = ["(?s)"]  # PostgreSQL's . matches newlines
    groups = 0
    alternation = False
    stack: list[bool] = []  # per open group: whether it holds a capture group
    k = 0
    n = len(pattern)
    while k < n:
        c = pattern[k]
        if c == "\\":
            if k + 1 >= n:
                raise PatternRefused("a regular expression cannot end with a backslash")
            nxt = pattern[k + 1]
            if nxt.isdigit():
                raise PatternRefused(f"back references (\\{nxt}) are not supported")
            if nxt not in _ESCAPES and nxt not in _CLASSES:
                raise PatternRefused(
                    f"the escape \\{nxt} is not supported in a regular expression; supported: "
                    "\\d \\D \\s \\S \\w \\W and escaped punctuation"
                )
            out.append(pattern[k : k + 2])
            k += 2
            continue
        if c == "[":
            end = _bracket_end(pattern, k)
            out.append(pattern[k : end + 1])
            k = end + 1
            continue
        if c == "(":
            if pattern.startswith("(?:", k):
                stack.append(False)
                out.append("(?:")
                k += 3
                continue
            if pattern.startswith("(?", k):
                raise PatternRefused(
                    f"the group {pattern[k : k + 3]!r}... is not supported; groups: ( ) and (?: )"
                )
            groups += 1
            for level in range(len(stack)):
                stack[level] = True
            stack.append(True)
            out.append("(")
            k += 1
            continue
        if c == ")":
            if not stack:
                raise PatternRefused("unbalanced ) in the regular expression")
            captures = stack.pop()
            out.append(")")
            k += 1
            if extracting and captures and k < n and pattern[k] in _QUANTIFIERS:
                raise PatternRefused(
                    "a quantified group holding a capture group is not supported here "
                    "(PostgreSQL gives NULL for a group that did not match, Spark an empty "
                    "string); make the group's content optional instead"
                )
            continue
        if c == "|":
            alternation = True
        if c in "*+?}" and k + 1 < n and pattern[k + 1] in "+":
            raise PatternRefused(f"the quantifier {pattern[k : k + 2]!r} is not supported")
        if c in "*+?}" and k + 1 < n and pattern[k + 1] == "?" and extracting:
            raise PatternRefused(
                f"the lazy quantifier {pattern[k : k + 2]!r} is not supported where the "
                "matched text is returned (the engines choose the match differently)"
            )
        if c == "{":
            end = pattern.find("}", k)
            body = pattern[k + 1 : end] if end > 0 else ""
            if (
                not body
                or not all(part.isdigit() for part in body.split(",")[:1])
                or not all(part.isdigit() or part == "" for part in body.split(","))
            ):
                raise PatternRefused(f"the bound {pattern[k : end + 1]!r} is not supported")
            out.append(pattern[k : end + 1])
            k = end + 1
            continue
        if c == "$":
            out.append("\\z")  # the very end, as in PostgreSQL (Java's $ also before \n)
            k += 1
            continue
        out.append(c)
        k += 1
    if stack:
        raise PatternRefused("unbalanced ( in the regular expression")
    if extracting and alternation:
        _check_alternation(pattern)
    return Regex("".join(out), groups)


def _check_alternation(pattern: str) -> None:
    """Alternation where the matched text is returned: only where PostgreSQL's longest
    match and Java's first are provably the same (rewriter.regex_choices)."""
    try:
        check_choices(pattern)
    except Nondeterministic as why:
        raise PatternRefused(
            f"alternation (|) is supported where the matched text is returned only when "
            f"PostgreSQL (longest match) and Spark (first alternative) must agree, and {why}; "
            "make the alternatives start differently (e.g. (&|^)name=, [?&]name=), or use "
            "~ to test for a match"
        ) from None
    inside = capture_in_alternative(pattern)
    if inside is not None:
        raise PatternRefused(
            f"a capture group inside an alternative of {inside!r} is not supported (PostgreSQL "
            "gives NULL for a group whose alternative was not taken, Spark an empty "
            "string); put the alternation inside the group, e.g. (a|b)"
        )


def _bracket_end(pattern: str, start: int) -> int:
    """The index of the ] closing the bracket expression at ``start``."""
    k = start + 1
    if k < len(pattern) and pattern[k] == "^":
        k += 1
    if k < len(pattern) and pattern[k] == "]":
        raise PatternRefused("a bracket expression starting with ] is not supported; write \\]")
    while k < len(pattern):
        c = pattern[k]
        if c == "\\":
            if k + 1 < len(pattern) and (pattern[k + 1] in _ESCAPES or pattern[k + 1] in _CLASSES):
                k += 2
                continue
            raise PatternRefused("in a bracket expression a backslash escapes punctuation only")
        if c == "[":
            raise PatternRefused(
                "[ inside a bracket expression ([:alpha:], nested classes) is not supported; "
                "escape it as \\[ or list the characters"
            )
        if c == "&" and pattern.startswith("&&", k):
            raise PatternRefused("&& inside a bracket expression is not supported")
        if c == "]":
            return k
        k += 1
    raise PatternRefused("unbalanced [ in the regular expression")


def replacement(text: str) -> str:
    """PostgreSQL's regexp_replace replacement (\\1-\\9, \\& the whole match, \\\\ a
    backslash, everything else literal) as Java's ($1, $0, escaped $ and \\)."""
    out = []
    k = 0
    while k < len(text):
        c = text[k]
        if c == "\\" and k + 1 < len(text):
            nxt = text[k + 1]
            if nxt.isdigit():
                out.append("$" + nxt)
            elif nxt == "&":
                out.append("$0")
            elif nxt == "\\":
                out.append("\\\\")
            else:
                out.append("\\\\" + ("\\$" if nxt == "$" else nxt))
            k += 2
            continue
        out.append("\\\\" if c == "\\" else "\\$" if c == "$" else c)
        k += 1
    return "".join(out)


# ---- to_char ------------------------------------------------------------------------------

Piece = Callable[[exp.Expr], exp.Expr]


def _format(spark_pattern: str) -> Piece:
    return lambda value: exp.func("date_format", value, exp.Literal.string(spark_pattern))


def _padded(spark_pattern: str, case: str, pad: bool) -> Piece:
    def piece(value: exp.Expr) -> exp.Expr:
        text: exp.Expr = exp.func("date_format", value, exp.Literal.string(spark_pattern))
        if case == "upper":
            text = exp.Upper(this=text)
        elif case == "lower":
            text = exp.Lower(this=text)
        if pad:
            text = exp.func("rpad", text, exp.Literal.number(9), exp.Literal.string(" "))
        return text

    return piece


def _number(function: str, width: int) -> Piece:
    def piece(value: exp.Expr) -> exp.Expr:
        text = exp.cast(exp.func(function, value), "string")
        if width > 1:
            return exp.func("lpad", text, exp.Literal.number(width), exp.Literal.string("0"))
        return text

    return piece


def _fields() -> dict[str, Piece]:
    fields: dict[str, Piece] = {
        "YYYY": _format("yyyy"),
        "YY": _format("yy"),
        "MM": _format("MM"),
        "DD": _format("dd"),
        "HH24": _format("HH"),
        "HH12": _format("hh"),
        "HH": _format("hh"),
        "MI": _format("mm"),
        "SS": _format("ss"),
        "MS": _format("SSS"),
        "US": _format("SSSSSS"),
        "AM": _format("a"),
        "PM": _format("a"),
        "DDD": _number("dayofyear", 3),
        "D": _number("dayofweek", 1),
        "Q": _number("quarter", 1),
        "FMMM": _format("M"),
        "FMDD": _format("d"),
        "FMHH24": _format("H"),
        "FMHH12": _format("h"),
        "FMHH": _format("h"),
        "FMMI": _format("m"),
        "FMSS": _format("s"),
        "FMDDD": _number("dayofyear", 1),
        "Mon": _padded("MMM", "", pad=False),
        "MON": _padded("MMM", "upper", pad=False),
        "mon": _padded("MMM", "lower", pad=False),
        "Dy": _padded("EEE", "", pad=False),
        "DY": _padded("EEE", "upper", pad=False),
        "dy": _padded("EEE", "lower", pad=False),
    }
    for name, spark_name in (("Month", "MMMM"), ("Day", "EEEE")):
        for spelling, case in ((name, ""), (name.upper(), "upper"), (name.lower(), "lower")):
            fields[spelling] = _padded(spark_name, case, pad=True)
            fields["FM" + spelling] = _padded(spark_name, case, pad=False)
    for spelling in ("yyyy", "yy", "mm", "dd", "hh24", "hh12", "hh", "mi", "ss", "ms", "us"):
        fields[spelling] = fields[spelling.upper()]
    return fields


TO_CHAR_FIELDS = _fields()
_LONGEST_FIRST = sorted(TO_CHAR_FIELDS, key=len, reverse=True)


def to_char(value: exp.Expr, pattern: str) -> exp.Expr:
    """Spark's to_char(value, pattern) for a timestamp or date ``value``: the fields'
    texts and the literal text between them, concatenated."""
    parts: list[exp.Expr] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            parts.append(exp.Literal.string("".join(literal)))
            literal.clear()

    k = 0
    while k < len(pattern):
        c = pattern[k]
        if c == '"':
            end = pattern.find('"', k + 1)
            if end < 0:
                raise PatternRefused('unbalanced " in the to_char() pattern')
            literal.append(pattern[k + 1 : end])
            k = end + 1
            continue
        field = next((f for f in _LONGEST_FIRST if pattern.startswith(f, k)), None)
        if field is not None:
            flush()
            parts.append(TO_CHAR_FIELDS[field](value.copy()))
            k += len(field)
            continue
        if c.isalpha():
            word = c
            while k + len(word) < len(pattern) and pattern[k + len(word)].isalpha():
                word += pattern[k + len(word)]
            raise PatternRefused(
                f"the to_char() field {word!r} is not supported; fields: "
                + ", ".join(sorted({f for f in TO_CHAR_FIELDS if f.isupper() or f[0] == "F"}))
                + ' (put other text in double quotes, e.g. "T")'
            )
        literal.append(c)
        k += 1
    flush()
    if not parts:
        return exp.Literal.string("")
    return parts[0] if len(parts) == 1 else exp.func("concat", *parts)
