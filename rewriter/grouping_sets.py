"""Pass 1d: ``GROUP BY ... GROUPING SETS (...)``, ``ROLLUP (...)`` and ``CUBE (...)`` as the
UNION ALL of one grouped query per grouping set, which rewriter.split_union plans as a
stream per set.

PostgreSQL's meaning: the query's groups under each grouping set, in one result. A set is
the plain keys of GROUP BY and its own keys (``ROLLUP (a, b)`` is the sets (a, b), (a) and
(); ``CUBE (a, b)`` every subset; several grouping items multiply their sets). Under a set, a
key it leaves out reads as NULL wherever it stands outside an aggregate call, and
``GROUPING(k, ...)`` is the bit mask of its arguments left out (the first argument the
highest bit). Each set's query writes a key it leaves out as ``CASE WHEN FALSE THEN k END``,
NULL of the key's own type, and groups by that too: it is one value for every row, so it
splits no group, and a column of every branch keeps one type across the union.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import named_query
from rewriter.errors import UnsupportedSQL
from rewriter.positions import position_of

MAX_SETS = 32  # each grouping set is a stream of its own

_GROUPINGS = exp.GroupingSets | exp.Rollup | exp.Cube
_KINDS = {exp.GroupingSets: "GROUPING SETS", exp.Rollup: "ROLLUP", exp.Cube: "CUBE"}
_WINDOW_COLUMNS = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)


def has_grouping_sets(query: exp.Expr) -> bool:
    group = query.args.get("group") if isinstance(query, exp.Select) else None
    return group is not None and any(isinstance(k, _GROUPINGS) for k in group.expressions)


def grouping_sets(query: exp.Expr) -> exp.Expr:
    """``query`` with a SELECT grouped by grouping sets (or each such branch of a UNION
    ALL) as the UNION ALL of its grouping sets' queries; the same tree otherwise."""
    if isinstance(query, exp.Union):
        left, right = grouping_sets(query.this), grouping_sets(query.expression)
        if left is query.this and right is query.expression:
            return query
        if isinstance(right, exp.Union):  # A UNION (B1 UNION ALL B2) keeps its parentheses
            right = right.subquery()
        return exp.union(left, right, distinct=bool(query.args.get("distinct")))
    if not has_grouping_sets(query):
        return query
    assert isinstance(query, exp.Select)
    _refuse_beside(query)
    group = query.args["group"]
    items = [_resolved(k, query) for k in group.expressions]
    # Every branch names its columns as the query does (a key left out is NULL, not a
    # column, and a union takes its names from its first branch).
    query = named_query(query)
    assert isinstance(query, exp.Select)
    sets = [_distinct(sum(parts, [])) for parts in product(*(_sets_of(i) for i in items))]
    if len(sets) > MAX_SETS:
        raise UnsupportedSQL(
            f"GROUP BY makes {len(sets)} grouping sets, each kept as a stream of its own: at "
            f"most {MAX_SETS}; list the sets you read with GROUPING SETS ((...), ...)",
            position=position_of(group),
        )
    keys = _distinct([k for s in sets for k in s])
    windowed = [any(_is_window(k) for k in s) for s in sets]
    if any(windowed) and not all(windowed):
        raise UnsupportedSQL(
            "every grouping set groups by the window: write the window beside the grouping "
            "sets, GROUP BY window_start, window_end, ROLLUP (...)",
            position=position_of(group),
        )
    branches = [_branch(query, s, keys) for s in sets]
    union: exp.Expr = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False)
    return union


def _refuse_beside(query: exp.Select) -> None:
    kind = next(
        _KINDS[type(k)] for k in query.args["group"].expressions if isinstance(k, _GROUPINGS)
    )
    for clause, shown in (("order", "ORDER BY"), ("limit", "LIMIT"), ("distinct", "DISTINCT")):
        if query.args.get(clause) is not None:
            raise UnsupportedSQL(
                f"{shown} with {kind} is not supported: a stream of grouping sets is read "
                f"with {shown} (SELECT ... FROM stream {shown} ...)",
                position=position_of(query.args[clause]),
            )
    window = next((e for e in query.expressions if e.find(exp.Window) is not None), None)
    if window is not None:
        raise UnsupportedSQL(
            f"window functions with {kind} are not supported in one statement: create the "
            "grouping sets as a stream, then a stream of window functions over it",
            position=position_of(window),
        )


