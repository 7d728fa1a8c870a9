"""Sinks (server/sinks/): each sink's definition and what this server knows of its delivery.

sinks has a row per CREATE SINK: the stream it follows, its connector and options (the
target's URL with its password: the catalog schema is the owner's only), the statement as
written, and its delivery: the last position delivered as this server knows it (for a
webhook sink the position itself; for a PostgreSQL sink a copy of the one kept in the
target database, which is the one that counts), its state, the last error and how many
attempts in a row failed.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.sinks (name text PRIMARY KEY, "
        "stream text NOT NULL, connector text NOT NULL, options jsonb NOT NULL, "
        "sql text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), position bigint, "
        "state text NOT NULL DEFAULT 'starting', error text, failures integer NOT NULL "
        "DEFAULT 0, delivered_at timestamptz, failed_at timestamptz)"
    )
    op.execute(f"CREATE INDEX IF NOT EXISTS sinks_stream ON {CATALOG}.sinks (stream)")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.sinks")
