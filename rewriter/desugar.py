"""The window syntax of seeds/003 as sugar for the standard TUMBLE/HOP form.

The patent writes ``FROM impsns <SLICES '1 minute'>`` (tumbling windows),
``FROM impsns <VISIBLE '5 minutes' ADVANCE '1 minute'>`` (sliding windows) and selects
``cq_close(*)``, the end of the window, grouping by the other keys only. These become

    FROM TUMBLE(impsns, INTERVAL '1 minute')
    FROM HOP(impsns, INTERVAL '1 minute', INTERVAL '5 minutes')   -- slide, then size
    window_end   (AS cq_close when it has no alias; window_end joins the GROUP BY)

The calls leave out the time column: resolve_window takes the source's event-time column
(its catalog entry, which the parser cannot see). sqlglot cannot parse the angle brackets,
so ``cut_window_clauses`` blanks them out of the text before parsing, keeping every offset
and line break, and ``desugar`` puts them back as calls once the text is parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError
from sqlglot.tokens import Token, TokenType

from rewriter import naming
from rewriter.derived_select import positional_item
from rewriter.errors import InvalidSQL, UnsupportedSQL
from rewriter.positions import Place, position_of

SLICES_FORM = "FROM stream <SLICES '1 minute'>"
VISIBLE_FORM = "FROM stream <VISIBLE '5 minutes' ADVANCE '1 minute'>"
CQ_CLOSE = "cq_close"
_CLAUSE_WORDS = ("SLICES", "VISIBLE")
_NAME_TOKENS = (TokenType.VAR, TokenType.IDENTIFIER)
_LITERALS = (
    TokenType.STRING,
    TokenType.NUMBER,
    TokenType.HEREDOC_STRING,
    TokenType.BYTE_STRING,
    TokenType.NATIONAL_STRING,
)


@dataclass(frozen=True)
class IntervalText:
    """An interval literal of a window clause: its token and text as written ('1 minute')."""

    token: Token
    sql: str
    place: Place


@dataclass(frozen=True)
class WindowClause:
    """``<SLICES size>`` or ``<VISIBLE size ADVANCE slide>`` after the stream at ``source``."""

    source: int  # offset of the stream name the clause follows
    place: Place  # from '<' to '>'
    size: IntervalText
    slide: IntervalText | None  # None for SLICES: the window slides by its size

    @property
    def function(self) -> str:
        return "TUMBLE" if self.slide is None else "HOP"


def cut_window_clauses(sql: str, tokens: Sequence[Token]) -> tuple[str, tuple[WindowClause, ...]]:
    """``sql`` with every window clause blanked (same length, same lines), and the clauses."""
    clauses: list[WindowClause] = []
    text = sql
    index = 0
    while index < len(tokens):
        if not _opens_clause(tokens, index):
            index += 1
            continue
        clause, closing = _read_clause(sql, tokens, index)
        start, end = clause.place.start, clause.place.end
        text = text[:start] + _blank(text[start : end + 1]) + text[end + 1 :]
        clauses.append(clause)
        index = closing + 1
    return text, tuple(clauses)


def desugar(select: exp.Select, clauses: Sequence[WindowClause]) -> exp.Select:
    """A copy of ``select`` in the standard form: window calls in FROM, window_end."""
    select = select.copy()
    for clause in clauses:
        _replace_source(select, clause)
    closes = _replace_cq_close(select)
    if (clauses or closes) and not _groups_by_window(select):
        window_end = exp.column(naming.WINDOW_END_COLUMN)
        group = select.args.get("group")
        if group is None:
            select.set("group", exp.Group(expressions=[window_end]))
        else:
            group.append("expressions", window_end)
    return select


def _opens_clause(tokens: Sequence[Token], index: int) -> bool:
    """'<' SLICES/VISIBLE after ``FROM stream`` or before a literal; not ``x < slices``."""
    if not (
        tokens[index].token_type == TokenType.LT
        and index + 1 < len(tokens)
        and tokens[index + 1].token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
        and tokens[index + 1].text.upper() in _CLAUSE_WORDS
    ):
        return False
    literal = index + 2 < len(tokens) and tokens[index + 2].token_type in _LITERALS
    return literal or _follows_source(tokens, index)


def _follows_source(tokens: Sequence[Token], index: int) -> bool:
    return (
        index >= 2
        and tokens[index - 1].token_type in _NAME_TOKENS
        and tokens[index - 2].token_type == TokenType.FROM
    )


def _read_clause(sql: str, tokens: Sequence[Token], index: int) -> tuple[WindowClause, int]:
    """Read the clause opening at ``tokens[index]`` ('<'); returns it and the index of '>'."""
    opening, word = tokens[index], tokens[index + 1].text.upper()
    form = SLICES_FORM if word == "SLICES" else VISIBLE_FORM
    if not _follows_source(tokens, index):
        raise UnsupportedSQL(
            f"<{word} ...> follows the stream name right after FROM: {form}",
            position=Place.of_token(sql, opening).position,
        )

    def token(at: int) -> Token | None:
        return tokens[at] if at < len(tokens) else None

    def interval(at: int) -> IntervalText:
        found = token(at)
        if found is not None and found.token_type == TokenType.STRING:
            written = sql[found.start : found.end + 1]
            return IntervalText(found, written, Place.of_token(sql, found))
        where = found or opening
        if found is not None and found.token_type == TokenType.NUMBER:
            problem = f"row-based windows (<{word} n ROWS>) are not supported"
        else:
            problem = f"<{word} ...> takes a quoted interval"
        raise UnsupportedSQL(
            f"{problem}; windows are time intervals: {form}",
            position=Place.of_token(sql, where).position,
        )

    size = interval(index + 2)
    slide = None
    at = index + 3
    if word == "VISIBLE":
        advance = token(at)
        if advance is None or advance.text.upper() != "ADVANCE":
            raise UnsupportedSQL(
                "a <VISIBLE ...> window that slides with every row is not supported; say how "
                f"far it advances: {VISIBLE_FORM}",
                position=Place.of_token(sql, advance or opening).position,
            )
        slide = interval(at + 1)
        at += 2
    closing = token(at)
    if closing is None or closing.token_type != TokenType.GT:
        raise InvalidSQL(
            f"the window clause <{word} ...> is not closed by '>': {form}",
            position=Place.of_token(sql, closing or opening).position,
        )
    place = Place.of(sql, opening.start, closing.end)
    source = tokens[index - 1].start
    return WindowClause(source, place, size, slide), at


def _blank(text: str) -> str:
    return "".join(c if c in "\r\n" else " " for c in text)


def _replace_source(select: exp.Select, clause: WindowClause) -> None:
    table = next(
        (
            t
            for t in select.find_all(exp.Table)
            if isinstance(t.this, exp.Identifier) and t.this.meta_get("start") == clause.source
        ),
        None,
    )
    if table is None:
        raise UnsupportedSQL(
            f"a window clause follows a stream name in FROM: {SLICES_FORM} or {VISIBLE_FORM}",
            position=clause.place.position,
        )
    intervals = [clause.size] if clause.slide is None else [clause.slide, clause.size]
    call = exp.Anonymous(
        this=clause.function,
        expressions=[exp.Column(this=table.this.copy()), *map(_interval, intervals)],
    )
    table.set("this", clause.place.mark(call))


def _interval(text: IntervalText) -> exp.Interval:
    # Parsed as if the user had written INTERVAL before the literal, so the sugar and the
    # standard form give the same tree.
    keyword = Token(TokenType.INTERVAL, "INTERVAL")
    try:
        parsed = Postgres().parser().parse([keyword, text.token], text.sql)
    except ParseError:
        parsed = []
    interval = parsed[0] if len(parsed) == 1 else None
    if not isinstance(interval, exp.Interval):
        raise UnsupportedSQL(
            f"cannot read the interval {text.sql}; e.g. '1 minute'",
            position=text.place.position,
        )
    return text.place.mark(interval)


def _is_cq_close(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == CQ_CLOSE


def _window_end(call: exp.Anonymous) -> exp.Column:
    if call.expressions and not (
        len(call.expressions) == 1 and isinstance(call.expressions[0], exp.Star)
    ):
        raise UnsupportedSQL(
            f"{CQ_CLOSE}(*) takes no argument; it is the end of the window",
            position=position_of(call),
        )
    column = exp.column(naming.WINDOW_END_COLUMN)
    column.this.update_positions(call)
    return column.update_positions(call)


def _replace_cq_close(select: exp.Select) -> bool:
    """Replace cq_close(*) by window_end everywhere; True if there was one."""
    found = False
    # PostgreSQL names an unaliased call after its function: the output stays "cq_close".
    for item in select.expressions:
        if _is_cq_close(item):
            item.replace(exp.alias_(_window_end(item), CQ_CLOSE))
            found = True
    for call in list(select.find_all(exp.Anonymous)):
        if _is_cq_close(call):
            call.replace(_window_end(call))
            found = True
    return found


def _is_window_column(node: exp.Expr) -> bool:
    return (
        isinstance(node, exp.Column)
        and not node.table
        and node.name
        in (
            naming.WINDOW_START_COLUMN,
            naming.WINDOW_END_COLUMN,
        )
    )


def _groups_by_window(select: exp.Select) -> bool:
    group = select.args.get("group")
    for item in group.expressions if group else []:
        by_position = positional_item(select, item)
        key = item if by_position is None else by_position
        if _is_window_column(key):
            return True
    return False
