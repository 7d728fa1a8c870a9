"""The JSON description of a stream, including its rewrite (GET /streams/{name})."""

from __future__ import annotations

from rewriter.naming import (
    INTERNAL_SCHEMA,
    join_archive_table,
    partial_archive_table,
    raw_archive_table,
)
from rewriter.plan import (
    JoinStreamPlan,
    OnReadStreamPlan,
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    ReadJoinStreamPlan,
    ReadUnionStreamPlan,
)
from server.catalog import StreamRecord


def describe(record: StreamRecord, records: dict[str, StreamRecord]) -> dict[str, object]:
    plan = record.plan
    dependents = sorted(
        r.name
        for r in records.values()
        if not isinstance(r.plan, RawStreamPlan) and record.name in r.plan.dependencies
    )
    base: dict[str, object] = {
        "name": record.name,
        "kind": record.kind,
        "sql": record.sql,
        "version": record.version,
        "created_at": record.created_at.isoformat() if record.created_at else None,
        "dependents": dependents,
    }
    if isinstance(plan, RawStreamPlan):
        return base | {
            "columns": [{"name": c.name, "type": c.type.pg()} for c in plan.columns],
            "event_time": plan.event_time,
            "delay_seconds": plan.delay_us / 1_000_000,
            "retention_seconds": plan.retention_us / 1_000_000 or None,
            "archive_table": f"{INTERNAL_SCHEMA}.{raw_archive_table(plan.name)}",
        }
    if isinstance(plan, ProjectionStreamPlan):
        return base | {
            "sources": list(plan.raw_sources),
            "raw_sources": list(plan.raw_sources),
            "columns": [{"name": c.name, "type": c.type.pg()} for c in plan.shown],
            "event_time": plan.event_time,
            "parallelism": plan.parallelism.value,
            "parallelism_reason": plan.parallelism_reason,
            "rewrite": {
                "view_sql": plan.view_query,
                "branches": [
                    {"source": b.source, "spark_query": b.spark_query} for b in plan.branches
                ],
                "ddl": list(plan.create_statements),
            },
        }
    if isinstance(plan, JoinStreamPlan):
        return base | _join(plan)
    if isinstance(plan, ReadJoinStreamPlan):
        return base | {
            "sources": list(plan.sources),
            "raw_sources": list(plan.raw_sources),
            "columns": [{"name": c.name, "type": c.pg_type} for c in plan.columns],
            "event_time": plan.event_time,
            "parallelism": plan.parallelism.value,
            "parallelism_reason": plan.parallelism_reason,
            "join": {"tables": list(plan.tables), "strategy": "joined on read in PostgreSQL"},
            "rewrite": {"view_sql": plan.view_query, "ddl": list(plan.create_statements)},
        }
    if isinstance(plan, ReadUnionStreamPlan):
        return base | {
            "sources": list(plan.sources),
            "raw_sources": list(plan.raw_sources),
            "columns": [{"name": c.name, "type": c.pg_type} for c in plan.columns],
            "parallelism": plan.parallelism.value,
            "parallelism_reason": plan.parallelism_reason,
            "rewrite": {"view_sql": plan.view_query, "ddl": list(plan.create_statements)},
        }
    if isinstance(plan, OnReadStreamPlan):
        return base | {
            "source": plan.source,
            "raw_sources": list(plan.raw_sources),
            "window": plan.window,
            "columns": [{"name": c.name, "type": c.pg_type} for c in plan.columns],
            "parallelism": plan.parallelism.value,
            "parallelism_reason": plan.parallelism_reason,
            "rewrite": {"view_sql": plan.view_query, "ddl": list(plan.create_statements)},
        }
    rewrite: dict[str, object] = {"view_sql": plan.view_query, "ddl": list(plan.create_statements)}
    if isinstance(plan, ParallelAggregatePlan):
        rewrite |= {
            "partial_query": plan.partial_query,
            "partial_input": plan.partial_input,
            "partial_archive_table": f"{INTERNAL_SCHEMA}.{partial_archive_table(plan.name)}",
            "partial_columns": [{"name": n, "type": t} for n, t in plan.partial_columns],
            "reduce_query": plan.reduce_query,
        }
        if plan.tables:
            rewrite["tables"] = list(plan.tables)
    return base | {
        "source": plan.source,
        "raw_sources": list(plan.raw_sources),
        "window": plan.window,
        "columns": [{"name": c.name, "type": c.pg_type} for c in plan.outputs],
        "parallelism": plan.parallelism.value,
        "parallelism_reason": plan.parallelism_reason,
        "rewrite": rewrite,
    }


def _join(plan: JoinStreamPlan) -> dict[str, object]:
    """A join stream's plan: its inputs, how a batch reads the rows it can match, and
    where its rows go."""
    inputs = [
        {
            "alias": i.alias,
            "source": i.source,
            "window": None if i.window_us is None else f"TUMBLE, {i.window_us // 1_000_000} s",
            "filter": i.filter_sql,
        }
        for i in plan.inputs
    ]
    probes = [
        {
            "input": plan.inputs[link.target].alias,
            "column": link.column,
            "kind": link.kind.value,
            "from_input": plan.inputs[link.bound].alias,
            "from_column": link.bound_column,
            "offset_seconds": link.offset_us / 1_000_000,
        }
        for link in plan.links
    ]
    return {
        "sources": list(plan.raw_sources),
        "raw_sources": list(plan.raw_sources),
        "columns": [{"name": c.name, "type": c.type.pg()} for c in plan.shown],
        "event_time": plan.event_time,
        "parallelism": plan.parallelism.value,
        "parallelism_reason": plan.parallelism_reason,
        "join": {
            "inputs": inputs,
            "probes": probes,
            # Probe slices are small DataFrames: Spark broadcasts those under its
            # autoBroadcastJoinThreshold and shuffles larger ones.
            "strategy": "each batch reads from PostgreSQL only the rows of the other inputs "
            "its rows can match (by the probes, through indexes), and Spark joins them "
            "(broadcast hash join for slices under 10 MB, shuffle otherwise)",
            "archive_table": f"{INTERNAL_SCHEMA}.{join_archive_table(plan.name)}",
            # An outer join's view adds the unmatched rows of these inputs on read.
            "preserved": [plan.inputs[k].alias for k in plan.preserved],
        },
        "rewrite": {
            "view_sql": plan.view_query,
            "term_queries": list(plan.term_queries),
            "history_statement": plan.history_statement,
            "ddl": list(plan.create_statements),
        },
    }
