"""The change feed (server/feed/): per followed stream, its positions, the rows as last
announced, and the changes retained.

feeds has a row per stream whose feed is on (from its first subscriber): the last
position given (taken under this row's lock, so positions follow commit order), the
positions retention dropped, and the stream's creation the rows below belong to.
feed_rows is the view as the feed has announced it (one row per identity, with the
window it is in and its revision count; a deleted row keeps its count, row NULL).
feed_changes holds each change once, by stream and position.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.feeds (stream text PRIMARY KEY, "
        "position bigint NOT NULL DEFAULT 0, pruned_through bigint NOT NULL DEFAULT 0, "
        "created_seq bigint, enabled_at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.feed_rows (stream text NOT NULL, "
        "identity text NOT NULL, win timestamptz, key jsonb NOT NULL, row jsonb, "
        "revision bigint NOT NULL, PRIMARY KEY (stream, identity))"
    )
    op.execute(f"CREATE INDEX IF NOT EXISTS feed_rows_win ON {CATALOG}.feed_rows (stream, win)")
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.feed_changes (stream text NOT NULL, "
        "position bigint NOT NULL, op text NOT NULL, key jsonb NOT NULL, old jsonb, new jsonb, "
        "late boolean NOT NULL, lateness_seconds double precision, revision bigint NOT NULL, "
        "cause text NOT NULL, runs text[], committed_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (stream, position))"
    )


def downgrade() -> None:
    for table in ("feed_changes", "feed_rows", "feeds"):
        op.execute(f"DROP TABLE IF EXISTS {CATALOG}.{table}")
