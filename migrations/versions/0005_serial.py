"""Serial streams materialized at window close, corrections for late data, revisions.

Revision ID: 0005
Revises: 0004
"""

from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"
# The SQL this migration ran when it was written, frozen: the migration builds the same
# schema whatever sql/ holds later.
FROZEN_SQL = Path(__file__).resolve().parent / "sql"


def _stream() -> sa.Column:
    return sa.Column(
        "stream",
        sa.Text,
        sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
        primary_key=True,
    )


def upgrade() -> None:
    op.create_table(
        "serial_progress",
        _stream(),
        sa.Column(
            "materialized_until",
            sa.DateTime(timezone=True),
            comment="windows starting before this are in the stream's archive",
        ),
        sa.Column("windows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True)),
        schema=CATALOG,
    )
    op.create_table(
        "corrections",
        _stream(),
        sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("late_rows", sa.BigInteger, nullable=False),
        sa.Column("noted_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        schema=CATALOG,
    )
    op.create_table(
        "window_revisions",
        _stream(),
        sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("revisions", sa.BigInteger, nullable=False),
        sa.Column("repaired_at", sa.DateTime(timezone=True)),
        schema=CATALOG,
    )
    op.execute((FROZEN_SQL / "0005_serial.sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS public.strata_serial_until(text)")
    op.execute("DROP FUNCTION IF EXISTS public.strata_serial_corrected(text)")
    op.drop_table("window_revisions", schema=CATALOG)
    op.drop_table("corrections", schema=CATALOG)
    op.drop_table("serial_progress", schema=CATALOG)
