"""Pass 1d: a scalar subquery that is one aggregate over its inputs (``price > (SELECT
avg(price) FROM bid)``), anywhere in SELECT, WHERE or HAVING, as the one-row join it is:
``CROSS JOIN (SELECT avg(price) AS strata_scalar_value FROM bid) strata_scalar_1``, the
subquery read as ``strata_scalar_1.strata_scalar_value``, which the pass planning
subqueries as join inputs plans.

An aggregate without GROUP BY, HAVING or LIMIT is one row, even over no rows (NULL, or 0
for a count), so the join keeps every row once and gives each the subquery's value, as
PostgreSQL evaluates it once for the query. Where the query groups and the value stands
outside an aggregate call in SELECT or HAVING, it is grouped by as well (one value: it
splits no group). A correlated subquery, one that may yield several rows or none, and a
query reading a window call keep their refusals: the pass leaves them as written.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.semi_joins import correlated, plain_inputs, qualify_star


def scalar_subqueries(select: exp.Expr) -> exp.Expr:
    """``select`` with each one-row scalar subquery of its SELECT, WHERE and HAVING joined
    instead (the same tree when there is none it can join)."""
    if not isinstance(select, exp.Select) or not _scalars(select) or not plain_inputs(select):
        return select
    joined = select.copy()
    scalars = _scalars(joined)
    grouped = joined.args.get("group") is not None
    aggregated = grouped or any(_aggregates(e) for e in joined.expressions)
    qualify_star(joined)
    regroup: list[exp.Expr] = []
    for position, subquery in enumerate(scalars, start=1):
        alias = naming.scalar_alias(position)
        value = exp.column(naming.SCALAR_VALUE, table=alias)
        if aggregated and _outside_aggregates(subquery, joined):
            if not grouped:
                return select  # one row of the query's own: left to its refusal
            regroup.append(value.copy())
        inner = subquery.this.copy()
        item = inner.expressions[0]
        inner.set(
            "expressions",
            [exp.alias_(item.this if isinstance(item, exp.Alias) else item, naming.SCALAR_VALUE)],
        )
        subquery.replace(value)
        joined = joined.join(
            exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(alias))),
            join_type="CROSS",
            copy=False,
        )
    if regroup:
        joined.set("group", exp.Group(expressions=[*joined.args["group"].expressions, *regroup]))
    return joined


def _scalars(select: exp.Select) -> list[exp.Subquery]:
    """The one-row, uncorrelated scalar subqueries of SELECT, WHERE and HAVING, outermost
    first."""
    roots = [*select.expressions, select.args.get("where"), select.args.get("having")]
    found: list[exp.Subquery] = []
    for root in roots:
        for node in root.find_all(exp.Subquery) if root is not None else []:
            if isinstance(node.parent, exp.From | exp.Join | exp.In | exp.Exists):
                continue
            if any(node is not f and _within(node, f) for f in found):
                continue
            if _one_row(node.this) and not correlated(node.this, select):
                found.append(node)
    return found


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
