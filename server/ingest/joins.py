"""What a batch of runs adds to a join stream, exactly once, whatever the order and lateness.

An inner join only grows: a combination of rows (one per input) belongs to it once all its
rows are committed, so it is produced by the commit of the last of its runs. A batch of
runs of raw stream S adds (the delta rule, inputs in order)

    Σ over the inputs i fed by S:  N_1 ⋈ … ⋈ N_(i-1) ⋈ Δ_i ⋈ O_(i+1) ⋈ … ⋈ O_n

where O is what an input's stream had committed, Δ the batch and N = O ∪ Δ (for an input
fed by another stream, N = O). Every combination with at least one row of the batch comes
from exactly one term: the one of its first input holding a batch row.

*Committed before* is checked, not assumed. ``probe`` reads the rows of the other inputs
and the commit versions of the joins' sources in one snapshot; the commit
(``lock_versions``) locks the version rows of every source of the batch's joins, in name
order, compares them with what the probe saw and, if a source committed in between,
raises so that the batch is computed again; then it bumps its own stream's version in the
same transaction as the rows. Two commits feeding one join are thus serialized on those
rows, and each either saw the other's rows or is recomputed: no combination is missed or
produced twice.

A probe reads only the rows that can match (the plan's probe links: equal keys, time
bands, the same window), starting from the batch and following the links from input to
input, so that a run a day late costs index look-ups, not a replay. The links only narrow
what is read; Spark evaluates the whole condition on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from psycopg import sql

from rewriter.naming import RUN_COLUMN, raw_archive_table
from rewriter.plan import JoinInput, JoinStreamPlan, ProbeKind, ProbeLink
from server import catalog
from server.ingest.archive import copy_out
from server.ingest.parse import arrow_schema

# An equality link with more distinct values than this reads by the other links alone: a
# literal array of that size costs more than it saves.
MAX_PROBE_VALUES = 200_000


@dataclass(frozen=True)
class JoinTerm:
    """One term of a batch's delta: input ``delta`` holds the batch's rows; ``rows`` are
    the committed rows read for every other input (and for the inputs before ``delta``
    fed by the batch's stream, which also get the batch's rows)."""

    delta: int
    rows: dict[int, pa.Table]


@dataclass(frozen=True)
class JoinProbes:
    """What a batch's joins were computed against: the terms per join stream, and the
    commit versions of the sources whose rows the terms read."""

    terms: dict[str, list[JoinTerm]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.terms)


def compared_sources(joins: list[JoinStreamPlan], stream: str) -> list[str]:
    """The sources whose commits a batch of ``stream`` must not miss: every other source of
    its joins, and ``stream`` itself where a join reads it twice."""
    sources: dict[str, None] = {}
    for plan in joins:
        for source in plan.raw_sources:
            if source != stream or len(plan.positions(stream)) > 1:
                sources[source] = None
    return sorted(sources)


def probe(
    connection: sa.Connection, joins: list[JoinStreamPlan], stream: str, batch: pa.Table
) -> JoinProbes:
    """Read, in one snapshot (the caller's REPEATABLE READ transaction), the versions of the
    joins' sources and the rows of the other inputs that the batch's rows can match."""
    names = sorted({s for plan in joins for s in plan.raw_sources})
    versions = read_versions(connection, names)
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    terms = {
        plan.name: [_term(cursor, plan, delta, stream, batch) for delta in plan.positions(stream)]
        for plan in joins
    }
    return JoinProbes(terms, {s: versions.get(s, 0) for s in compared_sources(joins, stream)})


def read_versions(
    connection: sa.Connection, sources: list[str], *, lock: bool = False
) -> dict[str, int]:
    table = catalog.source_versions
    query = (
        sa.select(table.c.stream, table.c.version)
        .where(table.c.stream.in_(sources))
        .order_by(table.c.stream)
    )
    if lock:
        query = query.with_for_update()
    return {row.stream: row.version for row in connection.execute(query)}


def lock_versions(
    connection: sa.Connection, joins: list[JoinStreamPlan], stream: str, seen: dict[str, int]
) -> bool:
    """In a batch's commit transaction: lock the version rows of the joins' sources; False
    if a source the batch's probe read has committed since (the batch must be computed
    again), else bump ``stream``'s version and return True."""
    names = sorted({s for plan in joins for s in plan.raw_sources} | {stream})
    current = read_versions(connection, names, lock=True)
    if any(current.get(source, 0) != version for source, version in seen.items()):
        return False
    table = catalog.source_versions
    connection.execute(
        sa.update(table).where(table.c.stream == stream).values(version=table.c.version + 1)
    )
    return True


