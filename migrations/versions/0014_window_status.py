"""Lateness and revisions readable over SQL: public.strata_window_status, for dashboards.

One row per window of every windowed aggregate stream (TUMBLE, HOP and serial streams):
the raw rows its runs brought, how many came late (behind the watermark), how often a
serial stream's archived window was repaired, when the window last changed, and whether
it is complete (every raw source's watermark has passed its end). A dashboard draws
"revised" markers and a "data complete up to" line from it, and a cache clears exactly
the windows that changed since it last looked. strata_reader may read it; it reads only
the catalog, as its owner.

New catalog tables: window_changes (rows, runs and last change per stream and pane,
written with each run's commit) and stream_windows (each windowed stream's window, the
stream whose panes place rows into it, and its raw sources). For the windows a database
had before this migration the rows are unknown: NULL, and the last change is the
migration's time.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"

STATUS_VIEW = """
CREATE OR REPLACE VIEW public.strata_window_status AS
WITH placed AS (
    SELECT s.stream, w.window_start, c.rows, c.last_changed_at, l.late_rows, l.last_late_at
      FROM strata_catalog.stream_windows s
      JOIN strata_catalog.window_changes c ON c.stream = s.placed_by
      LEFT JOIN strata_catalog.window_lateness l
             ON l.stream = c.stream AND l.window_start = c.window_start
     CROSS JOIN LATERAL public.strata_hop_windows(c.window_start, s.pane_us, s.slide_us,
                                                  s.size_us) AS w(window_start)
), windows AS (
    SELECT stream, window_start, sum(rows) AS rows, sum(late_rows) AS late_rows,
           greatest(max(last_changed_at), max(last_late_at)) AS last_changed_at
      FROM placed
     GROUP BY stream, window_start
), revised AS (
    SELECT r.stream, r.window_start, r.revisions, r.repaired_at
      FROM strata_catalog.window_revisions r
      JOIN strata_catalog.stream_windows s ON s.stream = r.stream
), known AS (
    SELECT coalesce(w.stream, r.stream) AS stream,
           coalesce(w.window_start, r.window_start) AS window_start,
           w.rows, w.late_rows, r.revisions,
           greatest(w.last_changed_at, r.repaired_at) AS last_changed_at
      FROM windows w
      FULL JOIN revised r ON r.stream = w.stream AND r.window_start = w.window_start
)
SELECT k.stream::text AS stream,
       k.window_start,
       k.window_start + s.size_us * interval '1 microsecond' AS window_end,
       k.rows::bigint AS rows,
       coalesce(k.late_rows, 0)::bigint AS late_rows,
       coalesce(k.revisions, 0)::bigint AS revisions,
       k.last_changed_at,
       coalesce((SELECT count(*) = cardinality(s.raw_sources)
                        AND bool_and(p.watermark >= k.window_start
                                                    + s.size_us * interval '1 microsecond')
                   FROM strata_catalog.stream_progress p
                  WHERE p.stream = ANY (s.raw_sources)), false) AS complete
  FROM known k
  JOIN strata_catalog.stream_windows s ON s.stream = k.stream
"""

COMMENTS = {
    None: "One row per window of every windowed aggregate stream: rows, late rows, "
    "revisions, last change and completeness (strata_catalog, as Strata keeps it).",
    "stream": "the stream (its view in public)",
    "window_start": "the window's start",
    "window_end": "the window's end",
    "rows": "raw rows the stream's runs brought into the window (NULL: archived before "
    "Strata kept this)",
    "late_rows": "of those, rows that arrived behind their raw stream's watermark",
    "revisions": "times a serial stream's archived window was repaired after late data",
    "last_changed_at": "when a run or a repair last changed the window",
    "complete": "every raw source's watermark has passed the window's end",
}


def upgrade() -> None:
    # IF NOT EXISTS: a database rewound to an earlier revision by hand meets them again.
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.window_changes (stream text NOT NULL, "
        "window_start timestamptz NOT NULL, rows bigint, runs bigint, "
        "last_changed_at timestamptz, PRIMARY KEY (stream, window_start))"
    )
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {CATALOG}.stream_windows (stream text PRIMARY KEY, "
        "size_us bigint NOT NULL, slide_us bigint NOT NULL, placed_by text, pane_us bigint, "
        "raw_sources text[] NOT NULL)"
    )
    _existing_streams()
    op.execute(STATUS_VIEW)
    _comment()
    op.execute("SELECT public.strata_grant_reader('public.strata_window_status'::regclass)")


def _comment() -> None:
    from psycopg import sql

    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    for column, text in COMMENTS.items():
        if column is None:
            target = sql.SQL("VIEW {}").format(sql.Identifier("public", "strata_window_status"))
        else:
            target = sql.SQL("COLUMN {}").format(
                sql.Identifier("public", "strata_window_status", column)
            )
        driver.execute(sql.SQL("COMMENT ON {} IS {}").format(target, sql.Literal(text)))


def _existing_streams() -> None:
    """stream_windows for the streams there are, and a row per window their partial
    archives hold (rows unknown)."""
    from psycopg import sql

    from rewriter.naming import INTERNAL_SCHEMA, partial_archive_table
    from server.catalog import PlanCache, record_windows

    connection = op.get_bind()
    plans = {n: r.plan for n, r in PlanCache().load(connection, versioned=False).items()}
    record_windows(connection, plans)
    placed = connection.execute(
        sa.text(
            f"SELECT DISTINCT placed_by FROM {CATALOG}.stream_windows WHERE placed_by IS NOT NULL"
        )
    ).scalars()
    driver = connection.connection.driver_connection
    assert driver is not None
    for stream in placed:
        driver.execute(
            sql.SQL(
                "INSERT INTO {changes} (stream, window_start, last_changed_at) "
                "SELECT DISTINCT {stream}, window_start, now() FROM {archive} "
                "ON CONFLICT DO NOTHING"
            ).format(
                changes=sql.Identifier(CATALOG, "window_changes"),
                stream=sql.Literal(stream),
                archive=sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(stream)),
            )
        )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS public.strata_window_status")
    op.drop_table("stream_windows", schema=CATALOG)
    op.drop_table("window_changes", schema=CATALOG)
