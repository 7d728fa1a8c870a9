"""The change feed follows streams that join PostgreSQL tables on read (server/feed/tables.py).

table_versions counts, per table such a followed stream joins (by oid), the statements
that changed it: a statement trigger on the table (sql/005_feed.sql) adds one in the
changing transaction. feeds.tables holds the oids a followed stream's view joins, and
feeds.tables_version the sum of their versions its announced rows reflect: when the sum
moves, the feed compares the whole view with them (cause ``table``). Both stay NULL for
streams that join no table, and for every feed of an earlier release (which refused those).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.table_versions (relation oid PRIMARY KEY, "
        "version bigint NOT NULL DEFAULT 0)"
    )
    op.execute(f"ALTER TABLE {CATALOG}.feeds ADD COLUMN IF NOT EXISTS tables oid[]")
    op.execute(f"ALTER TABLE {CATALOG}.feeds ADD COLUMN IF NOT EXISTS tables_version bigint")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {CATALOG}.feeds DROP COLUMN IF EXISTS tables_version")
    op.execute(f"ALTER TABLE {CATALOG}.feeds DROP COLUMN IF EXISTS tables")
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.table_versions")
