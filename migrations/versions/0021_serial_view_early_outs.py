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

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import SerialAggregatePlan

    replace_views(SerialAggregatePlan)  # and the functions they call since 0023


def downgrade() -> None:
    """Nothing to undo: the views read the tables the previous release keeps, and give the
    same rows, so that release serves them as they are."""
