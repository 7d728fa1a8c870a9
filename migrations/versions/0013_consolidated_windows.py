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
    """``statement`` (a CREATE) as one that may run on a database that has the object."""
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
    for record in PlanCache().load(connection).values():
        if isinstance(record.plan, ParallelAggregatePlan):
            for statement in record.plan.create_statements:
                # Straight to psycopg, without parameters: a plan's SQL may hold a '%'.
                driver = connection.connection.driver_connection
                assert driver is not None
                driver.execute(_again(statement))


def downgrade() -> None:
    raise NotImplementedError("the previous release's views read no consolidated table")
