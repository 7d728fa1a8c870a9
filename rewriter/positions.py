"""Where a construct is in the user's CREATE STREAM text, so errors can point at it.

parse_stream records positions in the ``meta`` of the nodes it returns: ``start`` and
``end`` are offsets into the user's text, ``line`` and ``col`` where the node starts
(counted from 1; sqlglot itself records where a token ends). Nodes that later passes
build carry no position, but their children copied from the statement do, so
``position_of`` answers for any node that has a positioned part.

A pass attaches positions in one of two ways:

    raise UnsupportedSQL("joins are not supported", position=position_of(join))

    with located(item):  # errors raised inside, without a position, get item's
        check(item)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from rewriter.errors import StrataError

E = TypeVar("E", bound=exp.Expr)

# Clause nodes start at their keyword, which sqlglot does not record (nor the name of
# a WITH option).
_CLAUSE_KEYWORDS: dict[type[exp.Expr], tuple[TokenType, ...]] = {
    exp.Select: (TokenType.SELECT,),
    exp.From: (TokenType.FROM,),
    exp.Where: (TokenType.WHERE,),
    exp.Group: (TokenType.GROUP_BY,),
    exp.Having: (TokenType.HAVING,),
    exp.Order: (TokenType.ORDER_BY,),
    exp.Limit: (TokenType.LIMIT, TokenType.FETCH),
    exp.Offset: (TokenType.OFFSET,),
    exp.Qualify: (TokenType.QUALIFY,),
    exp.With: (TokenType.WITH,),
    exp.Distinct: (TokenType.DISTINCT,),
    exp.Join: (TokenType.JOIN, TokenType.COMMA),
    # A set operation's keyword stands before its right operand, not before all of it.
    exp.Union: (TokenType.UNION,),
    exp.Except: (TokenType.EXCEPT,),
    exp.Intersect: (TokenType.INTERSECT,),
}


@dataclass(frozen=True)
class Place:
    """A span of the user's text: offsets ``start``..``end`` (inclusive), starting at
    ``line``, ``column`` (from 1)."""

    start: int
    end: int
    line: int
    column: int

    @classmethod
    def of(cls, sql: str, start: int, end: int) -> Place:
        line, column = line_and_column(sql, start)
        return cls(start, end, line, column)

    @classmethod
    def of_token(cls, sql: str, token: Token) -> Place:
        return cls.of(sql, token.start, token.end)

    @property
    def position(self) -> tuple[int, int]:
        return (self.line, self.column)

    def mark(self, node: E) -> E:
        """Record this place as ``node``'s position; returns ``node``."""
        return node.update_positions(
            line=self.line, col=self.column, start=self.start, end=self.end
        )


def line_and_column(sql: str, offset: int) -> tuple[int, int]:
    """(line, column) of ``sql[offset]``, both from 1."""
    line_start = sql.rfind("\n", 0, offset) + 1
    return (sql.count("\n", 0, offset) + 1, offset - line_start + 1)


def position_of(node: exp.Expr | None) -> tuple[int, int] | None:
    """Where ``node`` is in the statement, (line, column) from 1; None if unknown.

    That is its own recorded position (a function's name, a clause's keyword), else where
    its earliest positioned part starts.
    """
    if node is None:
        return None
    first = node if node.meta_get("start") is not None else _first_positioned(node)
    if first is None:
        return None
    return (first.meta_get("line"), first.meta_get("col"))


@contextmanager
def located(node: exp.Expr | None) -> Iterator[None]:
    """Give errors raised inside, that do not say where they are, the position of ``node``."""
    try:
        yield
    except StrataError as error:
        position = position_of(node)
        if position is not None:
            error.locate(position)
        raise


def record_positions(tree: exp.Expr, sql: str, tokens: Sequence[Token]) -> None:
    """Make ``tree``'s positions start positions in ``sql`` (in place; for parse_stream).

    ``tree`` was parsed from a text of the same length and line breaks as ``sql``, so token
    offsets are offsets into ``sql``; ``tokens`` are those of ``sql``.
    """
    for node in tree.walk():
        start = node.meta_get("start")
        if start is not None:
            end = node.meta_get("end", start)
            Place.of(sql, start, end).mark(node)
            written = sql[start : end + 1]
            if isinstance(node, exp.Func | exp.Mod) and written.replace("_", "").isalnum():
                # The name as written (ceiling, not sqlglot's ceil): the view's column name.
                node.meta["written"] = written
    for node in tree.walk():
        if node.meta_get("start") is None and _starts_with_keyword(node):
            operand = node.expression if isinstance(node, exp.SetOperation) else node
            first = _first_positioned(operand) if operand is not None else None
            limit = first.meta_get("start") if first is not None else len(sql)
            keyword = next(
                (t for t in reversed(tokens) if t.start < limit and _is_keyword_of(t, node)), None
            )
            if keyword is not None:
                Place.of_token(sql, keyword).mark(node)


def _starts_with_keyword(node: exp.Expr) -> bool:
    return type(node) in _CLAUSE_KEYWORDS or type(node) is exp.Property


def _is_keyword_of(token: Token, node: exp.Expr) -> bool:
    if type(node) is exp.Property:  # WITH (name = value): the name
        return token.text.lower() == node.name.lower()
    return token.token_type in _CLAUSE_KEYWORDS[type(node)]


def _first_positioned(node: exp.Expr) -> exp.Expr | None:
    best: exp.Expr | None = None
    for candidate in node.walk():
        start = candidate.meta_get("start")
        if start is not None and (best is None or start < best.meta_get("start")):
            best = candidate
    return best
