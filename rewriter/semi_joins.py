"""Pass 1c: ``expr IN (SELECT c FROM ...)``, a condition of WHERE (alone or ANDed with
others), as the semi-join it is: the query joined with the subquery's distinct values
(``JOIN (SELECT c AS strata_in_value FROM ... GROUP BY c) strata_in_1 ON expr =
strata_in_1.strata_in_value``), which the pass planning subqueries as join inputs plans.

A row passes ``expr IN (subquery)`` in WHERE when some value of the subquery equals
``expr`` (a NULL on either side matches nothing, and a WHERE drops the unknown): the join
with each value once keeps exactly those rows, each once. ``NOT IN`` (true only when no value
is NULL), an IN under OR or NOT, a correlated subquery, and a query reading a window call
keep their refusals: the pass leaves them as written.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.flink_syntax import WINDOW_FUNCTIONS


def semi_joins(select: exp.Expr) -> exp.Expr:
    """``select`` with each IN subquery of its WHERE's conjuncts joined instead (the same
    tree when there is none it can join)."""
    if not isinstance(select, exp.Select) or select.args.get("where") is None:
        return select
    if not any(_is_semi(c, select) for c in _conjuncts(select)) or not _plain_inputs(select):
        return select
    joined = select.copy()
    kept: list[exp.Expr] = []
    semis: list[exp.In] = []
    for condition in _conjuncts(joined):
        if isinstance(condition, exp.In) and _is_semi(condition, joined):
            semis.append(condition)
        else:
            kept.append(condition)
    _qualify_star(joined)
    for position, condition in enumerate(semis, start=1):
        alias = naming.semi_join_alias(position)
        values = _distinct_values(condition.args["query"].this)
        joined = joined.join(
            exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias))),
            on=exp.EQ(
                this=condition.this.copy(),
                expression=exp.column(naming.SEMI_JOIN_VALUE, table=alias),
            ),
            copy=False,
        )
    joined.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return joined


def _conjuncts(select: exp.Select) -> list[exp.Expr]:
    condition = select.args["where"].this
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


def _is_semi(condition: exp.Expr, select: exp.Select) -> bool:
    """``expr IN (SELECT one value FROM ...)``, the subquery not reading the query's own
    inputs by their names (a correlated subquery is not a set of values)."""
    if not isinstance(condition, exp.In) or condition.args.get("expressions"):
        return False
    query = condition.args.get("query")
    inner = query.this if isinstance(query, exp.Subquery) else None
    if not isinstance(inner, exp.Select) or len(inner.expressions) != 1:
        return False
    if inner.expressions[0].is_star:
        return False
    outer = {_name(item) for item in _items(select)}
    inner_names = {_name(item) for s in inner.find_all(exp.Select) for item in _items(s)}
    qualifiers = {c.table for c in inner.find_all(exp.Column) if c.table}
    return not (qualifiers & (outer - inner_names))


def _items(select: exp.Select) -> list[exp.Expr]:
    from_ = select.args.get("from_")
    items = [from_.this] if from_ is not None else []
    return items + [j.this for j in select.args.get("joins") or []]


def _name(item: exp.Expr) -> str:
    return item.alias_or_name


def _plain_inputs(select: exp.Select) -> bool:
    """Every input of the query is a named relation or a subquery, and it groups by no
    window call (Flink's GROUP BY TUMBLE(t, ...)): what a join of subqueries may join."""
    items = _items(select)
    if not items:
        return False
    for item in items:
        if isinstance(item, exp.Subquery):
            continue
        if not isinstance(item, exp.Table) or not isinstance(item.this, exp.Identifier):
            return False
    group = select.args.get("group")
    calls = group.find_all(exp.Anonymous) if group is not None else iter(())
    return not any(call.name.upper() in WINDOW_FUNCTIONS for call in calls)


def _qualify_star(select: exp.Select) -> None:
    """``SELECT *`` as each input's columns (``x.*, y.*``), not the joined values'."""
    if not any(isinstance(e, exp.Star) for e in select.expressions):
        return
    expanded: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            expanded += [
                exp.Column(this=exp.Star(), table=exp.to_identifier(_name(i)))
                for i in _items(select)
            ]
        else:
            expanded.append(item)
    select.set("expressions", expanded)


def _distinct_values(inner: exp.Select) -> exp.Select:
    """The subquery's values, each once, as the one column naming.SEMI_JOIN_VALUE."""
    value = inner.expressions[0]
    value = value.this if isinstance(value, exp.Alias) else value
    plain = not any(
        inner.args.get(k) for k in ("group", "having", "distinct", "limit", "order", "qualify")
    ) and not any(inner.find_all(exp.AggFunc, exp.Window))
    if plain:
        values = inner.copy()
        values.set("expressions", [exp.alias_(value.copy(), naming.SEMI_JOIN_VALUE)])
        return values.group_by(value.copy(), copy=False)
    named = inner.copy()
    named.set("expressions", [exp.alias_(value.copy(), naming.SEMI_JOIN_VALUE)])
    column = exp.column(naming.SEMI_JOIN_VALUE, table="v")
    return (
        exp.select(column.copy())
        .from_(exp.Subquery(this=named, alias=exp.TableAlias(this=exp.to_identifier("v"))))
        .group_by(column)
    )
