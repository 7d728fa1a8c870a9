"""Pass: calls of the user's SQL functions -> their bodies, as a macro's.

A function of LANGUAGE sql whose body is one expression of its arguments is inlined at
each call: its body with each argument, cast to the parameter's type as PostgreSQL
coerces a call's arguments, put where the body names it, the whole cast to the declared
result type as PostgreSQL casts a SQL function's result. Spark and the views then compute
the same expression, and everything in it goes through the passes after this one as if
the user had written it out. Bodies are those taken when the stream was created
(rewriter.sql_functions). Functions of another language, bodies of several statements or
reading FROM, volatile functions and bodies, set-returning functions and recursion are
refused, by name, with what to write instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from rewriter.errors import UnsupportedSQL
from rewriter.expressions import READING_TIMES
from rewriter.flink_syntax import SQL_FUNCTION_FORM
from rewriter.positions import position_of
from rewriter.sql_functions import SqlFunction, user_calls

_POSITION_KEYS = ("start", "end", "line", "col")
# Calls whose value depends on when (or how often) they are evaluated: a stream computes a
# row once in Spark, and reads it again later, so such a value is no function of the row.
_VOLATILE_NODES: dict[type[exp.Expr], str] = {
    exp.Rand: "random()",
    **READING_TIMES,
    exp.Localtime: "localtime",
    exp.Uuid: "gen_random_uuid()",
}
_VOLATILE_NAMES = (
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "timeofday",
    "nextval",
    "currval",
    "setval",
    "setseed",
)
_RETURN = re.compile(r"RETURN\b", re.I)
_CLAUSES = ("from_", "joins", "where", "group", "having", "order", "limit", "offset", "with_")


def inline_functions(
    select: exp.Select | exp.Union, functions: Mapping[str, SqlFunction]
) -> exp.Select | exp.Union:
    """``select`` (a copy) with every call of a function in ``functions`` inlined."""
    if not functions:
        return select
    inlined = _inline(select.copy(), functions, ())
    assert isinstance(inlined, exp.Select | exp.Union)  # a call is never the whole query
    return inlined


def _inline(
    tree: exp.Expr, functions: Mapping[str, SqlFunction], calling: tuple[str, ...]
) -> exp.Expr:
    def replace(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Anonymous) or isinstance(node.parent, exp.Table):
            return node
        function = functions.get(node.name.lower())
        if function is None:
            return node
        inlined = _expanded(node, function, functions, calling)
        if isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
            # The column keeps the name PostgreSQL gives a call: the function's.
            return exp.alias_(inlined, function.name, quoted=True)
        return inlined

    return tree.transform(replace, copy=False)


def _expanded(
    call: exp.Anonymous,
    function: SqlFunction,
    functions: Mapping[str, SqlFunction],
    calling: tuple[str, ...],
) -> exp.Expr:
    name = function.name
    at = position_of(call)
    if name in calling:
        between = calling[calling.index(name) + 1 :]
        through = f" through {', '.join(f'{n}()' for n in between)}" if between else ""
        raise UnsupportedSQL(
            f"{name}() calls itself{through}: Strata inlines a "
            "function's body at each call, which for a recursive function never ends; write "
            "the cases out (a CASE over them)",
            position=at,
        )
    body = _body(function, at)
    # The arguments' own calls belong to the caller; the body's to this function.
    arguments = [_inline(a, functions, calling) for a in call.expressions]
    if len(arguments) != len(function.arguments):
        raise UnsupportedSQL(
            f"{name}() takes {len(function.arguments)} argument"
            f"{'' if len(function.arguments) == 1 else 's'}, this call gives {len(arguments)}",
            position=at,
        )
    # Parenthesised as well as cast: a later pass drops a cast that changes nothing.
    given = {
        k: exp.Paren(this=exp.Cast(this=argument, to=exp.DataType.build(kind, dialect="postgres")))
        for k, (argument, (_, kind)) in enumerate(zip(arguments, function.arguments, strict=True))
    }
    names = {n: k for k, (n, _) in enumerate(function.arguments) if n}

    def substitute(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal):
            k = int(node.this.name) - 1
            if 0 <= k < len(given):
                return given[k].copy()
        if isinstance(node, exp.Column):
            qualifier = node.table.lower()
            if qualifier in ("", name) and not node.args.get("db") and node.name in names:
                return given[names[node.name]].copy()
            raise UnsupportedSQL(
                f"the body of {name}() names {node.sql('postgres')}, which is none of its "
                f"arguments: Strata inlines a body of one expression of the arguments",
                position=at,
            )
        return node

    for node in body.walk():  # errors in the body point at the call
        for key in _POSITION_KEYS:
            node.meta.pop(key, None)
        node.meta.update({k: call.meta[k] for k in _POSITION_KEYS if k in call.meta})
    body = _inline(body, functions, (*calling, name))
    inlined = exp.Cast(
        this=exp.Paren(this=body.transform(substitute, copy=False)),
        to=exp.DataType.build(function.result, dialect="postgres"),
    )
    inlined.meta.update({k: call.meta[k] for k in _POSITION_KEYS if k in call.meta})
    return inlined


def _body(function: SqlFunction, at: tuple[int, int] | None) -> exp.Expr:
    """The one expression of ``function``'s body, checked; refused by name otherwise."""
    name = function.name
    if function.language != "sql":
        raise UnsupportedSQL(
            f"{name}() is a {function.language} function: Strata inlines functions of "
            f"LANGUAGE sql whose body is one expression; write it as {SQL_FUNCTION_FORM}",
            position=at,
        )
    if function.returns_set:
        raise UnsupportedSQL(
            f"{name}() returns a set (RETURNS SETOF or TABLE): an expression of a stream is "
            f"one value per row; join a table instead, or write {SQL_FUNCTION_FORM}",
            position=at,
        )
    if function.volatility == "volatile":
        raise UnsupportedSQL(
            f"{name}() is VOLATILE (what CREATE FUNCTION declares unless told otherwise): "
            "its value may change from call to call, and a stream computes a row in Spark "
            "and reads it later in PostgreSQL; declare it IMMUTABLE if it only computes "
            "from its arguments",
            position=at,
        )
    kinds = [kind for _, kind in function.arguments if kind.startswith("any")]
    if kinds:
        raise UnsupportedSQL(
            f"{name}() takes an argument of the polymorphic type {kinds[0]}: Strata inlines "
            "functions of declared argument types; write one function per type",
            position=at,
        )
    statements = _statements(function, at)
    if len(statements) != 1:
        raise UnsupportedSQL(
            f"the body of {name}() is {len(statements)} statements: Strata inlines a body of "
            f"one expression; write {SQL_FUNCTION_FORM}",
            position=at,
        )
    body = statements[0]
    if isinstance(body, exp.Subquery) or (
        not isinstance(body, exp.Select) and body.find(exp.Select) is not None
    ):
        raise UnsupportedSQL(
            f"the body of {name}() holds a subquery: Strata inlines a body of one "
            "expression of the arguments; join a table in the stream instead",
            position=at,
        )
    if isinstance(body, exp.Select):
        clause = next((c for c in _CLAUSES if body.args.get(c)), None)
        if clause is not None or len(body.expressions) != 1 or body.args.get("distinct"):
            shown = (clause or "").rstrip("_").upper() or "several columns"
            raise UnsupportedSQL(
                f"the body of {name}() is a query ({shown}), not one expression: Strata "
                "inlines a body of one expression of the arguments; join a table in the "
                "stream instead",
                position=at,
            )
        body = body.expressions[0]
        body = body.this if isinstance(body, exp.Alias) else body
    elif not isinstance(body, exp.Expr) or isinstance(body, exp.Query | exp.DML | exp.DDL):
        raise UnsupportedSQL(
            f"the body of {name}() is no SELECT of one expression: Strata inlines a body of "
            f"one expression; write {SQL_FUNCTION_FORM}",
            position=at,
        )
    for node in body.walk():
        volatile = _VOLATILE_NODES.get(type(node))
        if isinstance(node, exp.Anonymous) and node.name.lower() in _VOLATILE_NAMES:
            volatile = f"{node.name.lower()}()"
        if volatile is not None:
            raise UnsupportedSQL(
                f"the body of {name}() calls {volatile}, whose value depends on when it is "
                "called: a stream computes a row in Spark and reads it later in PostgreSQL; "
                "pass the row's event time as an argument instead",
                position=at,
            )
    if body.find(exp.Select) is not None:
        raise UnsupportedSQL(
            f"the body of {name}() holds a subquery: Strata inlines a body of one "
            "expression of the arguments; join a table in the stream instead",
            position=at,
        )
    return body


