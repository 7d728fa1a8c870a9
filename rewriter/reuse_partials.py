"""For ALTER STREAM: whether the partial rows a stream archived answer a new definition's
partial query, and which archived column each new column is.

The partial query (build_views.partial_query) is ``SELECT run, pane start, keys, states
FROM input [WHERE ...] GROUP BY run, pane start, keys``. A new one is answered by the old
rows when both read the same input, filter alike, group alike, and every column of the
new one is computed, with the same type, by some column of the old one: dropped, renamed
or reordered outputs, a HAVING, an avg beside its sum and count, a new final expression
over the same states. Anything else (a new filter, key, window or state) needs the
history again.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from rewriter.plan import ParallelAggregatePlan


def reusable_columns(
    old: ParallelAggregatePlan, new: ParallelAggregatePlan
) -> dict[str, str] | None:
    """New partial column -> old partial column, if ``old``'s partial rows (and reduced
    states) answer ``new``'s partial query; else None."""
    if (
        old.raw_sources != new.raw_sources
        or old.pane_us != new.pane_us
        or old.partial_input != new.partial_input
        or old.window_slide_us != old.window_size_us  # HOP keeps reduced states per window
    ):
        return None
    before, after = _parse(old.partial_query), _parse(new.partial_query)
    if before is None or after is None:
        return None
    for clause in ("from_", "where", "joins", "having"):
        if _text(before.args.get(clause)) != _text(after.args.get(clause)):
            return None
    if _groups(before) != _groups(after):
        return None
    old_types = dict(old.partial_columns)
    new_types = dict(new.partial_columns)
    computed: dict[tuple[str, str], str] = {}
    for alias, expression in _projections(before):
        computed.setdefault((expression, old_types.get(alias, "")), alias)
    columns: dict[str, str] = {}
    for alias, expression in _projections(after):
        found = computed.get((expression, new_types.get(alias, "")))
        if found is None:
            return None
        columns[alias] = found
    if set(columns) != set(new_types):
        return None
    return columns


def _parse(query: str) -> exp.Select | None:
    parsed = sqlglot.parse_one(query, read="spark")
    return parsed if isinstance(parsed, exp.Select) else None


def _text(node: object) -> str | list[str] | None:
    if node is None:
        return None
    if isinstance(node, list):
        return [n.sql("spark") for n in node]
    assert isinstance(node, exp.Expr)
    return node.sql("spark")


def _groups(select: exp.Select) -> set[str]:
    group = select.args.get("group")
    return {e.sql("spark") for e in group.expressions} if group is not None else set()


def _projections(select: exp.Select) -> list[tuple[str, str]]:
    found = []
    for projection in select.expressions:
        if not isinstance(projection, exp.Alias):
            if isinstance(projection, exp.Column):
                found.append((projection.name, projection.sql("spark")))
            continue
        found.append((projection.alias, projection.this.sql("spark")))
    return found
