"""The PostgreSQL tables a stream joins, as the stream was planned against them.

A stream that joins a user's table is planned from the table's columns and primary key at
creation; the catalog keeps them with the stream, so that it plans the same at every start
whatever the table gained since. NULL for every stream that joins no table (all streams of
earlier versions).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.add_column(
        "streams",
        sa.Column(
            "tables",
            postgresql.JSONB,
            nullable=True,
            comment="the joined tables' columns and primary keys, as planned",
        ),
        schema=CATALOG,
    )


def downgrade() -> None:
    op.drop_column("streams", "tables", schema=CATALOG)
