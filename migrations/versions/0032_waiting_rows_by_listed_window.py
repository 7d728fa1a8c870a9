"""Aggregate views of tumbling windows read their waiting windows' partial rows and states
window by window from the list of waiting windows, whose window start each row carries
(rewriter/build_views.py waiting_rows), where they read the whole partial archive: a
reader's filter on the window (a dashboard's hour) now narrows the list, and the partial
rows of other windows are not read (with a fifth of a day late, 288,000 partial rows
scanned at every read of one campaign's hour).

Upgrade: plans are re-made from the streams' stored SQL, as at every start, and each
aggregate stream's functions made anew and its view replaced: the same columns of the
same types, the same rows, so its readers and the streams built on it keep working.

Downgrade: each view as the previous release made it (migrations/plans.py
aggregate_view_before_0032).

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import ParallelAggregatePlan

    replace_views(ParallelAggregatePlan)


def downgrade() -> None:
    from migrations.plans import aggregate_view_before_0032, replace_view, stored_plans
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for name, plan in plans.items():
        replace_view(driver, name, aggregate_view_before_0032(plan))
