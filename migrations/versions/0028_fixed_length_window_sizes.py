"""The SQL Strata writes adds a window's size (a window's end from its start, a session's
end from its last row) spelled in hours at most: '1 day' became '24 hours', '1 week' '168
hours' (rewriter.resolve_window.fixed_interval). PostgreSQL adds a day in the session's
time zone, 23 or 25 hours across a daylight-saving change, so a view read by a session in
such a zone placed a day window's end an hour off while the window was merged on read, and
a server whose database defaults to such a zone folded and materialized the wrong end.

Upgrade: the views (and the functions they call) of every stream whose SQL adds a size of
whole days, re-made from its stored SQL as at every start (the same columns of the same
types: their readers and the streams built on them keep working); the window ends of its
consolidated rows set to 24 hours a day after their start where a fold in such a zone set
them otherwise; and every materialized window of such a serial stream listed as corrected,
so that it reads as computed on read (exact) until the repairer has written it again.

Downgrade keeps the views as they are: the previous release reads the same columns and rows
from them, and spelling a day as 24 hours was never wrong.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import re

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# An INTERVAL of whole days as fixed_interval spells it.
_WHOLE_DAYS = re.compile(r"INTERVAL '(\d+) hours'")


def _adds_days(statements: tuple[str, ...]) -> bool:
    return any(int(hours) % 24 == 0 for s in statements for hours in _WHOLE_DAYS.findall(s))


def _whole_days(size_us: int) -> bool:
    """Whether a window of ``size_us`` is whole days long (0: no window)."""
    return size_us > 0 and size_us % 86_400_000_000 == 0


def upgrade() -> None:
    from psycopg import sql

    from migrations.plans import stored_plans, view_tables_made
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan, SerialAggregatePlan, StreamPlan
    from rewriter.rename import replaced_views
    from rewriter.resolve_window import fixed_interval

    driver, plans = stored_plans(StreamPlan)  # type: ignore[type-abstract]
    for name, plan in plans.items():
        if not _adds_days(plan.create_statements):
            continue
        archive = naming.serial_archive_table(name)
        made = view_tables_made(driver, plan)
        if isinstance(plan, SerialAggregatePlan) and not made:
            continue  # a top-N stream 0026 has not archived
        if made:  # not yet for one joined with tables: 0029 makes its view
            for statement in replaced_views(plan):
                driver.execute(statement)  # type: ignore[arg-type]
        if isinstance(plan, ParallelAggregatePlan) and _whole_days(plan.window_size_us):
            end = sql.SQL(fixed_interval(plan.window_size_us).sql("postgres"))
            driver.execute(
                sql.SQL(
                    "UPDATE {t} SET {end} = {start} + {size} "
                    "WHERE {end} IS DISTINCT FROM {start} + {size}"
                ).format(
                    t=sql.Identifier(naming.INTERNAL_SCHEMA, naming.consolidated_table(name)),
                    end=sql.Identifier(naming.WINDOW_END_COLUMN),
                    start=sql.Identifier(naming.WINDOW_START_COLUMN),
                    size=end,
                )
            )
        if isinstance(plan, SerialAggregatePlan):
            driver.execute(
                sql.SQL(
                    "INSERT INTO {c} (stream, window_start, late_rows, noted_at) "
                    "SELECT DISTINCT %s, {w}, 0, now() FROM {t} "
                    "ON CONFLICT (stream, window_start) DO NOTHING"
                ).format(
                    c=sql.Identifier(naming.CATALOG_SCHEMA, "corrections"),
                    w=sql.Identifier(naming.SERIAL_WINDOW_COLUMN),
                    t=sql.Identifier(naming.INTERNAL_SCHEMA, archive),
                ),
                (name,),
            )


def downgrade() -> None:
    """Nothing to undo: see the module's docstring."""
