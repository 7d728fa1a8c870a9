"""A run id two nodes took with other rows (a conflict, node.py) ends with the same rows on
every node: a node holding rows other than the cluster's choice (the smallest digest)
takes the chosen rows from a peer and puts them in place of its own, with everything
computed from them, in one transaction.

Partial rows are folded across runs by the reducer, so one run's part of them cannot be
taken out alone: every stream computed from the run's raw stream is computed again from
the raw archive, the run's new rows in place of the old, under an EXCLUSIVE lock on that
archive (no run of the stream commits meanwhile; reads go on) and the reducers' locks.
Readers see the old rows with everything computed from them, or the new rows with theirs,
never a mix. Serial windows the two bodies touch are noted for repair, as a commit notes
them. The run takes a new place in this node's commit log with its new digest, so peers
that took the old rows from this node see the choice too.

Not replaced, with the reason kept for GET /runs/{id} (the conflict stays reported): a raw
stream with a join computed from its runs, a stream computed from several raw streams, a
raw stream with retention (its archive no longer holds all its history). A back-fill or
an ALTER under way over the stream only defers the replacement.
"""

from __future__ import annotations

import logging

import numpy as np
import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql

from rewriter.naming import (
    CATALOG_SCHEMA,
    INTERNAL_SCHEMA,
    RUN_COLUMN,
    consolidated_states_table,
    consolidated_table,
    partial_archive_table,
    raw_archive_table,
)
from rewriter.plan import JoinStreamPlan, ParallelAggregatePlan, RawStreamPlan
from server import catalog, faults
from server.catalog import ComputedPlan, PlanCache, StreamRecord
from server.engines.backend import SparkBackend
from server.ingest.archive import copy_in, copy_out, internal_table
from server.ingest.parse import arrow_schema
from server.ingest.progress import record_changes
from server.workers.reducer import lock_reducer
from server.workers.serial import record_corrections

log = logging.getLogger("strata.cluster")


class Unreplaceable(Exception):
    """The rows of a run cannot be replaced on this node (the reason is the message)."""


def unreplaceable(
    records: dict[str, StreamRecord], raw: RawStreamPlan, dependents: list[ComputedPlan]
) -> str | None:
    """Why the rows of a run of ``raw`` cannot be replaced here, or None if they can."""
    if raw.retention_us:
        return (
            f"stream {raw.name!r} has a retention: its raw archive no longer holds the "
            "history the streams computed from it would be computed again from"
        )
    for plan in dependents:
        if isinstance(plan, JoinStreamPlan):
            return f"join stream {plan.name!r} is computed from the runs of {raw.name!r}"
        if len(plan.raw_sources) > 1:
            return f"stream {plan.name!r} is computed from several raw streams"
    return None


def replace_rows(
    engine: sa.Engine,
    plans: PlanCache,
    backend: SparkBackend,
    run_id: str,
    body: pa.Table,
    chosen: str,
) -> bool:
    """Put ``body`` (rows of digest ``chosen``) in place of the rows this node holds of
    committed run ``run_id``, and everything computed from them; True once done (or if
    the run already holds them), False to try again later (the run not committed yet, a
    back-fill under way). Raises Unreplaceable."""
    runs = catalog.runs
    with engine.begin() as connection:
        record = connection.execute(
            sa.select(runs.c.seq, runs.c.stream, runs.c.status, runs.c.rows, runs.c.digest)
            .where(runs.c.run_id == run_id)
            .with_for_update()
        ).first()
        if record is None or record.status != "committed":
            return False
        if record.digest == chosen:
            return True
        records = plans.load(connection)
        raw = records[record.stream].plan
        assert isinstance(raw, RawStreamPlan)
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        cursor = driver.cursor()
        # Runs of the stream commit under ROW EXCLUSIVE (ingest/pipeline.py): none now.
        cursor.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                internal_table(raw_archive_table(raw.name))
            )
        )
        dependents = catalog.dependents(records, raw.name)
        why = unreplaceable(records, raw, dependents)
        if why is not None:
            raise Unreplaceable(why)
        aggregates = [p for p in dependents if isinstance(p, ParallelAggregatePlan)]
        for plan in sorted(aggregates, key=lambda p: p.name):
            lock_reducer(connection, plan.name)
        if _backfilling(connection, [p.name for p in aggregates]):
            return False
        schema = arrow_schema(raw.columns).append(pa.field(RUN_COLUMN, pa.int64()))
        old = copy_out(cursor, raw_archive_table(raw.name), schema, [record.seq])
        columns = arrow_schema(raw.columns)
        new = _with_run(body.select(columns.names).cast(columns), record.seq)
        cursor.execute(
            sql.SQL("DELETE FROM {} WHERE {} = %s").format(
                internal_table(raw_archive_table(raw.name)), sql.Identifier(RUN_COLUMN)
            ),
            [record.seq],
        )
        copy_in(cursor, raw_archive_table(raw.name), new)
        history = copy_out(cursor, raw_archive_table(raw.name), schema)
        partials = backend.partials(history, dependents, source=raw.name)
        for plan in aggregates:
            _clear(cursor, plan)
            copy_in(cursor, partial_archive_table(plan.name), partials[plan.name])
        both = pa.concat_tables([old, new])
        record_changes(
            connection,
            aggregates,
            both[raw.event_time].cast(pa.int64()).to_numpy(),
            np.full(both.num_rows, record.seq),
        )
        record_corrections(connection, records, raw, both)
        progress = catalog.stream_progress
        connection.execute(
            sa.update(progress)
            .where(progress.c.stream == raw.name)
            .values(rows=progress.c.rows + new.num_rows - old.num_rows)
        )
        connection.execute(
            sa.update(runs)
            .where(runs.c.seq == record.seq)
            .values(
                rows=new.num_rows,
                digest=chosen,
                commit_pos=sa.func.nextval(f"{CATALOG_SCHEMA}.commit_pos"),
            )
        )
        faults.reach("replace_rows", [run_id], rows=history.num_rows)
    log.warning(
        "run %s: its %d rows here replaced by the %d rows of digest %s the cluster chose; "
        "%d streams computed again from %d rows",
        run_id,
        old.num_rows,
        new.num_rows,
        chosen[:12],
        len(aggregates),
        history.num_rows,
    )
    return True


def _with_run(table: pa.Table, seq: int) -> pa.Table:
    return table.append_column(RUN_COLUMN, pa.array(np.full(table.num_rows, seq), pa.int64()))


def _backfilling(connection: sa.Connection, names: list[str]) -> bool:
    listed = catalog.backfill_runs
    return bool(
        names
        and connection.execute(
            sa.select(sa.func.count()).where(listed.c.stream.in_(names))
        ).scalar_one()
    )


def _clear(cursor: psycopg.Cursor, plan: ParallelAggregatePlan) -> None:
    """Empty the stream's partial archive and what the reducer folded from it."""
    for name in (
        partial_archive_table(plan.name),
        consolidated_table(plan.name),
        consolidated_states_table(plan.name),
    ):
        cursor.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s",
            [INTERNAL_SCHEMA, name],
        )
        if cursor.fetchone() is not None:
            cursor.execute(sql.SQL("DELETE FROM {}").format(internal_table(name)))
