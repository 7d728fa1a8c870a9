"""Aggregates over a stream-table join keep their view's rows of reduced windows joined
(rewriter/build_joined.py), where every read joined every window's partial rows with the
tables: a dashboard's 6 hours of 1,000 campaigns summed by their 20 owners read 360,000
partial rows for 7,200 result rows.

Upgrade: every such stream gets its joined table (and its indexes) and its seen table,
empty, the function its view checks them with, and its view replaced: the same columns
of the same types, the same rows. Until the reducer's next pass writes the joined rows
(with the tables' versions they were joined at), the view joins every window on read, as
before.

Downgrade: the view joining every window on read back, the function and the two tables
dropped; the previous release's reducer does not keep joined rows.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import create_statements, stored_plans
    from rewriter.plan import ParallelAggregatePlan
    from rewriter.rename import replaced_views

    driver, plans = stored_plans(ParallelAggregatePlan)
    for plan in plans.values():
        if plan.joined is None:
            continue
        for create in create_statements(plan, "TABLE", "INDEX"):
            create.set("exists", True)
            driver.execute(create.sql("postgres"))
        for statement in replaced_views(plan):
            driver.execute(statement)  # type: ignore[arg-type]  # a plan's SQL: no params


def downgrade() -> None:
    import sqlglot
    from psycopg import sql
    from sqlglot import exp

    from migrations.plans import replace_view, stored_plans
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for name, plan in plans.items():
        if plan.joined is None:
            continue
        # The plan's view_query is what the view computes: every window joined on read.
        on_read = sqlglot.parse_one(plan.view_query, read="postgres")
        assert isinstance(on_read, exp.Query)
        replace_view(driver, name, on_read)
        driver.execute(
            sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                sql.Identifier(naming.INTERNAL_SCHEMA, naming.joined_current_function(name))
            )
        )
        for table in (naming.joined_table(name), naming.joined_seen_table(name)):
            driver.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(
                    sql.Identifier(naming.INTERNAL_SCHEMA, table)
                )
            )
