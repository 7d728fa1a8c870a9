"""Which statements of a query string are Strata's.

Each statement of a query string (server/pgwire/lexer.py splits it) is recognised by its
first words:

    CREATE STREAM ...                   CreateStream
    DROP STREAM [IF EXISTS] name        DropStream
    ALTER STREAM name AS SELECT ...     AlterStream
    SHOW STREAMS                        ShowStreams
    EXPLAIN STREAM name                 ExplainStream
    COPY name [(cols)] FROM ...         CopyFrom  - Strata's if ``name`` is a stream
    INSERT INTO name ...                Insert    - Strata's if ``name`` is a stream
    DECLARE c CURSOR FOR SUBSCRIBE ...  DeclareSubscription
    FETCH [n | ALL] [FROM] c [WITH (timeout = '1s')]
                                        FetchSubscription - Strata's if ``c`` is one of
                                        the session's subscription cursors
    CLOSE c                             CloseSubscription - the same
    COPY (SUBSCRIBE name) TO STDOUT     CopySubscribe
    CREATE SINK ... / DROP SINK ...     SinkStatement (server/sinks/statement.py reads it)
    SHOW SINKS                          ShowSinks

Flink's ``CREATE FUNCTION name AS 'class'`` (a Java class; never valid PostgreSQL) is
refused, naming the SQL function to create instead (rewriter.flink_syntax).
SUBSCRIBE [TO] name [SINCE position] follows a stream's change feed (server/feed/).
None of the first five, nor the sinks' statements, nor DECLARE ... FOR SUBSCRIBE or COPY
(SUBSCRIBE ...), is valid PostgreSQL, so taking them never hides a statement from
PostgreSQL. A COPY or INSERT is Strata's only once the session has found its target among
the streams; until then it is a candidate, and a form Strata does not take (``COPY s FROM
'file'``, ``INSERT INTO s SELECT ...``) carries the refusal to raise if it is. Everything
else goes to PostgreSQL byte for byte, and so does a string the lexer cannot read (an
unterminated quote): PostgreSQL's own error is the right answer to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from rewriter.flink_syntax import flink_function
from server.pgwire.lexer import Piece, Token

# A query string none of these words appear in holds no Strata statement: most strings
# (every SELECT of a dashboard) are passed on after this one search.
_STRATA_WORDS = re.compile(
    r"\b(?:create|drop|alter|show|explain|copy|insert|declare|fetch|close)\b", re.I
)
_STRATA_WORDS_BYTES = re.compile(_STRATA_WORDS.pattern.encode(), re.I)


class Refused(Exception):  # noqa: N818 - carries a StrataError, it is not one
    """A Strata statement Strata refuses, and where in the query string (an offset) the
    problem is: ErrorResponse's position, where psql draws its caret."""

    def __init__(self, error: StrataError, at: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.at = at


@dataclass(frozen=True)
class Name:
    """A possibly schema-qualified name as written, and where it is in the query string."""

    schema: str | None
    name: str
    at: int


@dataclass(frozen=True)
class CreateStream:
    text: str  # the statement, from CREATE to its end, as the service takes it
    at: int


@dataclass(frozen=True)
class DropStream:
    name: Name
    if_exists: bool
    at: int


@dataclass(frozen=True)
class AlterStream:
    text: str
    at: int


@dataclass(frozen=True)
class ShowStreams:
    at: int


@dataclass(frozen=True)
class SinkStatement:
    text: str  # CREATE SINK or DROP SINK, from its first word to its end
    at: int


@dataclass(frozen=True)
class ShowSinks:
    at: int


@dataclass(frozen=True)
class ExplainStream:
    name: Name
    at: int


@dataclass(frozen=True)
class Option:
    """A COPY option: ``value`` is its text (a string constant's value, a word, a number),
    None for an option given without a value."""

    name: str
    value: str | None
    at: int


@dataclass(frozen=True)
class CopyFrom:
    target: Name
    columns: tuple[str, ...] | None
    options: tuple[Option, ...]
    at: int
    problem: Refused | None = None  # a form Strata does not take, raised if a stream


@dataclass(frozen=True)
class Value:
    """One value of an INSERT's VALUES: a constant (its text; None for NULL or DEFAULT)
    or a parameter ($n: ``parameter`` = n)."""

    text: str | None
    at: int
    parameter: int | None = None


@dataclass(frozen=True)
class Insert:
    target: Name
    columns: tuple[str, ...] | None
    rows: tuple[tuple[Value, ...], ...]
    at: int
    problem: Refused | None = None
    parameters: int = 0  # the highest $n


@dataclass(frozen=True)
class Subscribe:
    """Flink's ``CREATE FUNCTION name AS 'class'`` (a Java class; never valid PostgreSQL) is
    refused, naming the SQL function to create instead (rewriter.flink_syntax).
    SUBSCRIBE [TO] name [SINCE position]: the stream's changes after ``since``, or its
        current rows (as inserts) and every change after them."""

    name: Name
    since: int | None
    at: int


@dataclass(frozen=True)
class DeclareSubscription:
    cursor: str
    subscribe: Subscribe
    at: int


@dataclass(frozen=True)
class FetchSubscription:
    """FETCH of a subscription cursor: up to ``count`` changes (None: ALL there are), once
    there is one, waiting at most ``timeout`` seconds (None: until one comes)."""

    cursor: str
    count: int | None
    timeout: float | None
    at: int


@dataclass(frozen=True)
class CloseSubscription:
    cursor: str
    at: int


@dataclass(frozen=True)
class CopySubscribe:
    subscribe: Subscribe
    at: int


Subscription = DeclareSubscription | FetchSubscription | CloseSubscription | CopySubscribe
Statement = (
    CreateStream
    | DropStream
    | AlterStream
    | ShowStreams
    | ExplainStream
    | SinkStatement
    | ShowSinks
    | CopyFrom
    | Insert
    | DeclareSubscription
    | FetchSubscription
    | CloseSubscription
    | CopySubscribe
)


def changes_streams(statement: Statement) -> bool:
    """Does the statement change streams or load runs (only the owner's role may)?"""
    return not isinstance(statement, ShowStreams | ExplainStream | ShowSinks | Subscription)


def title(statement: Statement) -> str:
    """What a message calls the statement."""
    return {
        CreateStream: "CREATE STREAM",
        DropStream: "DROP STREAM",
        AlterStream: "ALTER STREAM",
        ShowStreams: "SHOW STREAMS",
        ExplainStream: "EXPLAIN STREAM",
        SinkStatement: "CREATE SINK or DROP SINK",
        ShowSinks: "SHOW SINKS",
        CopyFrom: "COPY into a stream",
        Insert: "INSERT into a stream",
        DeclareSubscription: "DECLARE ... CURSOR FOR SUBSCRIBE",
        FetchSubscription: "FETCH",
        CloseSubscription: "CLOSE",
        CopySubscribe: "COPY (SUBSCRIBE ...) TO STDOUT",
    }[type(statement)]


def may_hold_strata(text: str | bytes) -> bool:
    """False when ``text`` surely holds no Strata statement (the cheap test; a message's
    bytes will do, the words are ASCII)."""
    if isinstance(text, bytes):
        return _STRATA_WORDS_BYTES.search(text) is not None
    return _STRATA_WORDS.search(text) is not None


def classify(text: str, piece: Piece) -> Statement | None:
    """The Strata statement (or COPY/INSERT candidate) ``piece`` is, or None."""
    tokens = piece.tokens
    if not tokens or tokens[0].kind != "word":
        return None
    first = tokens[0]
    second = tokens[1] if len(tokens) > 1 else None
    at = first.start
    if second is None:
        return None
    if first.value == "create" and second.is_word("stream"):
        return CreateStream(text[first.start : tokens[-1].end], at)
    if first.value == "create" and (java := flink_function(text[at : tokens[-1].end])):
        raise Refused(java, at)  # never valid PostgreSQL: say what to create instead
    if first.value == "drop" and second.is_word("stream"):
        return _drop(tokens, at)
    if first.value == "alter" and second.is_word("stream"):
        return AlterStream(text[first.start : tokens[-1].end], at)
    if first.value == "show" and second.is_word("streams") and len(tokens) == 2:
        return ShowStreams(at)
    if first.value in ("create", "drop") and second.is_word("sink"):
        return SinkStatement(text[first.start : tokens[-1].end], at)
    if first.value == "show" and second.is_word("sinks") and len(tokens) == 2:
        return ShowSinks(at)
    if first.value == "explain" and second.is_word("stream"):
        name, rest = _name(tokens, 2, "EXPLAIN STREAM")
        _expect_end(rest, tokens, "EXPLAIN STREAM takes one stream name")
        return ExplainStream(name, at)
    if first.value == "copy" and second.is_op("(") and _word_at(tokens, 2, "subscribe"):
        return _copy_subscribe(tokens, at)
    if first.value == "copy":
        return _copy(tokens, at)
    if first.value == "declare":
        return _declare(tokens, at)
    if first.value == "fetch":
        return _fetch(tokens, at)
    if first.value == "close" and second.kind in ("word", "ident") and len(tokens) == 2:
        return CloseSubscription(second.value, at) if second.value != "all" else None
    if first.value == "insert" and second.is_word("into"):
        return _insert(tokens, at)
    return None


def _drop(tokens: list[Token], at: int) -> DropStream:
    index = 2
    if_exists = False
    if (
        index + 1 < len(tokens)
        and tokens[index].is_word("if")
        and tokens[index + 1].is_word("exists")
    ):
        if_exists = True
        index += 2
    name, index = _name(tokens, index, "DROP STREAM")
    if index < len(tokens) and tokens[index].is_word("cascade"):
        raise Refused(
            UnsupportedSQL(
                "DROP STREAM ... CASCADE is not supported: drop the streams derived from it first"
            ),
            tokens[index].start,
        )
    if index < len(tokens) and tokens[index].is_word("restrict"):
        index += 1
    if index < len(tokens) and tokens[index].is_op(","):
        raise Refused(UnsupportedSQL("DROP STREAM drops one stream at a time"), tokens[index].start)
    _expect_end(index, tokens, "DROP STREAM takes one stream name")
    return DropStream(name, if_exists, at)


def _name(tokens: list[Token], index: int, context: str) -> tuple[Name, int]:
    """A [schema.]name at ``index``; the name and the index after it."""
    if index >= len(tokens) or tokens[index].kind not in ("word", "ident"):
        where = tokens[index].start if index < len(tokens) else tokens[-1].end
        raise Refused(InvalidSQL(f"{context} needs a stream name here"), where)
    first = tokens[index]
    if (
        index + 2 < len(tokens)
        and tokens[index + 1].is_op(".")
        and tokens[index + 2].kind in ("word", "ident")
    ):
        return Name(first.value, tokens[index + 2].value, first.start), index + 3
    return Name(None, first.value, first.start), index + 1


def _expect_end(index: int, tokens: list[Token], message: str) -> None:
    if index < len(tokens):
        raise Refused(
            InvalidSQL(f"{message}; unexpected {tokens[index].value!r}"), tokens[index].start
        )


def _column_list(tokens: list[Token], index: int) -> tuple[tuple[str, ...] | None, int]:
    """An optional parenthesised list of column names at ``index``."""
    if index >= len(tokens) or not tokens[index].is_op("("):
        return None, index
    names: list[str] = []
    index += 1
    while index < len(tokens):
        token = tokens[index]
        if token.kind not in ("word", "ident"):
            raise Refused(InvalidSQL("a column name was expected here"), token.start)
        names.append(token.value)
        index += 1
        if index < len(tokens) and tokens[index].is_op(","):
            index += 1
            continue
        if index < len(tokens) and tokens[index].is_op(")"):
            return tuple(names), index + 1
        break
    where = tokens[index].start if index < len(tokens) else tokens[-1].end
    raise Refused(InvalidSQL("the column list is not closed with ')'"), where)


# ---------------------------------------------------------------------------- COPY


def _copy(tokens: list[Token], at: int) -> CopyFrom | None:
    if len(tokens) < 2 or tokens[1].kind not in ("word", "ident"):
        return None  # COPY (query) TO ...: PostgreSQL's
    try:
        target, index = _name(tokens, 1, "COPY")
        columns, index = _column_list(tokens, index)
    except Refused:
        return None
    if index >= len(tokens) or not tokens[index].is_word("from"):
        return None  # COPY ... TO: PostgreSQL's
    source = tokens[index + 1] if index + 1 < len(tokens) else None
    if source is None or not source.is_word("stdin"):
        problem = Refused(
            UnsupportedSQL(
                "COPY into a stream reads FROM STDIN only (from psql, \\copy sends a file or "
                "psql's input that way)"
            ),
            source.start if source is not None else tokens[index].start,
        )
        return CopyFrom(target, columns, (), at, problem)
    try:
        options = _copy_options(tokens, index + 2)
    except Refused as problem:
        return CopyFrom(target, columns, (), at, problem)
    return CopyFrom(target, columns, options, at)


# Old-style COPY options (before PostgreSQL 9.0) and how they map to the new names.
_OLD_FLAGS = {"binary": ("format", "binary"), "csv": ("format", "csv"), "header": ("header", None)}
_OLD_VALUED = {"delimiter", "null", "quote", "escape"}


def _copy_options(tokens: list[Token], index: int) -> tuple[Option, ...]:
    if index < len(tokens) and tokens[index].is_word("with"):
        index += 1
    if index < len(tokens) and tokens[index].is_op("("):
        return _new_style_options(tokens, index)
    options: list[Option] = []
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "word" and token.value in _OLD_FLAGS:
            name, value = _OLD_FLAGS[token.value]
            options.append(Option(name, value, token.start))
            index += 1
        elif token.kind == "word" and token.value in _OLD_VALUED:
            index += 1
            if index < len(tokens) and tokens[index].is_word("as"):
                index += 1
            if index >= len(tokens) or tokens[index].kind != "string":
                raise Refused(
                    InvalidSQL(f"{token.value.upper()} needs a quoted string"), token.start
                )
            options.append(Option(token.value, tokens[index].value, token.start))
            index += 1
        elif token.is_word("where"):
            raise Refused(UnsupportedSQL("COPY into a stream takes no WHERE clause"), token.start)
        else:
            raise Refused(
                UnsupportedSQL(
                    f"COPY option {token.value!r} is not supported for streams; supported: FORMAT "
                    "(text or csv), HEADER, DELIMITER, NULL, QUOTE, ESCAPE, ENCODING, RUN_ID"
                ),
                token.start,
            )
    return tuple(options)


def _new_style_options(tokens: list[Token], index: int) -> tuple[Option, ...]:
    options: list[Option] = []
    index += 1  # "("
    while index < len(tokens):
        token = tokens[index]
        if token.kind not in ("word", "ident"):
            raise Refused(InvalidSQL("a COPY option name was expected here"), token.start)
        index += 1
        value: str | None = None
        if index < len(tokens) and not (tokens[index].is_op(",") or tokens[index].is_op(")")):
            argument = tokens[index]
            if argument.kind in ("string", "word", "number", "ident"):
                value = argument.value
                index += 1
            elif argument.is_op("-") and index + 1 < len(tokens):
                value = "-" + tokens[index + 1].value
                index += 2
            else:
                raise Refused(
                    UnsupportedSQL(f"COPY option {token.value!r} takes a single value for streams"),
                    argument.start,
                )
        options.append(Option(token.value, value, token.start))
        if index < len(tokens) and tokens[index].is_op(","):
            index += 1
            continue
        if index < len(tokens) and tokens[index].is_op(")"):
            index += 1
            if index < len(tokens):
                raise Refused(
                    InvalidSQL(f"unexpected {tokens[index].value!r} after the COPY options"),
                    tokens[index].start,
                )
            return tuple(options)
        break
    where = tokens[index].start if index < len(tokens) else tokens[-1].end
    raise Refused(InvalidSQL("the COPY options are not closed with ')'"), where)


# ---------------------------------------------------------------------------- INSERT


def _insert(tokens: list[Token], at: int) -> Insert | None:
    try:
        target, index = _name(tokens, 2, "INSERT INTO")
    except Refused:
        return None
    if index < len(tokens) and tokens[index].is_word("as"):
        index += 2  # an alias means nothing to VALUES
    try:
        columns, index = _column_list(tokens, index)
    except Refused as refused:
        return Insert(target, None, (), at, refused)
    if index >= len(tokens) or not tokens[index].is_word("values"):
        where = tokens[index].start if index < len(tokens) else tokens[-1].end
        problem = Refused(
            UnsupportedSQL(
                "INSERT INTO a stream takes VALUES lists (for many rows, COPY ... FROM STDIN)"
            ),
            where,
        )
        return Insert(target, columns, (), at, problem)
    try:
        rows, index, parameters = _values(tokens, index + 1)
        if index < len(tokens):
            raise Refused(
                UnsupportedSQL(
                    f"INSERT INTO a stream takes no {tokens[index].value.upper()} clause "
                    "(no ON CONFLICT, RETURNING or ORDER BY)"
                ),
                tokens[index].start,
            )
    except Refused as problem:
        return Insert(target, columns, (), at, problem)
    return Insert(target, columns, rows, at, parameters=parameters)


def _values(tokens: list[Token], index: int) -> tuple[tuple[tuple[Value, ...], ...], int, int]:
    rows: list[tuple[Value, ...]] = []
    highest = 0
    while True:
        if index >= len(tokens) or not tokens[index].is_op("("):
            where = tokens[index].start if index < len(tokens) else tokens[-1].end
            raise Refused(InvalidSQL("a parenthesised list of values was expected here"), where)
        index += 1
        row: list[Value] = []
        while True:
            value, index = _value(tokens, index)
            if value.parameter is not None:
                highest = max(highest, value.parameter)
            row.append(value)
            if index < len(tokens) and tokens[index].is_op(","):
                index += 1
                continue
            if index < len(tokens) and tokens[index].is_op(")"):
                index += 1
                break
            where = tokens[index].start if index < len(tokens) else tokens[-1].end
            raise Refused(
                UnsupportedSQL(
                    "INSERT INTO a stream takes constants and $n parameters only, each value "
                    "followed by ',' or ')'"
                ),
                where,
            )
        rows.append(tuple(row))
        if index < len(tokens) and tokens[index].is_op(","):
            index += 1
            continue
        return tuple(rows), index, highest


def _value(tokens: list[Token], index: int) -> tuple[Value, int]:
    """One constant of a VALUES list: a number (signed), a string constant, NULL, DEFAULT,
    TRUE/FALSE, a typed constant (``timestamptz '...'``) or a parameter, optionally cast
    (``'...'::timestamptz``, ``CAST('...' AS numeric)``). The stream's column type decides
    how the text is read, as in COPY."""
    if index >= len(tokens):
        raise Refused(InvalidSQL("a value was expected"), tokens[-1].end)
    token = tokens[index]
    at = token.start
    value: Value
    if token.is_word("cast") and index + 1 < len(tokens) and tokens[index + 1].is_op("("):
        value, index = _value(tokens, index + 2)
        if index >= len(tokens) or not tokens[index].is_word("as"):
            raise Refused(UnsupportedSQL("CAST(value AS type) was expected"), at)
        index = _skip_type(tokens, index + 1, closing=")")
        if index >= len(tokens) or not tokens[index].is_op(")"):
            raise Refused(UnsupportedSQL("CAST(value AS type) was expected"), at)
        return Value(value.text, at, value.parameter), _skip_casts(tokens, index + 1)
    if token.kind == "number":
        value, index = Value(token.value, at), index + 1
    elif (
        (token.is_op("-") or token.is_op("+"))
        and index + 1 < len(tokens)
        and tokens[index + 1].kind == "number"
    ):
        sign = "-" if token.value == "-" else ""
        value, index = Value(sign + tokens[index + 1].value, at), index + 2
    elif token.kind == "string":
        value, index = Value(token.value, at), index + 1
    elif token.kind == "param":
        value, index = Value(None, at, int(token.value)), index + 1
    elif token.is_word("null", "default"):
        value, index = Value(None, at), index + 1
    elif token.is_word("true", "false"):
        value, index = Value(token.value, at), index + 1
    elif token.kind == "word":
        # A typed constant: type words (and a parenthesised modifier), then a string.
        end = _skip_type(tokens, index, closing=None)
        if end < len(tokens) and tokens[end].kind == "string" and end > index:
            value, index = Value(tokens[end].value, at), end + 1
        else:
            raise _not_a_constant(token)
    else:
        raise _not_a_constant(token)
    return value, _skip_casts(tokens, index)


def _not_a_constant(token: Token) -> Refused:
    return Refused(
        UnsupportedSQL(
            "INSERT INTO a stream takes constants and $n parameters only, not expressions "
            f"(found {token.value!r})"
        ),
        token.start,
    )


def _skip_casts(tokens: list[Token], index: int) -> int:
    while index < len(tokens) and tokens[index].is_op("::"):
        index = _skip_type(tokens, index + 1, closing=None)
    return index


def _skip_type(tokens: list[Token], index: int, *, closing: str | None) -> int:
    """Skip a type name (words, a parenthesised modifier, []) at ``index``."""
    start = index
    while index < len(tokens):
        token = tokens[index]
        if token.kind in ("word", "ident") and not token.is_word("as"):
            index += 1
        elif token.is_op("(") and index > start:
            depth = 0
            while index < len(tokens):
                if tokens[index].is_op("("):
                    depth += 1
                elif tokens[index].is_op(")"):
                    depth -= 1
                    if depth == 0:
                        break
                index += 1
            index += 1
        elif token.is_op("[") and index + 1 < len(tokens) and tokens[index + 1].is_op("]"):
            index += 2
        else:
            break
    if index == start:
        where = tokens[index].start if index < len(tokens) else tokens[-1].end
        raise Refused(UnsupportedSQL("a type name was expected here"), where)
    return index


# ---------------------------------------------------------------------- SUBSCRIBE


def _word_at(tokens: list[Token], index: int, *words: str) -> bool:
    return index < len(tokens) and tokens[index].is_word(*words)


def _subscribe(tokens: list[Token], index: int, end: int) -> Subscribe:
    """Flink's ``CREATE FUNCTION name AS 'class'`` (a Java class; never valid PostgreSQL) is
    refused, naming the SQL function to create instead (rewriter.flink_syntax).
    SUBSCRIBE [TO] name [SINCE position] in ``tokens[index:end]``."""
    at = tokens[index].start
    index += 1
    if _word_at(tokens, index, "to"):
        index += 1
    name, index = _name(tokens[:end], index, "SUBSCRIBE")
    since = None
    if index < end and tokens[index].is_word("since"):
        if index + 1 >= end or tokens[index + 1].kind != "number":
            where = tokens[index + 1].start if index + 1 < end else tokens[index].end
            raise Refused(InvalidSQL("SINCE takes a position (a whole number)"), where)
        number = tokens[index + 1]
        if not number.value.isdigit():
            raise Refused(InvalidSQL("SINCE takes a position (a whole number)"), number.start)
        since = int(number.value)
        index += 2
    if index < end:
        raise Refused(
            InvalidSQL(
                f"SUBSCRIBE takes [TO] a stream name and [SINCE position]; "
                f"unexpected {tokens[index].value!r}"
            ),
            tokens[index].start,
        )
    return Subscribe(name, since, at)


def _copy_subscribe(tokens: list[Token], at: int) -> CopySubscribe:
    """COPY (SUBSCRIBE ...) TO STDOUT."""
    close = next((i for i in range(2, len(tokens)) if tokens[i].is_op(")")), None)
    if close is None:
        raise Refused(InvalidSQL("COPY (SUBSCRIBE ...) is not closed with ')'"), tokens[-1].end)
    subscribe = _subscribe(tokens, 2, close)
    rest = tokens[close + 1 :]
    if len(rest) < 2 or not rest[0].is_word("to") or not rest[1].is_word("stdout"):
        where = rest[0].start if rest else tokens[close].end
        raise Refused(
            UnsupportedSQL("COPY (SUBSCRIBE ...) writes TO STDOUT only, in text format"), where
        )
    _expect_end(close + 3, tokens, "COPY (SUBSCRIBE ...) TO STDOUT takes no options")
    return CopySubscribe(subscribe, at)


def _declare(tokens: list[Token], at: int) -> DeclareSubscription | None:
    """DECLARE name [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR SUBSCRIBE ...; None for a
    cursor over anything else (PostgreSQL's)."""
    if len(tokens) < 5 or tokens[1].kind not in ("word", "ident"):
        return None
    found = next((i for i in range(2, len(tokens) - 1) if tokens[i].is_word("for")), None)
    if found is None or not tokens[found + 1].is_word("subscribe"):
        return None
    return DeclareSubscription(tokens[1].value, _subscribe(tokens, found + 1, len(tokens)), at)


_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d*)?)\s*(ms|msec|milliseconds?|s|sec|secs|seconds?|min|mins|minutes?)?\s*$",
    re.I,
)


