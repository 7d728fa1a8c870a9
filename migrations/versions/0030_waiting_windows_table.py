"""Aggregate streams list the windows whose partial rows wait for the reducer in a table
(strata_internal.waiting_windows), which a trigger on each partial archive fills in the
statement that adds the rows and the reducer's fold empties, where each view's function
found them by skipping through the partial archive's index a window at a time: with a
fifth of a day late (288 windows), 3.5 ms a call, two or three calls per read.

Upgrade: the table and the trigger function, each aggregate stream's windows listed from
its partial archive as it is, its trigger, and its function replaced (its view calls it
as before: the same columns, the same rows).

Downgrade: the functions that skip through the archive's index back, the triggers and
the table dropped.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

from pathlib import Path

from alembic import op
from psycopg import sql

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

FROZEN_SQL = Path(__file__).resolve().parent / "sql"


def upgrade() -> None:
    from migrations.plans import relation_exists, replace_views, stored_plans
    from rewriter import naming
    from rewriter.ddl import archive_oid, create_waiting_trigger, table
    from rewriter.plan import ParallelAggregatePlan

    op.execute((FROZEN_SQL / "0030_waiting_windows.sql").read_text())
    driver, plans = stored_plans(ParallelAggregatePlan)
    for name in plans:
        archive = table(naming.partial_archive_table(name))
        if not relation_exists(driver, archive.name):
            continue
        driver.execute(
            sql.SQL(
                "INSERT INTO {listed} ({a}, {c}) SELECT DISTINCT {oid}, {c} FROM {t} "
                "ON CONFLICT DO NOTHING"
            ).format(
                listed=sql.Identifier(naming.INTERNAL_SCHEMA, naming.WAITING_WINDOWS_TABLE),
                a=sql.Identifier(naming.WAITING_ARCHIVE_COLUMN),
                c=sql.Identifier(naming.WINDOW_START_COLUMN),
                oid=sql.SQL(archive_oid(archive).sql("postgres")),
                t=sql.Identifier(naming.INTERNAL_SCHEMA, archive.name),
            )
        )
        # Again, should the catalog's revision be older than its objects (re-runnable).
        driver.execute(_drop_trigger(archive.name))
        driver.execute(create_waiting_trigger(archive).encode())
    replace_views(ParallelAggregatePlan)


def downgrade() -> None:
    from migrations.plans import relation_exists, stored_plans
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    for name in plans:
        archive = naming.partial_archive_table(name)
        if not relation_exists(driver, archive):
            continue
        driver.execute(_drop_trigger(archive))
        driver.execute(_skip_scan_function(naming.waiting_windows_function(name), archive))
    driver.execute(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
            sql.Identifier(naming.INTERNAL_SCHEMA, naming.MARK_WAITING_FUNCTION)
        )
    )
    driver.execute(
        sql.SQL("DROP TABLE IF EXISTS {}").format(
            sql.Identifier(naming.INTERNAL_SCHEMA, naming.WAITING_WINDOWS_TABLE)
        )
    )


def _drop_trigger(archive: str) -> sql.Composed:
    from rewriter import naming

    return sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
        sql.Identifier(naming.WAITING_TRIGGER), sql.Identifier(naming.INTERNAL_SCHEMA, archive)
    )


def _skip_scan_function(name: str, archive: str) -> bytes:
    """The function as 0025 made it: the distinct window starts of the partial archive,
    found by skipping through its index one window at a time."""
    from rewriter import naming

    column = sql.Identifier(naming.WINDOW_START_COLUMN)
    first = sql.SQL("SELECT a.{c} FROM {t} AS a").format(
        c=column, t=sql.Identifier(naming.INTERNAL_SCHEMA, archive)
    )
    body = sql.SQL(
        "WITH RECURSIVE w(s) AS (({first} ORDER BY a.{c} LIMIT 1) UNION ALL SELECT ({first} "
        "WHERE a.{c} OPERATOR(pg_catalog.>) w.s ORDER BY a.{c} LIMIT 1) FROM w "
        "WHERE w.s IS NOT NULL) SELECT w.s FROM w WHERE w.s IS NOT NULL"
    ).format(first=first, c=column)
    return (
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {name}() RETURNS TABLE ({c} timestamptz) LANGUAGE sql "
            "STABLE PARALLEL SAFE SECURITY DEFINER ROWS 1 AS {body}"
        )
        .format(
            name=sql.Identifier(naming.INTERNAL_SCHEMA, name),
            c=column,
            body=sql.Literal(body.as_string()),
        )
        .as_string()
        .encode()
    )
