"""Existing streams keep the view column names they were created with.

Strata now names an unaliased select item as PostgreSQL does (``k::text`` is ``k``,
``ceiling(x)`` is ``ceiling``), where it used to take the parser's name for it (``cast``,
``ceil``). A stream's plan is made again from its SQL at every start, so a stream whose
view Strata named (aggregates, joins) would be planned with new names over a view and
archives made with the old ones, and a stream built on it would no longer find its
columns. This gives every such item of every existing stream its old name as an alias, in
the SQL the catalog keeps: its view, its dependents and its dashboards go on as before.
Views PostgreSQL named itself (streams without aggregates, top-N, sessions, queries over
a subquery) already had PostgreSQL's names and are left alone.

The old rule is frozen here, as it was when this migration was written.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlglot import exp

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"
_RENAMED = {
    "variance_pop": "var_pop",
    "logical_or": "bool_or",
    "approx_distinct": "approx_count_distinct",
}
_FOLDED = {"variance", "logical_and"}


def _old_name(item: exp.Expr) -> str | None:
    """The name Strata gave an unaliased item before this release (None: it needed AS)."""
    if isinstance(item, exp.Column):
        return None if isinstance(item.this, exp.Star) else item.name
    if isinstance(item, exp.Func) and not isinstance(item, exp.Anonymous):
        name = item.sql_name().lower()
        return None if name in _FOLDED else _RENAMED.get(name, name)
    return None


def pinned(sql: str) -> str | None:
    """``sql`` with its items' old names as aliases where the names changed; None when
    nothing changes (or the statement is of a kind PostgreSQL names the view of)."""
    from rewriter.build_projection import is_projection
    from rewriter.build_session import is_session
    from rewriter.build_top_n import is_top_n
    from rewriter.derived_select import output_name
    from rewriter.parse_stream import DerivedStreamStatement, parse_stream
    from rewriter.split_subquery import is_subquery

    statement = parse_stream(sql)
    if not isinstance(statement, DerivedStreamStatement):
        return None
    select = statement.select
    if not isinstance(select, exp.Select) or any(
        test(select) for test in (is_projection, is_session, is_top_n, is_subquery)
    ):
        return None
    changed = False
    items = []
    for item in select.expressions:
        old = None if isinstance(item, exp.Alias) else _old_name(item)
        try:
            new = output_name(item)
        except Exception:  # noqa: BLE001 - an item the new rule cannot name keeps the old
            new = None
        if old is not None and old != new:
            item = exp.alias_(item.copy(), old, quoted=True)
            changed = True
        items.append(item)
    if not changed:
        return None
    renamed = select.copy()
    renamed.set("expressions", items)
    return f"CREATE STREAM {statement.name} AS {renamed.sql('postgres')}"


def upgrade() -> None:
    connection = op.get_bind()
    streams = sa.table("streams", sa.column("name"), sa.column("sql"), schema=CATALOG)
    for name, sql in connection.execute(sa.select(streams.c.name, streams.c.sql)).all():
        try:
            new_sql = pinned(sql)
        except Exception:  # noqa: BLE001 - a statement this cannot read keeps its text
            continue
        if new_sql is not None:
            connection.execute(sa.update(streams).where(streams.c.name == name).values(sql=new_sql))


def downgrade() -> None:
    pass  # the aliases name what the old rule named: the old release reads them alike