def seconds_of(text: str) -> float | None:
    """'500ms', '1s', '2 seconds', '1 minute' or a bare number of seconds; None if not."""
    matched = _DURATION.match(text)
    if matched is None:
        return None
    value = float(matched.group(1))
    unit = (matched.group(2) or "s").lower()
    if unit.startswith("m") and unit not in ("min", "mins", "minute", "minutes"):
        return value / 1000
    if unit.startswith("min"):
        return value * 60
    return value


def _fetch(tokens: list[Token], at: int) -> FetchSubscription | None:
    """FETCH [FORWARD] [n | ALL | NEXT] [FROM | IN] cursor [WITH (timeout = ...)]; None
    for a form only PostgreSQL's cursors take (PostgreSQL answers it)."""
    index = 1
    if _word_at(tokens, index, "forward"):
        index += 1
    count: int | None = 1
    if index < len(tokens) and tokens[index].kind == "number":
        if not tokens[index].value.isdigit():
            return None
        count = int(tokens[index].value)
        index += 1
    elif _word_at(tokens, index, "all"):
        count = None
        index += 1
    elif _word_at(tokens, index, "next"):
        index += 1
    if _word_at(tokens, index, "from", "in"):
        index += 1
    if index >= len(tokens) or tokens[index].kind not in ("word", "ident"):
        return None
    cursor = tokens[index].value
    index += 1
    timeout = None
    if index < len(tokens):
        if not (
            _word_at(tokens, index, "with")
            and index + 5 < len(tokens)
            and tokens[index + 1].is_op("(")
            and tokens[index + 2].is_word("timeout")
            and tokens[index + 3].is_op("=")
            and tokens[index + 5].is_op(")")
        ):
            return None
        given = tokens[index + 4]
        timeout = seconds_of(given.value) if given.kind in ("string", "number") else None
        if timeout is None:
            raise Refused(
                InvalidSQL("timeout takes a duration such as '1s', '500ms' or '2 minutes'"),
                given.start,
            )
        _expect_end(index + 6, tokens, "FETCH ... WITH (timeout = ...) ends there")
    return FetchSubscription(cursor, count, timeout, at)
