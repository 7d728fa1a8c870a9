"""Back-fill in bounded chunks: the runs each new stream still has to compute from history.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.create_table(
        "backfills",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("total_rows", sa.BigInteger, nullable=False),
        sa.Column("done_rows", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        schema=CATALOG,
    )
    op.create_table(
        "backfill_runs",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("run", sa.BigInteger, primary_key=True, comment="a committed run of a source"),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        schema=CATALOG,
    )


def downgrade() -> None:
    op.drop_table("backfill_runs", schema=CATALOG)
    op.drop_table("backfills", schema=CATALOG)
