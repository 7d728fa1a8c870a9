"""Top-N streams that rank each window of a tumbling aggregate stream (the top 10 campaigns
of every minute) are kept as serial streams (rewriter/build_top_n.py): each window's first
N archived when it closes and ranked again after late data, where every read ranked every
row of the source; and serial streams check a row against the windows awaiting repair as a
multirange (binary search), where ANY over the array compared it with each of them.

Plans are re-made from the streams' stored SQL, as at every start. Each serial stream gets
what its plan makes and it lacks (a top-N stream: its archive, indexed on the window and
on the window column it shows), its function made anew, and its view replaced: the same
columns of the same types, the same rows (the materializer archives the closed windows on
its next pass; until then the view ranks them on read), so its readers keep working.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewriter.plan import OnReadStreamPlan, StreamPlan

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# Catalog tables with rows per serial stream (server/catalog.py).
SERIAL_STATE = ("serial_progress", "corrections", "window_revisions", "stream_windows")


def upgrade() -> None:
    from alembic import op

    from migrations.plans import create_statements, replace_views, stored_plans
    from rewriter.plan import SerialAggregatePlan
    from server.catalog import PlanCache, record_windows

    driver, plans = stored_plans(SerialAggregatePlan)
    for plan in plans.values():
        for create in create_statements(plan, "TABLE", "INDEX"):
            create.set("exists", True)
            driver.execute(create.sql("postgres"))
    replace_views(SerialAggregatePlan)
    connection = op.get_bind()
    record_windows(connection, {n: r.plan for n, r in PlanCache().load(connection).items()})


def downgrade() -> None:
    """The previous release ranks every top-N stream on read: each one kept here gets that
    view back, and its archive, function and serial state go. (The other serial streams'
    functions stay: they read what that release keeps and give the same rows.)"""
    from alembic import op
    from psycopg import sql

    from rewriter import naming
    from rewriter.plan import SerialAggregatePlan
    from rewriter.rename import replaced_views
    from server.catalog import PlanCache

    connection = op.get_bind()
    driver = connection.connection.driver_connection
    assert driver is not None
    records = PlanCache().load(connection)
    plans = {n: r.plan for n, r in records.items()}
    for name, record in records.items():
        if not isinstance(record.plan, SerialAggregatePlan):
            continue
        on_read = _on_read(name, record.sql, plans)
        if on_read is None:
            continue
        for statement in replaced_views(on_read):
            driver.execute(statement)  # type: ignore[arg-type]  # a plan's SQL: no params
        function = sql.Identifier(naming.INTERNAL_SCHEMA, naming.serial_live_function(name))
        driver.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(function))
        archive = sql.Identifier(naming.INTERNAL_SCHEMA, naming.serial_archive_table(name))
        driver.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(archive))
        for state in SERIAL_STATE:
            driver.execute(
                sql.SQL("DELETE FROM {} WHERE stream = %s").format(
                    sql.Identifier(naming.CATALOG_SCHEMA, state)
                ),
                (name,),
            )


def _on_read(name: str, text: str, plans: dict[str, StreamPlan]) -> OnReadStreamPlan | None:
    """The plan the previous release made of the top-N stream ``name`` (ranked on read);
    None when the stream is not a top-N stream."""
    from sqlglot import exp

    from rewriter.build_top_n import build_top_n, is_top_n
    from rewriter.parse_stream import DerivedStreamStatement, parse_stream
    from rewriter.plan import OnReadStreamPlan
    from rewriter.split_top_n import split_top_n

    statement = parse_stream(text)
    if not isinstance(statement, DerivedStreamStatement) or not is_top_n(statement.select):
        return None
    select = statement.select
    assert isinstance(select, exp.Select)  # a top-N is one
    ranked = split_top_n(name, select, plans)
    plan = build_top_n(name, select if ranked is None else ranked.select, plans, materialize=False)
    assert isinstance(plan, OnReadStreamPlan)
    return plan
