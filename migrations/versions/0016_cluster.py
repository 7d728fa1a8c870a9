"""A cluster of nodes (high availability): what each node keeps of the others.

runs.commit_pos orders the runs a node committed (each commit takes the next number, so a
peer pulls a node's runs in the order they became visible: server/replication/); a run
committed before this migration gets its position from its sequence number, so an
upgraded node offers its whole history to new peers.
cluster_state holds this node's incarnation (a fresh one per data directory) and the
position of the last stream DDL it applied from the DDL owner's log; ddl_log is that log
(kept by the owner only); stream_origins names, per stream, the DDL position of the
CREATE that made it, and runs.origin the same of the stream a run was posted to (runs of a
dropped and re-created stream never mix), and runs.digest the hash of a run's rows in a
cluster (the same run id with other rows elsewhere is a conflict); peer_cursors
says, per peer and incarnation of it, up to which of its commit positions this node has
every run; run_conflicts keeps each run id two nodes took with different rows (the digest
kept here and the peer's).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"


def upgrade() -> None:
    op.execute(f"CREATE SEQUENCE IF NOT EXISTS {CATALOG}.commit_pos")
    op.execute(f"ALTER TABLE {CATALOG}.runs ADD COLUMN IF NOT EXISTS commit_pos bigint")
    op.execute(f"ALTER TABLE {CATALOG}.runs ADD COLUMN IF NOT EXISTS origin bigint")
    op.execute(f"ALTER TABLE {CATALOG}.runs ADD COLUMN IF NOT EXISTS digest text")
    op.execute(
        f"UPDATE {CATALOG}.runs SET commit_pos = seq "
        "WHERE status = 'committed' AND commit_pos IS NULL"
    )
    op.execute(
        f"SELECT setval('{CATALOG}.commit_pos', "
        f"greatest((SELECT max(seq) FROM {CATALOG}.runs), 1))"
    )
    op.execute(
        f"CREATE UNIQUE INDEX IF NOT EXISTS runs_commit_pos ON {CATALOG}.runs (commit_pos)"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.cluster_state "
        "(key text PRIMARY KEY, value text NOT NULL)"
    )
    op.execute(
        f"INSERT INTO {CATALOG}.cluster_state VALUES ('incarnation', md5(random()::text || "
        "clock_timestamp()::text)), ('ddl_applied', '0') ON CONFLICT DO NOTHING"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.ddl_log (pos bigserial PRIMARY KEY, "
        "kind text NOT NULL, stream text NOT NULL, sql text NOT NULL, "
        "at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.stream_origins "
        "(stream text PRIMARY KEY, ddl_pos bigint NOT NULL)"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.peer_cursors (peer text NOT NULL, "
        "incarnation text NOT NULL, pos bigint NOT NULL, updated_at timestamptz NOT NULL "
        "DEFAULT now(), PRIMARY KEY (peer, incarnation))"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.run_conflicts (run_id text NOT NULL, "
        "peer text NOT NULL, kept text NOT NULL, other text NOT NULL, "
        "noted_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (run_id, peer))"
    )


def downgrade() -> None:
    for table in ("run_conflicts", "peer_cursors", "stream_origins", "ddl_log", "cluster_state"):
        op.execute(f"DROP TABLE IF EXISTS {CATALOG}.{table}")
    op.execute(f"DROP INDEX IF EXISTS {CATALOG}.runs_commit_pos")
    op.execute(f"ALTER TABLE {CATALOG}.runs DROP COLUMN IF EXISTS commit_pos")
    op.execute(f"ALTER TABLE {CATALOG}.runs DROP COLUMN IF EXISTS origin")
    op.execute(f"ALTER TABLE {CATALOG}.runs DROP COLUMN IF EXISTS digest")
    op.execute(f"DROP SEQUENCE IF EXISTS {CATALOG}.commit_pos")
