"""The JSON description of a stream, including its rewrite (GET /streams/{name})."""

from __future__ import annotations

from rewriter.naming import INTERNAL_SCHEMA, partial_archive_table, raw_archive_table
from rewriter.plan import DerivedStreamPlan, RawStreamPlan
from server.catalog import StreamRecord


def describe(record: StreamRecord, records: dict[str, StreamRecord]) -> dict[str, object]:
    plan = record.plan
    dependents = sorted(
        r.name
        for r in records.values()
        if isinstance(r.plan, DerivedStreamPlan) and record.name in r.plan.dependencies
    )
    base: dict[str, object] = {
        "name": record.name,
        "kind": record.kind,
        "sql": record.sql,
        "created_at": record.created_at.isoformat() if record.created_at else None,
        "dependents": dependents,
    }
    if isinstance(plan, RawStreamPlan):
        return base | {
            "columns": [{"name": c.name, "type": c.type.pg()} for c in plan.columns],
            "event_time": plan.event_time,
            "archive_table": f"{INTERNAL_SCHEMA}.{raw_archive_table(plan.name)}",
        }
    rewrite: dict[str, object] = {"view_sql": plan.view_query, "ddl": list(plan.create_statements)}
    if plan.is_parallel:
        rewrite |= {
            "partial_query": plan.partial_query,
            "partial_input": plan.partial_input,
            "partial_archive_table": f"{INTERNAL_SCHEMA}.{partial_archive_table(plan.name)}",
            "partial_columns": [{"name": n, "type": t} for n, t in plan.partial_columns],
            "reduce_query": plan.reduce_query,
        }
    return base | {
        "source": plan.source,
        "raw_source": plan.raw_source,
        "window": plan.window,
        "columns": [{"name": c.name, "type": c.pg_type} for c in plan.outputs],
        "parallelism": plan.parallelism,
        "parallelism_reason": plan.parallelism_reason,
        "rewrite": rewrite,
    }
