"""Several Strata servers over one PostgreSQL (server/sharing/): who is alive, who runs which
background job, who finishes which run, and the bodies of runs not yet committed.

servers has a row per running server (a fresh id at every start), whose expires_at it
pushes forward while it lives; leases names, per background job, the server that runs it
and until when; runs.owner is the server that finishes a pending run (NULL: a server alone,
or a run from before); run_bodies holds a pending run's rows (its spool file's Parquet
bytes) where every server reaches them, written with the run's record and deleted by its
commit. All four stay empty or NULL on a server alone.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.servers (id text PRIMARY KEY, "
        "http text, started_at timestamptz NOT NULL DEFAULT now(), "
        "heartbeat_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL)"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.leases (job text PRIMARY KEY, holder text, "
        "taken_at timestamptz, expires_at timestamptz)"
    )
    op.execute(f"ALTER TABLE {CATALOG}.runs ADD COLUMN IF NOT EXISTS owner text")
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.run_bodies (seq bigint PRIMARY KEY "
        f"REFERENCES {CATALOG}.runs (seq) ON DELETE CASCADE, body bytea NOT NULL)"
    )


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.run_bodies")
    op.execute(f"ALTER TABLE {CATALOG}.runs DROP COLUMN IF EXISTS owner")
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.leases")
    op.execute(f"DROP TABLE IF EXISTS {CATALOG}.servers")
