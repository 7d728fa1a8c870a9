"""Commit versions of raw streams, which serialize the commits that feed one join.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.create_table(
        "source_versions",
        sa.Column(
            "stream",
            sa.Text,
            sa.ForeignKey(f"{CATALOG}.streams.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "version",
            sa.BigInteger,
            nullable=False,
            server_default="0",
            comment="bumped by every commit of the stream's runs that feeds a join",
        ),
        schema=CATALOG,
    )


def downgrade() -> None:
    op.drop_table("source_versions", schema=CATALOG)
