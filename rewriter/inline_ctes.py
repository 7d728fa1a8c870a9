"""Pass 1b: WITH's common table expressions, each inlined where it is read as the subquery it
names (``WITH hot AS (SELECT ...) SELECT ... FROM hot JOIN ...`` is ``SELECT ... FROM (SELECT
...) AS hot JOIN ...``), so that the passes that plan subqueries in FROM and subqueries as
join inputs plan it.

A query over a common table expression equals that query over the expression's body written
in its place: PostgreSQL computes a non-recursive, read-only WITH query once and reads it
where named, which gives the same rows as inlining (the MATERIALIZED hint changes only the
plan). Scopes follow SQL's: a name binds to the nearest WITH that defines it, and a common
table expression sees those defined before it in its list. What inlining cannot express is
refused by name: WITH RECURSIVE, a data-modifying WITH, an expression named as a window
call's stream, and a column list longer than its query's columns.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter.errors import UnsupportedSQL
from rewriter.positions import position_of

_WINDOW_CALLS = ("TUMBLE", "HOP", "SESSION", "CUMULATE")


def inline_ctes(query: exp.Expr) -> exp.Expr:
    """``query`` with every common table expression inlined where it is read (the same
    tree when it has none)."""
    if next(query.find_all(exp.With), None) is None:
        return query
    query = query.copy()
    # The deepest WITH first: a nested WITH binds its names before an enclosing one sees
    # the references left in its query (breadth-first order, reversed).
    for with_ in reversed(list(query.find_all(exp.With))):
        owner = with_.parent
        assert owner is not None
        defined = _definitions(with_)
        owner.set("with_", None)
        _substitute(owner, defined)
    return query


def _definitions(with_: exp.With) -> dict[str, exp.Query]:
    """Each common table expression's body by its name, the names before it inlined."""
    if with_.args.get("recursive"):
        raise UnsupportedSQL(
            "WITH RECURSIVE is not supported in a stream: a stream's query is computed over "
            "each run's rows, never iterated; write the iterations out, or compute the "
            "closure where you read the stream",
            position=position_of(with_),
        )
    defined: dict[str, exp.Query] = {}
    for cte in with_.expressions:
        name = cte.alias_or_name
        body = cte.this
        if not isinstance(body, exp.Select | exp.Union):
            raise UnsupportedSQL(
                f"the common table expression {name!r} is a "
                f"{type(body).__name__.upper()}: a stream's WITH queries only read "
                "(SELECT); write rows with INSERT, UPDATE or DELETE outside the stream",
                position=position_of(cte),
            )
        holder = exp.Subquery(this=body.copy())
        _substitute(holder, defined)
        defined[name] = _renamed(name, holder.this, cte.args["alias"].columns, cte)
    return defined


def _substitute(tree: exp.Expr, defined: dict[str, exp.Query]) -> None:
    """Replace, in place, every plain relation of ``tree`` named in ``defined`` with its
    body in parentheses, under the alias the FROM item gives it (else its name)."""
    if not defined:
        return
    for table in list(tree.find_all(exp.Table)):
        call = table.this
        if isinstance(call, exp.Anonymous) and call.name.upper() in _WINDOW_CALLS:
            _refuse_window_input(call, defined)
            continue
        if not isinstance(call, exp.Identifier) or table.args.get("db"):
            continue
        body = defined.get(call.name)
        if body is None:
            continue
        alias = table.args.get("alias")
        table.replace(
            exp.Subquery(
                this=body.copy(),
                alias=alias.copy() if alias is not None else exp.TableAlias(this=call.copy()),
            )
        )


def _refuse_window_input(call: exp.Anonymous, defined: dict[str, exp.Query]) -> None:
    source = call.expressions[0] if call.expressions else None
    if isinstance(source, exp.Column) and not source.table and source.name in defined:
        raise UnsupportedSQL(
            f"the common table expression {source.name!r} is read as the stream of "
            f"{call.name.upper()}(...): a window call reads a stream; create it as one "
            f"(CREATE STREAM {source.name} AS ...) and read FROM {call.name.upper()}"
            f"({source.name}, ...)",
            position=position_of(source),
        )


def _renamed(name: str, body: exp.Query, columns: list[exp.Identifier], cte: exp.CTE) -> exp.Query:
    """``body`` with its first columns named by the expression's column list, as PostgreSQL
    names them (``WITH t (a, b) AS (SELECT x, y ...)``)."""
    if not columns:
        return body
    first = body
    while isinstance(first, exp.Union):
        first = first.this
    assert isinstance(first, exp.Select)
    if any(isinstance(e, exp.Star) or e.is_star for e in first.expressions):
        raise UnsupportedSQL(
            f"the common table expression {name!r} names its columns over SELECT *: name "
            "them in its SELECT instead (SELECT a AS x, ...)",
            position=position_of(cte),
        )
    if len(columns) > len(first.expressions):
        raise UnsupportedSQL(
            f"the common table expression {name!r} has {len(first.expressions)} columns "
            f"available but {len(columns)} columns specified",
            position=position_of(cte),
        )
    for item, column in zip(list(first.expressions), columns, strict=False):
        value = item.this if isinstance(item, exp.Alias) else item
        item.replace(exp.alias_(value.copy(), column.copy()))
    return body
