"""Serial streams compute the windows awaiting repair in a function of their own, whose
rows the view joins with the windows listed, showing each window's columns from the list
(rewriter/build_serial.py), where one function computed them with the windows not
materialized yet: a reader's filter on the window's columns now reaches the list, and when
it keeps none of the windows awaiting repair the function is not called, so a dashboard's
hour untouched by late data reads at caught-up speed (a top 10 per minute read one hour in
77 ms, 720 rows computed and dropped, with a quarter of six hours late).

Upgrade: plans are re-made from the streams' stored SQL, as at every start; each serial
stream gets its function of the windows awaiting repair, its function of the windows not
materialized yet made anew (those only), and its view replaced: the same columns of the
same types, the same rows, so its readers and the streams built on it keep working.

Downgrade: the function the previous release's view calls computes both again (the two
functions' queries, one after the other), the view calls it alone, and the function of the
windows awaiting repair goes.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import SerialAggregatePlan

    replace_views(SerialAggregatePlan)


def downgrade() -> None:
    from psycopg import sql
    from sqlglot import exp

    from migrations.plans import (
        function_body,
        replace_view,
        serial_view_before_0031,
        stored_plans,
        view_tables_made,
    )
    from rewriter import naming
    from rewriter.ddl import create_set_function, table
    from rewriter.plan import SerialAggregatePlan

    driver, plans = stored_plans(SerialAggregatePlan)
    for name, plan in plans.items():
        live, awaiting = naming.serial_live_function(name), naming.serial_awaiting_function(name)
        fresh, repaired = function_body(driver, live), function_body(driver, awaiting)
        if not view_tables_made(driver, plan) or fresh is None or repaired is None:
            continue
        archive = table(naming.serial_archive_table(name))
        both = exp.union(fresh, repaired, distinct=False)
        driver.execute(create_set_function(live, archive, both))
        replace_view(driver, name, serial_view_before_0031(plan))
        driver.execute(
            sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                sql.Identifier(naming.INTERNAL_SCHEMA, awaiting)
            )
        )
