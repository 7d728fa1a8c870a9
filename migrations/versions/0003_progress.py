"""Progress indicators: a watermark per raw stream, and late data counted per stream and
per window of each parallel stream.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.create_table(
        "stream_progress",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "watermark",
            sa.DateTime(timezone=True),
            comment="latest event time committed, minus the stream's delay",
        ),
        sa.Column("rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("runs", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("late_rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("late_runs", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("max_lateness", sa.Interval, comment="how far behind the watermark a row came"),
        sa.Column("last_late_at", sa.DateTime(timezone=True)),
        schema=CATALOG,
    )
    op.create_table(
        "window_lateness",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("window_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("late_rows", sa.BigInteger, nullable=False),
        sa.Column("late_runs", sa.BigInteger, nullable=False),
        sa.Column("last_late_at", sa.DateTime(timezone=True), nullable=False),
        schema=CATALOG,
    )


def downgrade() -> None:
    op.drop_table("window_lateness", schema=CATALOG)
    op.drop_table("stream_progress", schema=CATALOG)
