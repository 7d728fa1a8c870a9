"""Reduced windows get an index on their keys and window end (rewriter/build_views.py): a
dashboard's filter on a key alone (a running total per campaign) or on a key and a time
range reads one range of it, where the index on the window end and keys skipped through
every window.

Plans are re-made from the streams' stored SQL, as at every start, and each aggregate
stream's index statements run again with IF NOT EXISTS: the new index is built over the
rows its consolidated table holds, and nothing else changes.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import index_statements, stored_plans
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for plan in plans.values():
        for create in index_statements(plan):
            create.set("exists", True)
            driver.execute(create.sql("postgres"))


def downgrade() -> None:
    """The indexes go: the previous release's plans do not name them, so its ALTER would
    build a stream's tables without one and leave the old one's behind; upgrading again
    builds them anew."""
    from psycopg import sql

    from migrations.plans import stored_plans
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for name in plans:
        index = sql.Identifier(naming.INTERNAL_SCHEMA, naming.consolidated_index(name, "key_end"))
        driver.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(index))