def _statements(function: SqlFunction, at: tuple[int, int] | None) -> list[exp.Expr]:
    """The statements of the body (a RETURN is its expression), split at semicolons."""
    text = function.body.strip()
    if text[:12].upper() == "BEGIN ATOMIC" and text[-3:].upper() == "END":
        text = text[12:-3]
    try:
        tokens = sqlglot.tokenize(text, read="postgres")
    except TokenError:
        raise _unreadable(function, at) from None
    cuts = [-1, *(t.start for t in tokens if t.token_type == TokenType.SEMICOLON), len(text)]
    pieces = [text[a + 1 : b].strip() for a, b in zip(cuts, cuts[1:], strict=False)]
    found: list[exp.Expr] = []
    for piece in (p for p in pieces if p):
        returned = _RETURN.match(piece)
        try:
            found.append(
                sqlglot.parse_one(piece[returned.end() :] if returned else piece, read="postgres")
            )
        except (ParseError, TokenError):
            raise _unreadable(function, at) from None
    return found


def _unreadable(function: SqlFunction, at: tuple[int, int] | None) -> UnsupportedSQL:
    return UnsupportedSQL(
        f"the body of {function.name}() is SQL Strata cannot read: write {SQL_FUNCTION_FORM}",
        position=at,
    )


def called_functions(function: SqlFunction) -> list[str]:
    """The names of the calls in ``function``'s body that may be user functions (the
    server looks them up too); none when the body cannot be read (inlining refuses it)."""
    try:
        statements = _statements(function, None)
    except UnsupportedSQL:
        return []
    return [n for s in statements for n in user_calls(s)]
