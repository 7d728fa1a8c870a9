"""Reduced windows read like a plain table: every aggregate stream gets its consolidated
tables (the final values of its reduced windows, and their partial form), and its view
reads them.

Plans are re-made from the streams' stored SQL, as at every start. Each stream's create
statements run again with IF NOT EXISTS (the partial archive and its index are there; the
consolidated tables are new) and its view is replaced: the same columns of the same types
(the view's readers and the streams built on it keep working). The partial rows already
archived, the rows earlier reducers folded included, stay where they are: the view merges
them on read until the reducer moves them, window by window, into the consolidated tables.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlglot
from alembic import op
from sqlglot import exp

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _again(statement: str) -> str:
    """``statement`` (a CREATE) as one that may run on a database that has the object (a
    function's, CREATE OR REPLACE since 0025, as it is)."""
    from rewriter.ddl import CREATE_FUNCTION

    if statement.startswith(CREATE_FUNCTION):
        return statement
    create = sqlglot.parse_one(statement, read="postgres")
    assert isinstance(create, exp.Create)
    if create.kind == "VIEW":
        create.set("replace", True)
    else:
        create.set("exists", True)
    return create.sql("postgres")


def upgrade() -> None:
    from rewriter.plan import ParallelAggregatePlan
    from server.catalog import PlanCache

    connection = op.get_bind()
    for record in PlanCache().load(connection, versioned=False).values():
        if isinstance(record.plan, ParallelAggregatePlan):
            for statement in record.plan.create_statements:
                if statement.startswith("CREATE TRIGGER"):
                    continue  # the waiting windows' trigger, which 0030 makes
                # Straight to psycopg, without parameters: a plan's SQL may hold a '%'.
                driver = connection.connection.driver_connection
                assert driver is not None
                driver.execute(_again(statement))


def downgrade() -> None:
    """Views the previous release can serve: each merges all of its stream's partial rows
    on read, the unreduced ones and the consolidated ones (their states), so they stay
    exact while that release's reducer folds the partial archive alone. The consolidated
    tables stay, with what they held; upgrading again reads them as before."""
    from migrations.plans import aggregate_view_before_0032
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan
    from server.catalog import PlanCache

    connection = op.get_bind()
    driver = connection.connection.driver_connection
    assert driver is not None
    for name, record in PlanCache().load(connection, versioned=False).items():
        if isinstance(record.plan, ParallelAggregatePlan):
            view = aggregate_view_before_0032(record.plan)
            # Consolidated rows as they are, then merged ones (since 0027 under a filter, each
            # with the columns it filters on after the outputs).
            union = view if isinstance(view, exp.Union) else view.find(exp.Union)
            if union is not None:
                merged = union.expression
                hidden = (naming.VIEW_WINDOW_COLUMN, naming.VIEW_STORED_COLUMN)
                merged.set(
                    "expressions", [e for e in merged.expressions if e.alias_or_name not in hidden]
                )
                partials = merged.find(exp.Union)
                assert partials is not None
                partials.expression.set("where", None)  # every consolidated row, merged
                view = merged
            create = exp.Create(
                this=exp.table_(name, db="public", quoted=True),
                kind="VIEW",
                expression=view,
                replace=True,
            )
            driver.execute(create.sql("postgres"))
