"""Aggregate streams find the windows whose partial rows wait for the reducer through a
function of their own (rewriter/ddl.py create_windows_function), which skips through the
partial archive's index one window at a time, where the view read every unreduced partial
row with SELECT DISTINCT on every read; and the view asks for them only when a partial row
waits.

Plans are re-made from the streams' stored SQL, as at every start, and each aggregate
stream's function is made and its view replaced: the same columns of the same types, the
same rows, so its readers and the streams built on it keep working.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from sqlglot import exp

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import ParallelAggregatePlan

    replace_views(ParallelAggregatePlan)


def downgrade() -> None:
    """Views the previous release serves, which it can also drop: the function's call in
    each view replaced by what the release before read there, SELECT DISTINCT over the
    partial archive, and the function dropped."""
    from migrations.plans import aggregate_view_before_0032, replace_calls, stored_plans
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for name, plan in plans.items():
        distinct = (
            exp.select(exp.column(naming.WINDOW_START_COLUMN))
            .distinct()
            .from_(exp.table_(naming.partial_archive_table(name), db=naming.INTERNAL_SCHEMA))
        )
        function = naming.waiting_windows_function(name)
        view = aggregate_view_before_0032(plan).sql("postgres")
        replace_calls(driver, name, view, function, distinct)
