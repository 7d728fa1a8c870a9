"""Serial streams' views skip the windows they compute on read when there can be none: the
windows not materialized yet only when the source has a window at or after the end of
the materialized ones, the windows awaiting repair only when some are listed
(rewriter/build_serial.py). Without that, a read while late partial rows of the source
wait for the reducer merged every touched window of the source only to drop it.

Plans are re-made from the streams' stored SQL, as at every start, and each serial
stream's view is replaced: the same columns of the same types, over the same tables, so
its readers and the streams built on it keep working.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from rewriter.plan import SerialAggregatePlan
    from rewriter.rename import replaced_views
    from server.catalog import PlanCache

    connection = op.get_bind()
    # Straight to psycopg, without parameters: a plan's SQL may hold a '%'.
    driver = connection.connection.driver_connection
    assert driver is not None
    for record in PlanCache().load(connection).values():
        if not isinstance(record.plan, SerialAggregatePlan):
            continue
        # Today's view, and the function it calls since 0023.
        for statement in replaced_views(record.plan):
            driver.execute(statement)


def downgrade() -> None:
    """Nothing to undo: the views read the tables the previous release keeps, and give the
    same rows, so that release serves them as they are."""
