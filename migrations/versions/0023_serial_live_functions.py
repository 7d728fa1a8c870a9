"""Serial streams compute the windows they read but have not materialized (not yet, or
awaiting repair) in a function of their own (rewriter/build_serial.py), which PostgreSQL
plans once per session, where the view planned them at every read: planning took three
times as long as reading a caught-up archive.

Plans are re-made from the streams' stored SQL, as at every start, and each serial
stream's function is made and its view replaced: the same columns of the same types, the
same rows, so its readers and the streams built on it keep working.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import SerialAggregatePlan

    replace_views(SerialAggregatePlan)


def downgrade() -> None:
    """Views the previous release serves, which it can also drop: each function's body in
    its view's place, as a subquery (the release before planned the same query in the
    view), and the function dropped."""
    from migrations.plans import (
        function_body,
        replace_calls,
        serial_view_before_0031,
        stored_plans,
    )
    from rewriter import naming
    from rewriter.plan import SerialAggregatePlan

    driver, plans = stored_plans(SerialAggregatePlan)
    for name, plan in plans.items():
        function = naming.serial_live_function(name)
        body = function_body(driver, function)
        if body is None:
            continue
        # The view as 0023 made it (0031's downgrade, before, put it back).
        view = serial_view_before_0031(plan).sql("postgres")
        replace_calls(driver, name, view, function, body)
