"""Catalog schema: streams, their columns and dependencies, runs; internal schema; SQL functions.

Revision ID: 0001
Revises:
"""

from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"
# The SQL this migration ran when it was written, frozen: the migration builds the same
# schema whatever sql/ holds later.
FROZEN_SQL = Path(__file__).resolve().parent / "sql"


def upgrade() -> None:
    op.execute('CREATE SCHEMA IF NOT EXISTS "strata_internal"')
    op.create_table(
        "streams",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("sql", sa.Text, nullable=False, comment="the user's original CREATE STREAM"),
        sa.Column("created_seq", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.CheckConstraint("kind IN ('raw', 'derived')", name="streams_kind"),
        schema=CATALOG,
    )
    op.create_table(
        "stream_columns",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("ordinal", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        schema=CATALOG,
    )
    op.create_table(
        "stream_dependencies",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "depends_on", sa.Text, sa.ForeignKey(f"{CATALOG}.streams.name"), primary_key=True
        ),
        schema=CATALOG,
    )
    op.create_table(
        "runs",
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("run_id", sa.Text, nullable=False, unique=True),
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("spool_path", sa.Text),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("committed_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('pending', 'committed', 'rejected')", name="runs_status"),
        schema=CATALOG,
    )
    op.create_index(
        "runs_pending",
        "runs",
        ["seq"],
        schema=CATALOG,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.execute((FROZEN_SQL / "0001_functions.sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS public.strata_window_start(timestamptz, bigint)")
    op.execute(
        "DROP FUNCTION IF EXISTS public.strata_hop_windows(timestamptz, bigint, bigint, bigint)"
    )
    for table in ("runs", "stream_dependencies", "stream_columns", "streams"):
        op.drop_table(table, schema=CATALOG)
