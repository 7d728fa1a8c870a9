"""ALTER STREAM: a version per stream, the definitions it had, and the changes in flight.

streams.version counts a stream's definitions (1 for every stream there is);
stream_history keeps each replaced definition with when it held; alters keeps, per
stream, its last ALTER: the new definition, the streams built beside it under other
names (the stream and every stream built on it) until they are swapped in, and whether
that happened.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(
        f"ALTER TABLE {CATALOG}.streams ADD COLUMN IF NOT EXISTS version integer NOT NULL DEFAULT 1"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.stream_history (stream text NOT NULL, "
        "version integer NOT NULL, sql text NOT NULL, defined_at timestamptz, "
        "replaced_at timestamptz NOT NULL, PRIMARY KEY (stream, version))"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.alters (stream text PRIMARY KEY, "
        "version integer NOT NULL, sql text NOT NULL, members jsonb NOT NULL, "
        "path text NOT NULL, state text NOT NULL, "
        "started_at timestamptz NOT NULL DEFAULT now(), swapped_at timestamptz)"
    )


def downgrade() -> None:
    # Streams being altered go back to their current definition: the streams built beside
    # them stay as streams of their own (named <name>__next), to be dropped by hand.
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.alters")
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.stream_history")
    op.execute(f"ALTER TABLE {CATALOG}.streams DROP COLUMN IF EXISTS version")
