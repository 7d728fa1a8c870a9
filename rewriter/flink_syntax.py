"""Flink SQL's spellings of what Strata's SQL says otherwise, read as Strata's (the Nexmark
queries as their project writes them, and SQL copied from Flink's documentation):

* ``TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), INTERVAL ...))`` (and HOP, CUMULATE, SESSION: the
  windowing table-valued functions) is ``TUMBLE(s, t, INTERVAL ...)``; a session's
  ``PARTITION BY k`` (``TABLE s PARTITION BY k``) goes, since Strata forms sessions per
  GROUP BY keys: the statement must group by exactly ``k``, and by no key without it (a
  session over every row); ``read`` says where each was, for rewriter.parse_stream to
  check;
* ``INTERVAL '10' SECOND`` (the SQL standard's interval, which PostgreSQL also takes) is
  ``INTERVAL '10 SECOND'``;
* ``DATE_FORMAT(t, 'yyyy-MM-dd')`` (Java's pattern letters) is
  ``to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD')``, ``HOUR(t)`` is
  ``extract(hour FROM t AT TIME ZONE 'UTC')``, ``REGEXP_EXTRACT(s, p, n)`` is
  ``(regexp_match(s, p))[n]`` and ``SPLIT_INDEX(s, sep, i)`` is ``split_part(s, sep, i + 1)``
  where ``s`` has the piece, else NULL (desugar_functions, on the parsed tree);
* ``CREATE FUNCTION name AS 'class'`` (a Java class, which a Python server cannot load)
  is refused by name, with the SQL function to create instead (flink_function);
* a name in backticks, `` `dateTime` ``, is the name itself: a quoted identifier in lower
  case (``"datetime"``), as Strata's names are, so that it also names a reserved word
  (`` `value` ``).

``normalize`` keeps every character's offset (what it removes becomes blanks), so that
positions in errors are positions in the text as written. Nothing inside string literals
or comments changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from rewriter.errors import UnsupportedSQL

# What to create instead of a Java function (rewriter.inline_functions inlines it).
SQL_FUNCTION_FORM = (
    "CREATE FUNCTION name(arg type, ...) RETURNS type LANGUAGE sql IMMUTABLE "
    "RETURN <one expression of the arguments>"
)
# Flink's CREATE [TEMPORARY [SYSTEM]] FUNCTION [IF NOT EXISTS] name AS 'class' [LANGUAGE
# JAVA|SCALA|PYTHON]: no argument list, a class name where PostgreSQL wants a body (and so
# never valid PostgreSQL).
_FLINK_FUNCTION = re.compile(
    r"\s*CREATE\s+(?:TEMPORARY\s+(?:SYSTEM\s+)?)?FUNCTION\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"((?:\w+\.)*\w+)\s+AS\s+'",
    re.I,
)
WINDOW_FUNCTIONS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")
INTERVAL_UNITS = ("SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "string", "quoted", "backtick", "punct", "other"
    start: int
    end: int  # exclusive


def _tokens(text: str) -> list[_Token]:
    """Words, literals, quoted names and punctuation; blanks and comments left out."""
    found: list[_Token] = []
    k = 0
    while k < len(text):
        char = text[k]
        if char.isspace():
            k += 1
        elif text.startswith("--", k):
            end = text.find("\n", k)
            k = len(text) if end < 0 else end
        elif text.startswith("/*", k):
            end = text.find("*/", k + 2)
            k = len(text) if end < 0 else end + 2
        elif char in "'\"`":
            end = k + 1
            while end < len(text):
                if text[end] == char:
                    if text.startswith(char * 2, end):  # a doubled quote inside
                        end += 2
                        continue
                    break
                end += 1
            kind = {"'": "string", '"': "quoted", "`": "backtick"}[char]
            found.append(_Token(kind, k, min(end + 1, len(text))))
            k = end + 1
        elif (word := _WORD.match(text, k)) is not None:
            found.append(_Token("word", k, word.end()))
            k = word.end()
        else:
            found.append(_Token("punct" if char in "(),;." else "other", k, k + 1))
            k += 1
    return found


@dataclass(frozen=True)
class SessionPartition:
    """A Flink session window's ``PARTITION BY`` keys (none: one session over every row),
    and the offset of its SESSION."""

    keys: tuple[str, ...]
    offset: int


@dataclass(frozen=True)
class Normalized:
    text: str
    partitions: tuple[SessionPartition, ...] = ()


def normalize(sql: str) -> str:
    """``sql`` with Flink's spellings written as Strata's, every offset kept."""
    return read(sql).text


def read(sql: str) -> Normalized:
    """``normalize``, with the PARTITION BY keys of the session windows it removed."""
    if "`" not in sql and "DESCRIPTOR" not in sql.upper() and not _has_unit_interval(sql):
        return Normalized(sql)
    text = list(sql)
    tokens = _tokens(sql)
    partitions: list[SessionPartition] = []

    def blank(token: _Token) -> None:
        text[token.start : token.end] = " " * (token.end - token.start)

    def word(position: int, *words: str) -> bool:
        return (
            0 <= position < len(tokens)
            and tokens[position].kind == "word"
            and sql[tokens[position].start : tokens[position].end].upper() in words
        )

    def punct(position: int, char: str) -> bool:
        return (
            0 <= position < len(tokens)
            and sql[tokens[position].start] == char
            and (tokens[position].kind == "punct")
        )

    def closing(position: int) -> int | None:
        """The token closing the parenthesis opened at ``position``."""
        depth = 0
        for k in range(position, len(tokens)):
            if punct(k, "("):
                depth += 1
            elif punct(k, ")"):
                depth -= 1
                if depth == 0:
                    return k
        return None

    for k, token in enumerate(tokens):
        if token.kind == "backtick":
            inner = sql[token.start + 1 : token.end - 1].lower().replace('"', '""')
            if len(inner) + 2 == token.end - token.start:
                text[token.start : token.end] = f'"{inner}"'
        elif word(k, "TABLE") and punct(k + 1, "(") and word(k + 2, *WINDOW_FUNCTIONS):
            # TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), ...)) -> TUMBLE(s, t, ...)
            outer_close = closing(k + 1)
            inner_close = closing(k + 3) if punct(k + 3, "(") else None
            if outer_close is None or inner_close is None or outer_close != inner_close + 1:
                continue
            blank(tokens[k])
            blank(tokens[k + 1])
            blank(tokens[outer_close])
            if word(k + 4, "TABLE"):
                blank(tokens[k + 4])
            if word(k + 2, "SESSION") and word(k + 6, "PARTITION") and word(k + 7, "BY"):
                # SESSION(TABLE s PARTITION BY k1, k2, DESCRIPTOR(t), ...): the keys run
                # to the comma before DESCRIPTOR (or are one parenthesized list).
                last = next(
                    (d for d in range(k + 8, inner_close) if word(d, "DESCRIPTOR")), inner_close
                )
                keys = [
                    _name(sql, tokens[d])
                    for d in range(k + 8, last)
                    if tokens[d].kind in ("word", "quoted", "backtick")
                ]
                for d in range(k + 6, last - 1):  # up to the comma before DESCRIPTOR
                    blank(tokens[d])
                partitions.append(SessionPartition(tuple(keys), tokens[k + 2].start))
            elif word(k + 2, "SESSION"):  # no PARTITION BY: one session over every row
                partitions.append(SessionPartition((), tokens[k + 2].start))
            for d in range(k + 4, inner_close):
                if word(d, "DESCRIPTOR") and punct(d + 1, "("):
                    end = closing(d + 1)
                    if end is not None:
                        blank(tokens[d])
                        blank(tokens[d + 1])
                        blank(tokens[end])
        elif (
            word(k, "INTERVAL")
            and k + 2 < len(tokens)
            and tokens[k + 1].kind == "string"
            and _unit(sql, tokens[k + 2])
        ):
            # INTERVAL '10' SECOND -> INTERVAL '10 SECOND' (the same length)
            literal, unit = tokens[k + 1], tokens[k + 2]
            if k + 3 < len(tokens) and word(k + 3, "TO"):
                continue  # INTERVAL '1:30' HOUR TO MINUTE: left to the parser
            quantity = sql[literal.start + 1 : literal.end - 1]
            written = f"'{quantity} {sql[unit.start : unit.end]}'"
            span = unit.end - literal.start
            text[literal.start : unit.end] = written.ljust(span)
    return Normalized("".join(text), tuple(partitions))


def _name(sql: str, token: _Token) -> str:
    """The column a name token names (unquoted names in lower case, as PostgreSQL's)."""
    written = sql[token.start : token.end]
    if token.kind == "word":
        return written.lower()
    inner = written[1:-1]
    return inner.lower() if token.kind == "backtick" else inner.replace('""', '"')


def _unit(sql: str, token: _Token) -> bool:
    if token.kind != "word":
        return False
    name = sql[token.start : token.end].upper()
    return name in INTERVAL_UNITS or name.rstrip("S") in INTERVAL_UNITS


_UNIT_INTERVAL = re.compile(
    r"INTERVAL\s*'[^']*'\s*(?:" + "|".join(INTERVAL_UNITS) + r")", re.IGNORECASE
)


def _has_unit_interval(sql: str) -> bool:
    return _UNIT_INTERVAL.search(sql) is not None


# Java's date-time pattern letters (Flink's DATE_FORMAT, as Spark's date_format) in
# PostgreSQL's to_char, longest first.
_JAVA_PATTERN = (
    ("yyyy", "YYYY"),
    ("yy", "YY"),
    ("MM", "MM"),
    ("dd", "DD"),
    ("HH", "HH24"),
    ("hh", "HH12"),
    ("mm", "MI"),
    ("ss", "SS"),
    ("SSS", "MS"),
)


def to_char_pattern(java: str) -> str | None:
    """The to_char pattern of a Java date-time pattern; None for one with letters it does
    not know (or quoted text)."""
    out, k = [], 0
    while k < len(java):
        for letters, pg in _JAVA_PATTERN:
            if java.startswith(letters, k):
                out.append(pg)
                k += len(letters)
                break
        else:
            char = java[k]
            if char.isalpha() or char in "'\"":
                return None
            out.append(char)
            k += 1
    return "".join(out)


def _regexp_extract(node: exp.RegexpExtract) -> exp.Expr:
    """REGEXP_EXTRACT(s, pattern, n) as (regexp_match(s, pattern))[n] (n = 0: the whole
    match). Flink's meaning is Java's (the first alternative that matches); Strata plans
    regexp_match only for patterns whose alternatives choose alike in PostgreSQL and Java
    (rewriter/regex_choices.py), so where it is planned both meanings are one."""
    pattern, index = node.expression, node.args.get("position")
    n = 1 if index is None else _literal_int(index)
    if not (isinstance(pattern, exp.Literal) and pattern.is_string) or n is None or n < 0:
        raise UnsupportedSQL(
            f"{node.sql('postgres')!r}: REGEXP_EXTRACT takes a pattern literal and a group "
            "number literal, e.g. REGEXP_EXTRACT(s, '(a+)b', 1); or write "
            "(regexp_match(s, pattern))[n]"
        )
    text = pattern.this if n else f"({pattern.this})"
    match = exp.Anonymous(
        this="regexp_match", expressions=[node.this.copy(), exp.Literal.string(text)]
    )
    # sqlglot keeps PostgreSQL's 1-based subscript as a 0-based offset.
    return exp.Bracket(this=exp.Paren(this=match), expressions=[exp.Literal.number(max(n, 1) - 1)])


def _split_index(node: exp.Anonymous) -> exp.Expr:
    """SPLIT_INDEX(s, sep, i): the i-th (from 0) piece of s split at sep, NULL when there is
    no such piece (or s is empty, or i negative), as split_part(s, sep, i + 1) where s holds
    at least i separators, else NULL (split_part would give '')."""
    args = node.expressions
    sep = args[1] if len(args) == 3 else None
    index = _literal_int(args[2]) if len(args) == 3 else None
    if not (isinstance(sep, exp.Literal) and sep.is_string and sep.this) or index is None:
        raise UnsupportedSQL(
            f"{node.sql('postgres')!r}: SPLIT_INDEX takes a separator literal (not empty) and "
            "an index literal, e.g. SPLIT_INDEX(url, '/', 3); or write split_part(s, sep, i + 1)"
        )
    if index < 0:
        return exp.Null()
    text = args[0]
    separators = exp.Sub(
        this=exp.Length(this=text.copy()),
        expression=exp.Length(
            this=exp.Replace(
                this=text.copy(), expression=sep.copy(), replacement=exp.Literal.string("")
            )
        ),
    )
    present = exp.and_(
        exp.NEQ(this=text.copy(), expression=exp.Literal.string("")),
        exp.GTE(this=separators, expression=exp.Literal.number(index * len(sep.this))),
    )
    piece = exp.SplitPart(
        this=text.copy(), delimiter=sep.copy(), part_index=exp.Literal.number(index + 1)
    )
    return exp.Case(ifs=[exp.If(this=present, true=piece)])


def _literal_int(node: exp.Expr) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.lstrip("-").isdigit():
        return int(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        value = _literal_int(node.this)
        return None if value is None else -value
    return None


def desugar_functions(node: exp.Expr) -> exp.Expr:
    """Flink's functions with a PostgreSQL and Spark equivalent, as that equivalent (use as
    ``tree.transform(desugar_functions)``): DATE_FORMAT(t, 'yyyy-MM-dd') is
    to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD') (Flink's timestamps carry no zone; Strata's
    are formatted in UTC); HOUR(t) is extract(hour FROM t AT TIME ZONE 'UTC') (the same
    reason); REGEXP_EXTRACT and SPLIT_INDEX as above."""
    if isinstance(node, exp.RegexpExtract):  # sqlglot's node for REGEXP_EXTRACT(...)
        return _regexp_extract(node)
    if isinstance(node, exp.Hour):  # Flink's HOUR(t); PostgreSQL has no hour()
        zoned = exp.AtTimeZone(this=node.this.copy(), zone=exp.Literal.string("UTC"))
        return exp.Extract(this=exp.var("HOUR"), expression=zoned)
    if not isinstance(node, exp.Anonymous):
        return node
    if node.name.upper() == "SPLIT_INDEX":
        return _split_index(node)
    if node.name.upper() != "DATE_FORMAT":
        return node
    args = node.expressions
    if len(args) != 2 or not (isinstance(args[1], exp.Literal) and args[1].is_string):
        raise UnsupportedSQL(
            f"{node.sql('postgres')!r}: DATE_FORMAT takes a time and a pattern literal, e.g. "
            "DATE_FORMAT(t, 'yyyy-MM-dd'); or write to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
        )
    pattern = to_char_pattern(args[1].this)
    if pattern is None:
        raise UnsupportedSQL(
            f"{node.sql('postgres')!r}: DATE_FORMAT's pattern may use yyyy, yy, MM, dd, HH, "
            "hh, mm, ss and SSS; write to_char(t AT TIME ZONE 'UTC', '...') for others"
        )
    zoned = exp.AtTimeZone(this=args[0].copy(), zone=exp.Literal.string("UTC"))
    return exp.Anonymous(this="to_char", expressions=[zoned, exp.Literal.string(pattern)])


def flink_function(sql: str) -> UnsupportedSQL | None:
    """The refusal of Flink's ``CREATE FUNCTION name AS 'class'`` (a Java class, which a
    Python server cannot load), naming what to write instead; None for other text."""
    match = _FLINK_FUNCTION.match(sql)
    if match is None:
        return None
    return UnsupportedSQL(
        f"CREATE FUNCTION {match.group(1)} AS '...' loads a Java class (a Flink UDF), which "
        f"Strata cannot run: create a SQL function of the same meaning in PostgreSQL, "
        f"{SQL_FUNCTION_FORM}, and streams inline it (docs/sql/functions/user-functions.md)"
    )
