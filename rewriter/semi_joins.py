"""Pass 1c: ``expr IN (SELECT c FROM ...)`` and ``EXISTS (SELECT ... FROM b WHERE b.k =
a.k ...)``, a condition of WHERE (alone or ANDed with others), as the semi-join it is: the
query joined with the subquery's distinct values (``JOIN (SELECT c AS strata_in_value FROM
... GROUP BY c) strata_in_1 ON expr = strata_in_1.strata_in_value``), which the pass
planning subqueries as join inputs plans.

A row passes ``expr IN (subquery)`` in WHERE when some value of the subquery equals
``expr`` (a NULL on either side matches nothing, and a WHERE drops the unknown): the join
with each value once keeps exactly those rows, each once. ``EXISTS`` correlated by
equalities (``b.k = a.k AND b.j = a.j``, the subquery's other conditions its own) passes a
row when some row of the subquery has its keys: the join with each key tuple once.
``NOT EXISTS`` so correlated is the anti-join, ``LEFT JOIN`` the key tuples ``... WHERE
strata_in_1.strata_in_value IS NULL`` (a matched tuple has no NULL key, since = matches no
NULL). ``NOT IN`` (true only when no value is NULL), an IN or EXISTS under OR or NOT, a
correlated IN subquery, an EXISTS correlated otherwise than by equalities or not at all,
and a query reading a window call keep their refusals: the pass leaves them as written.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.flink_syntax import WINDOW_FUNCTIONS


def semi_joins(select: exp.Expr) -> exp.Expr:
    """``select`` with each IN and EXISTS subquery of its WHERE's conjuncts joined instead
    (the same tree when there is none it can join)."""
    if not isinstance(select, exp.Select) or select.args.get("where") is None:
        return select
    if not any(_semi(c, select) for c in _conjuncts(select)) or not plain_inputs(select):
        return select
    joined = select.copy()
    kept: list[exp.Expr] = []
    semis: list[_Semi] = []
    for condition in _conjuncts(joined):
        semi = _semi(condition, joined)
        if semi is None:
            kept.append(condition)
        else:
            semis.append(semi)
    qualify_star(joined)
    for position, (pairs, values, anti, counts) in enumerate(semis, start=1):
        alias = naming.semi_join_alias(position)
        on = [
            exp.EQ(
                this=outer.copy(),
                expression=exp.column(naming.semi_join_value(k), table=alias),
            )
            for k, (outer, _) in enumerate(pairs, start=1)
        ]
        joined = joined.join(
            exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier(alias))),
            on=exp.and_(*on),
            join_type="LEFT" if anti else None,
            copy=False,
        )
        if not anti:
            continue
        # A matched row's keys are never NULL (= matches no NULL): NULL is no match.
        unmatched = exp.column(naming.semi_join_value(1), table=alias).is_(exp.null())
        if counts is None:
            kept.append(unmatched)
            continue
        # NOT IN: true when the subquery is empty; else only without a NULL among its
        # values, for a value that is not NULL and matches none.
        # (correlated: per key of the correlating pairs, all but the value's, the last)
        tally = naming.not_in_counts_alias(position)
        keys = [
            exp.EQ(this=outer.copy(), expression=exp.column(naming.semi_join_value(k), table=tally))
            for k, (outer, _) in enumerate(pairs[:-1], start=1)
        ]
        joined = joined.join(
            exp.Subquery(this=counts, alias=exp.TableAlias(this=exp.to_identifier(tally))),
            on=exp.and_(*keys) if keys else None,
            join_type="LEFT" if keys else "CROSS",
            copy=False,
        )
        rows: exp.Expr = exp.column(naming.NOT_IN_ROWS, table=tally)
        values_seen: exp.Expr = exp.column(naming.NOT_IN_VALUES, table=tally)
        if keys:  # a key without rows in the subquery has no counts: 0
            rows = exp.func("coalesce", rows, exp.Literal.number(0))
            values_seen = exp.func("coalesce", values_seen, exp.Literal.number(0))
        kept.append(
            exp.or_(
                rows.copy().eq(0),
                exp.and_(
                    unmatched,
                    rows.eq(values_seen),
                    exp.Not(this=pairs[-1][0].copy().is_(exp.null())),
                ),
            )
        )
    joined.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return joined


# A condition as a semi-join: (outer expression, the subquery's expression it equals) per
# key, the subquery's distinct keys, named naming.semi_join_value(1, 2, ...), whether it
# keeps the rows without a match (NOT EXISTS, NOT IN: an anti-join), and for NOT IN the
# subquery's counts of rows and of values that are not NULL.
_Semi = tuple[list[tuple[exp.Expr, exp.Expr]], exp.Select, bool, exp.Select | None]


def _semi(condition: exp.Expr, select: exp.Select) -> _Semi | None:
    if isinstance(condition, exp.In) and _is_semi(condition, select):
        inner = condition.args["query"].this
        value = inner.expressions[0]
        return [(condition.this, value)], _distinct_values(inner), False, None
    if (
        isinstance(condition, exp.Not)
        and isinstance(condition.this, exp.In)
        and _is_semi(condition.this, select)
    ):
        inner = condition.this.args["query"].this
        value = inner.expressions[0]
        return [(condition.this.this, value)], _distinct_values(inner), True, _counts(inner)
    if (
        isinstance(condition, exp.Not)
        and isinstance(condition.this, exp.In)
        and (exists := _in_as_exists(condition.this, select))
    ):
        return _correlated_not_in(condition.this, exists, select)
    if isinstance(condition, exp.In) and (exists := _in_as_exists(condition, select)):
        return _exists(exists, select, anti=False)
    if isinstance(condition, exp.Exists):
        return _exists(condition, select, anti=False)
    if isinstance(condition, exp.Not) and isinstance(condition.this, exp.Exists):
        return _exists(condition.this, select, anti=True)
    return None


def _exists(condition: exp.Exists, select: exp.Select, *, anti: bool) -> _Semi | None:
    """``EXISTS (SELECT ... FROM b WHERE b.k = a.k AND ...)``: a semi-join on the
    equalities that read the query's inputs (each ``inner = outer``), the subquery's other
    conditions kept in it; None when it is not that (uncorrelated, correlated otherwise, or
    aggregated)."""
    inner = condition.this
    if not isinstance(inner, exp.Select) or any(
        inner.args.get(k) for k in ("group", "having", "distinct", "limit", "order", "qualify")
    ):
        return None
    if any(inner.find_all(exp.AggFunc)):
        return None
    found = correlation(inner, select)
    if found is None:
        return None
    pairs, kept = found
    values = inner.copy()
    values.set(
        "expressions",
        [
            exp.alias_(value.copy(), naming.semi_join_value(k))
            for k, (_, value) in enumerate(pairs, start=1)
        ],
    )
    values.set("where", exp.Where(this=exp.and_(*(c.copy() for c in kept))) if kept else None)
    return pairs, values.group_by(*(value.copy() for _, value in pairs), copy=False), anti, None


Correlation = tuple[list[tuple[exp.Expr, exp.Expr]], list[exp.Expr]]


def correlation(inner: exp.Select, select: exp.Select) -> Correlation | None:
    """How the subquery ``inner`` reads ``select``'s inputs, when only by equalities among
    its WHERE's conjuncts: the pairs (outer expression, inner expression) of those
    equalities, and the other conjuncts (which read the subquery's inputs alone). None
    when its WHERE reads them otherwise, or not at all, or it holds a window call or a
    subquery. (What its SELECT list reads is the caller's to check.)"""
    if inner.args.get("where") is None or any(inner.find_all(exp.Window, exp.Subquery)):
        return None
    outer_names = {_name(item) for item in from_items(select)}
    inner_names = {_name(item) for item in from_items(inner)}
    outside = outer_names - inner_names

    def reads_outer(node: exp.Expr) -> bool:
        return any(c.table in outside for c in node.find_all(exp.Column))

    def reads_inner(node: exp.Expr) -> bool:
        return any(c.table not in outside for c in node.find_all(exp.Column))

    pairs: list[tuple[exp.Expr, exp.Expr]] = []
    kept: list[exp.Expr] = []
    for conjunct in _conjuncts(inner):
        if not reads_outer(conjunct):
            kept.append(conjunct)
            continue
        if not isinstance(conjunct, exp.EQ):
            return None
        left, right = conjunct.this, conjunct.expression
        if reads_outer(left) and not reads_inner(left) and not reads_outer(right):
            pairs.append((left, right))
        elif reads_outer(right) and not reads_inner(right) and not reads_outer(left):
            pairs.append((right, left))
        else:
            return None
    return (pairs, kept) if pairs else None


def _in_as_exists(condition: exp.In, select: exp.Select) -> exp.Exists | None:
    """A correlated ``x IN (SELECT y FROM b WHERE ...)`` as the EXISTS it means in WHERE
    (``EXISTS (SELECT y FROM b WHERE ... AND y = x)``: true for the same rows; where IN
    gives NULL, no row matches, which WHERE takes as false); None for any other IN."""
    query = condition.args.get("query")
    inner = query.this if isinstance(query, exp.Subquery) else None
    if condition.args.get("expressions") or not isinstance(inner, exp.Select):
        return None
    if len(inner.expressions) != 1 or inner.expressions[0].is_star:
        return None
    if not correlated(inner, select):
        return None
    item = inner.expressions[0]
    value = item.this if isinstance(item, exp.Alias) else item
    exists = inner.copy()
    equal = exp.EQ(this=value.copy(), expression=condition.this.copy())
    exists.set("where", exp.Where(this=exp.and_(*(c.copy() for c in _conjuncts(inner)), equal)))
    return exp.Exists(this=exists)


def _correlated_not_in(condition: exp.In, exists: exp.Exists, select: exp.Select) -> _Semi | None:
    """``x NOT IN (SELECT c FROM b WHERE b.k = a.k AND ...)``: the anti-join on (k, c) of
    the EXISTS it negates, with the subquery's counts per key (rows, values that are not
    NULL), joined on k, for NULL's meaning; None unless ``x`` reads the query's row (its
    equality is then the last pair) and the subquery is plain."""
    found = _exists(exists, select, anti=True)
    if found is None:
        return None
    pairs, values, _, _ = found
    if len(pairs) < 2 or pairs[-1][0] != condition.this:
        return None
    inner = condition.args["query"].this
    item = inner.expressions[0]
    counts = exists.this.copy()
    counts.set(
        "expressions",
        [
            *(
                exp.alias_(own.copy(), naming.semi_join_value(k))
                for k, (_, own) in enumerate(pairs[:-1], start=1)
            ),
            exp.alias_(exp.Count(this=exp.Star()), naming.NOT_IN_ROWS),
            exp.alias_(
                exp.Count(this=(item.this if isinstance(item, exp.Alias) else item).copy()),
                naming.NOT_IN_VALUES,
            ),
        ],
    )
    counts.set("where", values.args["where"].copy() if values.args.get("where") else None)
    counts.group_by(*(own.copy() for _, own in pairs[:-1]), copy=False)
    return pairs, values, True, counts


def _conjuncts(select: exp.Select) -> list[exp.Expr]:
    """The conditions ANDed in ``select``'s WHERE (none without one)."""
    where = select.args.get("where")
    if where is None:
        return []
    return list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]


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
    return not correlated(inner, select)


def correlated(inner: exp.Select, select: exp.Select) -> bool:
    """Whether the subquery ``inner`` reads ``select``'s inputs by their names (names its own
    FROM items, at any depth, shadow)."""
    outer = {_name(item) for item in from_items(select)}
    own = {_name(item) for s in inner.find_all(exp.Select) for item in from_items(s)}
    return any(c.table in outer - own for c in inner.find_all(exp.Column) if c.table)


def from_items(select: exp.Select) -> list[exp.Expr]:
    from_ = select.args.get("from_")
    items = [from_.this] if from_ is not None else []
    return items + [j.this for j in select.args.get("joins") or []]


def _name(item: exp.Expr) -> str:
    return item.alias_or_name


def plain_inputs(select: exp.Select) -> bool:
    """Every input of the query is a named relation or a subquery, and it groups by no
    window call (Flink's GROUP BY TUMBLE(t, ...)): what a join of subqueries may join."""
    items = from_items(select)
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


def qualify_star(select: exp.Select) -> None:
    """``SELECT *`` as each input's columns (``x.*, y.*``), not the joined values'."""
    if not any(isinstance(e, exp.Star) for e in select.expressions):
        return
    expanded: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            expanded += [
                exp.Column(this=exp.Star(), table=exp.to_identifier(_name(i)))
                for i in from_items(select)
            ]
        else:
            expanded.append(item)
    select.set("expressions", expanded)


def _counts(inner: exp.Select) -> exp.Select:
    """The subquery's rows and its values that are not NULL, counted (one row, even over
    none): what NOT IN's answer for an unmatched value depends on."""
    value = inner.expressions[0]
    value = value.this if isinstance(value, exp.Alias) else value
    counted = [
        exp.alias_(exp.Count(this=exp.Star()), naming.NOT_IN_ROWS),
        exp.alias_(exp.Count(this=value.copy()), naming.NOT_IN_VALUES),
    ]
    if plain_subquery(inner):
        counts = inner.copy()
        counts.set("expressions", counted)
        return counts
    named = inner.copy()
    named.set("expressions", [exp.alias_(value.copy(), naming.SEMI_JOIN_VALUE)])
    column = exp.column(naming.SEMI_JOIN_VALUE, table="v")
    return exp.select(
        exp.alias_(exp.Count(this=exp.Star()), naming.NOT_IN_ROWS),
        exp.alias_(exp.Count(this=column), naming.NOT_IN_VALUES),
    ).from_(exp.Subquery(this=named, alias=exp.TableAlias(this=exp.to_identifier("v"))))


def plain_subquery(inner: exp.Select) -> bool:
    """A subquery without grouping, DISTINCT, LIMIT or window functions: its rows are its
    input's rows that pass its WHERE."""
    return not any(
        inner.args.get(k) for k in ("group", "having", "distinct", "limit", "order", "qualify")
    ) and not any(inner.find_all(exp.AggFunc, exp.Window))


def _distinct_values(inner: exp.Select) -> exp.Select:
    """The subquery's values, each once, as the one column naming.SEMI_JOIN_VALUE."""
    value = inner.expressions[0]
    value = value.this if isinstance(value, exp.Alias) else value
    if plain_subquery(inner):
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