def _term(
    cursor: object, plan: JoinStreamPlan, delta: int, stream: str, batch: pa.Table
) -> JoinTerm:
    """Probe the committed rows of every input but ``delta``, following the links outward
    from the inputs whose rows are known (the batch's) to those they restrict."""
    known: dict[int, pa.Table] = {delta: batch}
    rows: dict[int, pa.Table] = {}
    while len(known) < len(plan.inputs):
        target = _next_input(plan, known)
        read = _read(cursor, plan.inputs[target], _conditions(plan, target, known))
        rows[target] = read
        if target < delta and plan.inputs[target].source == stream:
            read = pa.concat_tables([read, batch.select(read.column_names)])
        known[target] = read
    return JoinTerm(delta, rows)


def _next_input(plan: JoinStreamPlan, known: dict[int, pa.Table]) -> int:
    """The unread input with the most selective links from the inputs read: an equality
    first, then a band; an input no link reaches comes last (it is read whole)."""
    rank = {
        ProbeKind.EQUAL: 3,
        ProbeKind.SAME_WINDOW: 2,
        ProbeKind.AT_LEAST: 1,
        ProbeKind.AT_MOST: 1,
    }

    def score(position: int) -> int:
        return sum(
            rank[link.kind]
            for link in plan.links
            if link.target == position and link.bound in known
        )

    unread = [k for k in range(len(plan.inputs)) if k not in known]
    return max(unread, key=lambda k: (score(k), -k))


def _conditions(
    plan: JoinStreamPlan, target: int, known: dict[int, pa.Table]
) -> list[sql.Composable]:
    entry = plan.inputs[target]
    conditions: list[sql.Composable] = []
    if entry.filter_sql is not None:
        conditions.append(sql.SQL(entry.filter_sql))  # the rewriter's PostgreSQL, no input
    for link in plan.links:
        if link.target == target and link.bound in known:
            condition = _restriction(link, plan, known[link.bound])
            if condition is not None:
                conditions.append(condition)
    return conditions


def _restriction(link: ProbeLink, plan: JoinStreamPlan, bound: pa.Table) -> sql.Composable | None:
    column = sql.Identifier(link.column)
    values = bound.column(link.bound_column)
    if link.kind is ProbeKind.EQUAL:
        distinct = pc.unique(values.drop_null())
        if len(distinct) > MAX_PROBE_VALUES:
            return None
        if len(distinct) == 0:
            return sql.SQL("false")  # NULL keys match nothing
        # The values keep the bound column's type: the target column may be narrower
        # (integer = bigint), and PostgreSQL compares across the two.
        bound_type = next(
            c.type for c in plan.inputs[link.bound].columns if c.name == link.bound_column
        )
        array = sql.Literal(distinct.to_pylist())
        return sql.SQL("{} = ANY({}::{}[])").format(column, array, sql.SQL(bound_type.pg()))
    if values.null_count == len(values):
        return sql.SQL("false")  # NULL bounds match nothing
    shift = timedelta(microseconds=link.offset_us)
    if link.kind is ProbeKind.AT_LEAST:
        lowest = pc.min(values).as_py()
        return sql.SQL("{} >= {}").format(column, sql.Literal(_shifted(lowest, shift, link)))
    if link.kind is ProbeKind.AT_MOST:
        highest = pc.max(values).as_py()
        return sql.SQL("{} <= {}").format(column, sql.Literal(_shifted(highest, shift, link)))
    # SAME_WINDOW: the target's window starts among the bound rows' window starts (event
    # times are never NULL).
    target_us = plan.inputs[link.target].window_us
    bound_us = plan.inputs[link.bound].window_us
    assert target_us is not None and bound_us is not None
    micros = values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
    starts = micros - np.mod(micros, bound_us)
    low = int(starts.min())
    high = int(starts.max()) + target_us
    return sql.SQL("{} >= {} AND {} < {}").format(
        column, sql.Literal(_moment(low)), column, sql.Literal(_moment(high))
    )


def _shifted(value: object, shift: timedelta, link: ProbeLink) -> object:
    return value + shift if link.offset_us else value  # type: ignore[operator]


def _moment(micros: int) -> object:
    from server.ingest.progress import moment

    return moment(micros)


def _read(cursor: object, entry: JoinInput, conditions: list[sql.Composable]) -> pa.Table:
    schema = arrow_schema(entry.columns).append(pa.field(RUN_COLUMN, pa.int64()))
    return copy_out(
        cursor,  # type: ignore[arg-type]
        raw_archive_table(entry.source),
        schema,
        where=sql.SQL(" AND ").join(conditions) if conditions else None,
    )
