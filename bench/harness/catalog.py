"""Streams registered straight into a scratch database's catalog, as ``POST /streams`` would
register them, without a server: for benchmarks that fill the archives themselves."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from rewriter import rewrite
from rewriter.plan import StreamPlan


def register(conn: psycopg.Connection, streams: Mapping[str, str]) -> dict[str, StreamPlan]:
    """Plans each ``CREATE STREAM`` of ``streams`` (name -> SQL, in creation order), records
    it in the catalog and creates its PostgreSQL objects; returns the plans by name."""
    plans: dict[str, StreamPlan] = {}
    for seq, (name, statement) in enumerate(streams.items()):
        plan = rewrite(statement, plans)
        plans[name] = plan
        conn.execute(
            "INSERT INTO strata_catalog.streams (name, kind, sql, created_seq, created_at) "
            "VALUES (%s, %s, %s, %s, now())",
            (name, plan.kind, statement, seq),
        )
        for ddl in plan.create_statements:
            conn.execute(ddl)  # type: ignore[arg-type]  # may contain '%': no params
    return plans
