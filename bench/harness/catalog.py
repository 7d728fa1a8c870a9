"""Streams registered straight into a scratch database's catalog, as ``POST /streams`` would
register them, without a server: for benchmarks that fill the archives themselves."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg.types.json import Jsonb

from rewriter import rewrite
from rewriter.plan import StreamPlan
from rewriter.tables import TableSchema


def register(
    conn: psycopg.Connection,
    streams: Mapping[str, str],
    tables: Mapping[str, TableSchema] | None = None,
) -> dict[str, StreamPlan]:
    """Plans each ``CREATE STREAM`` of ``streams`` (name -> SQL, in creation order), records
    it in the catalog and creates its PostgreSQL objects; returns the plans by name.
    ``tables``: the PostgreSQL tables the streams may join, recorded with every stream (the
    server records only those a stream joins; the others change nothing when the plans are
    made again from the catalog)."""
    plans: dict[str, StreamPlan] = {}
    stored = Jsonb([t.to_json() for t in tables.values()]) if tables else None
    for seq, (name, statement) in enumerate(streams.items()):
        plan = rewrite(statement, plans, tables)
        plans[name] = plan
        conn.execute(
            "INSERT INTO strata_catalog.streams (name, kind, sql, created_seq, created_at, "
            "tables) VALUES (%s, %s, %s, %s, now(), %s)",
            (name, plan.kind, statement, seq, stored),
        )
        for ddl in plan.create_statements:
            conn.execute(ddl)  # type: ignore[arg-type]  # may contain '%': no params
    return plans
