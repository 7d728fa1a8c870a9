"""Session streams over a raw stream get an index of its raw archive on their keys and
event time (rewriter/build_session.py): a dashboard's filter on a key (one campaign's
sessions) reads that key's raw rows as one range of it, where every raw row was scanned.

Plans are re-made from the streams' stored SQL, as at every start, and each session
stream's index statement runs (IF NOT EXISTS, as at CREATE STREAM): the index is built over
the rows the raw archive holds, and nothing else changes.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg
    from sqlglot import exp

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def _index_statements() -> tuple[psycopg.Connection, list[exp.Create]]:
    """The migration's connection and the CREATE INDEX statements of the on-read streams
    (only a session stream over a raw stream has one)."""
    from migrations.plans import index_statements, stored_plans
    from rewriter.plan import OnReadStreamPlan

    driver, plans = stored_plans(OnReadStreamPlan)
    return driver, [c for plan in plans.values() for c in index_statements(plan)]


def upgrade() -> None:
    driver, creates = _index_statements()
    for create in creates:
        create.set("exists", True)
        driver.execute(create.sql("postgres"))


def downgrade() -> None:
    """The indexes go: the previous release's plans do not name them, and its raw streams'
    ingest would keep paying for them; upgrading again builds them anew."""
    from psycopg import sql

    from rewriter import naming

    driver, creates = _index_statements()
    for create in creates:
        index = sql.Identifier(naming.INTERNAL_SCHEMA, create.this.name)
        driver.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(index))