def _resolved(item: exp.Expr, query: exp.Select) -> exp.Expr:
    """A grouping item with each key given by SELECT position, or by the name of a SELECT
    item, written as the item's expression (as GROUP BY reads them). A name the item reads
    itself (``coalesce(extra, 'all') AS extra``) is an input column, which GROUP BY takes
    before an output name."""
    outputs = query.expressions
    aliases = {
        o.alias: o.this
        for o in outputs
        if isinstance(o, exp.Alias)
        and not any(c.name == o.alias for c in o.this.find_all(exp.Column))
    }

    def key(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
            position = int(node.this)
            if not 1 <= position <= len(outputs):
                raise UnsupportedSQL(
                    f"GROUP BY position {position} is not in the SELECT list",
                    position=position_of(node),
                )
            chosen = outputs[position - 1]
            return (chosen.this if isinstance(chosen, exp.Alias) else chosen).copy()
        if isinstance(node, exp.Column) and not node.table and node.name in aliases:
            return aliases[node.name].copy()
        return node

    if isinstance(item, _GROUPINGS | exp.Tuple | exp.Paren):
        resolved = item.copy()
        for node in list(resolved.iter_expressions()):
            node.replace(_resolved(node, query))
        return resolved
    return key(item)


def _sets_of(item: exp.Expr) -> list[list[exp.Expr]]:
    """The grouping sets one item of GROUP BY stands for, each a list of keys."""
    if isinstance(item, exp.GroupingSets):
        return [s for element in item.expressions for s in _sets_of(element)]
    if isinstance(item, exp.Rollup):
        parts = [_keys_of(e) for e in item.expressions]
        return [sum(parts[:n], []) for n in range(len(parts), -1, -1)]
    if isinstance(item, exp.Cube):
        parts = [_keys_of(e) for e in item.expressions]
        return [
            sum((p for p, kept in zip(parts, mask, strict=True) if kept), [])
            for mask in product((True, False), repeat=len(parts))
        ]
    return [_keys_of(item)]


def _keys_of(element: exp.Expr) -> list[exp.Expr]:
    """The keys of one element: ``(a, b)`` is two keys, ``()`` none."""
    if isinstance(element, exp.Tuple):
        return list(element.expressions)
    if isinstance(element, exp.Paren):
        return [element.this]
    return [element]


def _distinct(keys: list[exp.Expr]) -> list[exp.Expr]:
    kept: list[exp.Expr] = []
    for key in keys:
        if key not in kept:
            kept.append(key)
    return kept


def _is_window(key: exp.Expr) -> bool:
    return isinstance(key, exp.Column) and key.name in _WINDOW_COLUMNS


def _branch(query: exp.Select, grouped: list[exp.Expr], keys: list[exp.Expr]) -> exp.Select:
    """The query under one grouping set: the keys it leaves out as NULL of their type."""
    left_out = [k for k in keys if k not in grouped]
    branch = query.copy()
    having = branch.args.get("having")
    # The empty set without other keys is one group, even over no rows (as a query
    # without GROUP BY): a key left out there is an aggregate of NULLs.
    null = _typed_null if grouped else _aggregated_null
    for root in [*branch.expressions, *([having.this] if having is not None else [])]:
        _null_left_out(root, left_out, null)
    group = [k.copy() for k in grouped] + [_typed_null(k) for k in left_out] if grouped else []
    branch.set("group", exp.Group(expressions=group) if group else None)
    return branch


def _null_left_out(
    node: exp.Expr, left_out: list[exp.Expr], null: Callable[[exp.Expr], exp.Expr]
) -> None:
    """Outside aggregate calls, from the outside in: each key left out as ``null(key)``,
    each GROUPING(...) as its bit mask."""
    if isinstance(node, exp.Grouping):
        node.replace(_grouping_mask(node, left_out))
        return
    if isinstance(node, exp.AggFunc):
        return
    if not isinstance(node, exp.Alias) and node in left_out:
        node.replace(null(node))
        return
    for child in list(node.iter_expressions()):
        _null_left_out(child, left_out, null)


def _grouping_mask(call: exp.Grouping, left_out: list[exp.Expr]) -> exp.Expr:
    bits = [1 if a in left_out else 0 for a in call.expressions]
    return exp.Literal.number(sum(b << (len(bits) - 1 - i) for i, b in enumerate(bits)))


def _typed_null(key: exp.Expr) -> exp.Expr:
    """NULL of ``key``'s type: CASE WHEN FALSE THEN key END."""
    return exp.Case(ifs=[exp.If(this=exp.false(), true=key.copy())])


def _aggregated_null(key: exp.Expr) -> exp.Expr:
    """NULL of ``key``'s type in a query without GROUP BY: max(CASE WHEN FALSE THEN key END)."""
    return exp.Max(this=_typed_null(key))
