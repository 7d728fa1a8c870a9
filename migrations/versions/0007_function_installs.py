"""Function installs: a fingerprint of sql/ each time the server installed its functions.

The server installs the PostgreSQL functions and aggregates of sql/ at every start, after
the migrations (server/catalog.py install_functions), so that a database migrated by an
earlier release gets the fixes made since. The latest fingerprint lets a start skip the
install when sql/ is what was installed last; the earlier ones say when functions changed.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.create_table(
        "function_installs",
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "sha256",
            sa.Text,
            nullable=False,
            comment="of the sql/ files installed: their names and contents, in order",
        ),
        sa.Column("installed_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        schema=CATALOG,
    )


def downgrade() -> None:
    op.drop_table("function_installs", schema=CATALOG)
