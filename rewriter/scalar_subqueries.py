"""Pass 1d: a scalar subquery that is one aggregate over its inputs (``price > (SELECT
avg(price) FROM bid)``), anywhere in SELECT, WHERE or HAVING, as the join it is, which the
pass planning subqueries as join inputs plans.

Uncorrelated, it is one row: ``CROSS JOIN (SELECT avg(price) AS strata_scalar_value FROM
bid) strata_scalar_1``, the subquery read as ``strata_scalar_1.strata_scalar_value``. An
aggregate without GROUP BY, HAVING or LIMIT is one row, even over no rows (NULL, or 0 for a
count), so the join keeps every row once and gives each the subquery's value, as
PostgreSQL evaluates it once for the query.

Correlated by equalities (``(SELECT avg(price) FROM bid b2 WHERE b2.auction = b.auction
AND ...)``), it is the aggregate grouped by the subquery's sides of them, LEFT JOINed on
them: ``LEFT JOIN (SELECT b2.auction AS strata_scalar_key_1, avg(price) AS
strata_scalar_value FROM bid b2 WHERE ... GROUP BY b2.auction) strata_scalar_1 ON
b.auction = strata_scalar_1.strata_scalar_key_1``. One row per key, so every row of the
query is kept once; a row no group matches (no row of the subquery, or a NULL key, which
equals nothing, as in PostgreSQL) reads the aggregate over no rows: NULL, or 0 for a count
(``CASE WHEN strata_scalar_1.strata_scalar_key_1 IS NULL THEN <the item over no rows>
ELSE ... END``).

An uncorrelated ``EXISTS (SELECT ... FROM b WHERE c)`` of a plain subquery (no grouping,
DISTINCT or LIMIT), anywhere in SELECT, WHERE or HAVING, under OR or NOT too, is the
scalar subquery it means, ``(SELECT count(*) FROM b WHERE c) > 0``, and joins so.

Where the query groups and the value stands outside an aggregate call in SELECT or
HAVING, it is grouped by as well (one value per group: it splits no group). A subquery
correlated otherwise, one that may yield several rows, and a query reading a window call
keep their refusals: the pass leaves them as written.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.semi_joins import (
    Correlation,
    correlated,
    correlation,
    plain_inputs,
    plain_subquery,
    qualify_star,
)


def scalar_subqueries(select: exp.Expr) -> exp.Expr:
    """``select`` with each one-row scalar subquery of its SELECT, WHERE and HAVING joined
    instead (the same tree when there is none it can join)."""
    if not isinstance(select, exp.Select) or not plain_inputs(select):
        return select
    joined = _exists_as_counts(select)
    scalars = _scalars(joined)
    if not scalars:
        return select
    grouped = joined.args.get("group") is not None
    aggregated = grouped or any(_aggregates(e) for e in joined.expressions)
    qualify_star(joined)
    regroup: list[exp.Expr] = []
    for position, (subquery, correlating) in enumerate(scalars, start=1):
        alias = naming.scalar_alias(position)
        item = subquery.this.expressions[0]
        body = item.this if isinstance(item, exp.Alias) else item
        value = _value(alias, body, correlating)
        if aggregated and _outside_aggregates(subquery, joined):
            if not grouped:
                return select  # one row of the query's own: left to its refusal
            regroup.append(value.copy())
        inner = subquery.this.copy()
        inner.set("expressions", [exp.alias_(body.copy(), naming.SCALAR_VALUE)])
        subquery.replace(value)
        if correlating is None:
            joined = joined.join(_input(inner, alias), join_type="CROSS", copy=False)
            continue
        pairs, kept = correlating
        inner.set(
            "expressions",
            [
                *(
                    exp.alias_(own.copy(), naming.scalar_key(k))
                    for k, (_, own) in enumerate(pairs, start=1)
                ),
                *inner.expressions,
            ],
        )
        inner.set("where", exp.Where(this=exp.and_(*(c.copy() for c in kept))) if kept else None)
        inner.group_by(*(own.copy() for _, own in pairs), copy=False)
        on = exp.and_(
            *(
                exp.EQ(this=theirs.copy(), expression=exp.column(naming.scalar_key(k), table=alias))
                for k, (theirs, _) in enumerate(pairs, start=1)
            )
        )
        joined = joined.join(_input(inner, alias), on=on, join_type="LEFT", copy=False)
    if regroup:
        joined.set("group", exp.Group(expressions=[*joined.args["group"].expressions, *regroup]))
    return joined


def _exists_as_counts(select: exp.Select) -> exp.Select:
    """A copy of ``select`` with each uncorrelated ``EXISTS (SELECT ... FROM b WHERE c)`` of
    a plain subquery, in SELECT, WHERE or HAVING (under OR or NOT too), as the scalar
    subquery it means: ``(SELECT count(*) FROM b WHERE c) > 0``."""
    counted = select.copy()
    roots = [*counted.expressions, counted.args.get("where"), counted.args.get("having")]
    for root in roots:
        for node in list(root.find_all(exp.Exists)) if root is not None else []:
            inner = node.this
            if not isinstance(inner, exp.Select) or not plain_subquery(inner):
                continue
            if correlated(inner, select) or any(inner.find_all(exp.Subquery)):
                continue
            count = inner.copy()
            count.set("expressions", [exp.Count(this=exp.Star())])
            node.replace(exp.GT(this=exp.Subquery(this=count), expression=exp.Literal.number(0)))
    return counted


def _input(inner: exp.Select, alias: str) -> exp.Subquery:
    return exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _value(alias: str, body: exp.Expr, correlating: Correlation | None) -> exp.Expr:
    """What the query reads in place of the subquery: the joined value, or for a correlated
    one whose item is not NULL over no rows (a count), that item over no rows where no
    group matched."""
    value = exp.column(naming.SCALAR_VALUE, table=alias)
    empty = _over_no_rows(body)
    if correlating is None or empty is None:
        return value
    unmatched = exp.Is(this=exp.column(naming.scalar_key(1), table=alias), expression=exp.Null())
    return exp.Case(ifs=[exp.If(this=unmatched, true=empty)], default=value)


# Aggregates that are 0 over no rows; every other one is NULL there.
_ZERO_OVER_NO_ROWS = (exp.Count, exp.CountIf, exp.ApproxDistinct)


def _over_no_rows(body: exp.Expr) -> exp.Expr | None:
    """The aggregate item ``body`` over no rows, where that is not plainly NULL (None)."""
    if not any(isinstance(n, _ZERO_OVER_NO_ROWS) for n in body.find_all(exp.AggFunc)):
        return None
    if isinstance(body, exp.AggFunc | exp.Filter):
        return exp.Literal.number(0)
    empty = body.copy()
    for call in list(empty.find_all(exp.AggFunc)):
        if call.find_ancestor(exp.AggFunc) is None:
            zero = isinstance(call, _ZERO_OVER_NO_ROWS)
            # FILTER (WHERE ...) goes with its call
            whole = call.parent if isinstance(call.parent, exp.Filter) else call
            whole.replace(exp.Literal.number(0) if zero else exp.Null())
    return empty


def _scalars(select: exp.Select) -> list[tuple[exp.Subquery, Correlation | None]]:
    """The one-row scalar subqueries of SELECT, WHERE and HAVING (outermost first), each
    with how it is correlated to the query by equalities (None: it is not correlated)."""
    roots = [*select.expressions, select.args.get("where"), select.args.get("having")]
    found: list[tuple[exp.Subquery, Correlation | None]] = []
    for root in roots:
        for node in root.find_all(exp.Subquery) if root is not None else []:
            if isinstance(node.parent, exp.From | exp.Join | exp.In | exp.Exists):
                continue
            if any(node is not f and _within(node, f) for f, _ in found):
                continue
            if not _one_row(node.this):
                continue
            if not correlated(node.this, select):
                found.append((node, None))
            elif (found_by := _correlated_by_equalities(node.this, select)) is not None:
                found.append((node, found_by))
    return found


def _correlated_by_equalities(inner: exp.Select, select: exp.Select) -> Correlation | None:
    """How ``inner`` is correlated to ``select`` when only by equalities of its WHERE, its
    aggregate reading its own inputs alone."""
    found = correlation(inner, select)
    if found is None:
        return None
    pairs, kept = found
    probe = inner.copy()
    probe.set("where", exp.Where(this=exp.and_(*(c.copy() for c in kept))) if kept else None)
    return None if correlated(probe, select) else found


def _one_row(inner: exp.Expr) -> bool:
    """One aggregate without GROUP BY, HAVING, DISTINCT, ORDER BY or LIMIT: one row."""
    if not isinstance(inner, exp.Select) or len(inner.expressions) != 1:
        return False
    if any(
        inner.args.get(k)
        for k in ("group", "having", "distinct", "limit", "offset", "order", "qualify")
    ):
        return False
    item = inner.expressions[0]
    return item.find(exp.AggFunc) is not None and item.find(exp.Window) is None


def _outside_aggregates(node: exp.Expr, select: exp.Select) -> bool:
    """Whether ``node`` stands in SELECT or HAVING outside every aggregate call."""
    parent = node.parent
    while parent is not None and parent is not select:
        if isinstance(parent, exp.AggFunc):
            return False
        if isinstance(parent, exp.Where):
            return False
        parent = parent.parent
    return True


def _aggregates(item: exp.Expr) -> bool:
    """Whether ``item`` calls an aggregate of the query's own (not of a subquery)."""
    return any(
        isinstance(n, exp.AggFunc) for n in item.walk(prune=lambda n: isinstance(n, exp.Subquery))
    )


def _within(node: exp.Expr, outer: exp.Expr) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is outer:
            return True
        parent = parent.parent
    return False
