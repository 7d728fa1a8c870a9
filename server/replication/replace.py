"""A run id two nodes took with other rows (a conflict, node.py) ends with the same rows on
every node: a node holding rows other than the cluster's choice (the smallest digest)
takes the chosen rows from a peer and puts them in place of its own, with everything
computed from them, in one transaction.

Partial rows are folded across runs by the reducer, and a join's rows pair a run's rows
with other runs', so one run's part of them cannot be taken out alone: every join and
aggregate computed from the run's raw stream is computed again from the archives, the
run's new rows in place of the old, under locks that hold back the runs of every source
involved (reads go on) and the reducers.
Readers see the old rows with everything computed from them, or the new rows with theirs,
never a mix. Serial windows the two bodies touch are noted for repair, as a commit notes
them. The run takes a new place in this node's commit log with its new digest, so peers
that took the old rows from this node see the choice too.

Not replaced, with the reason kept for GET /runs/{id} (the conflict stays reported): a run
of a raw stream with a retention (its archive no longer holds all its history). A
back-fill or an ALTER under way over the stream only defers the replacement. The work is
that of computing the streams over the whole archive again: a conflict is rare (one run
id given two bodies), and one run's part of them cannot be taken out alone.
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
    join_archive_table,
    join_view,
    joined_seen_table,
    joined_table,
    partial_archive_table,
    raw_archive_table,
)
from rewriter.plan import JoinStreamPlan, ParallelAggregatePlan, RawStreamPlan
from server import catalog, faults, feed
from server.catalog import ComputedPlan, PlanCache, StreamRecord
from server.engines.backend import SparkBackend
from server.ingest.archive import copy_in, copy_out, internal_table
from server.ingest.parse import arrow_schema
from server.ingest.progress import record_changes
from server.settings import DEFAULTS
from server.workers.reducer import lock_reducer
from server.workers.serial import record_corrections

log = logging.getLogger("strata.cluster")


class Unreplaceable(Exception):
    """The rows of a run cannot be replaced on this node (the reason is the message)."""


def replace_rows(
    engine: sa.Engine,
    plans: PlanCache,
    backend: SparkBackend,
    run_id: str,
    body: pa.Table,
    chosen: str,
    *,
    feed_retention: float = DEFAULTS.feed_retention,
) -> bool:
    """Put ``body`` (rows of digest ``chosen``) in place of the rows this node holds of
    committed run ``run_id``, and everything computed from them; True once done (or if
    the run already holds them), False to try again later (the run not committed yet, a
    back-fill under way). Raises Unreplaceable. The changes of followed views go to their
    change feeds (server/feed/) with the cause ``replace``."""
    runs = catalog.runs
    with engine.begin() as connection:
        record = connection.execute(
            sa.select(runs.c.seq, runs.c.stream, runs.c.status, runs.c.digest)
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
        if raw.retention_us:
            raise Unreplaceable(
                f"stream {raw.name!r} has a retention: its raw archive no longer holds the "
                "history the streams computed from it would be computed again from"
            )
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        cursor = driver.cursor()
        # Runs of the stream commit under ROW EXCLUSIVE (ingest/pipeline.py): none now,
        # nor runs of the other sources of the streams computed from it.
        cursor.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                internal_table(raw_archive_table(raw.name))
            )
        )
        dependents = catalog.dependents(records, raw.name)
        others = sorted({s for p in dependents for s in p.raw_sources} - {raw.name})
        catalog.lock_raw_archives(connection, others)
        aggregates = [p for p in dependents if isinstance(p, ParallelAggregatePlan)]
        for plan in sorted(aggregates, key=lambda p: p.name):
            lock_reducer(connection, plan.name)
        if _backfilling(connection, [p.name for p in aggregates]):
            return False
        schema = _schema(raw)
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
        both = pa.concat_tables([old, new])
        with feed.recording(
            connection, records, raw, both, [run_id], retention=feed_retention, cause="replace"
        ):
            joined = _join_again(connection, cursor, raw, dependents)
            partials = _partials(cursor, records, backend, raw, dependents)
            for plan in aggregates:
                _clear(cursor, plan)
                copy_in(cursor, partial_archive_table(plan.name), partials[plan.name])
            windowed = [p for p in aggregates if not catalog.through_join(records, p)]
            record_changes(
                connection,
                windowed,
                both[raw.event_time].cast(pa.int64()).to_numpy(),
                np.full(both.num_rows, record.seq),
            )
            record_corrections(connection, records, raw, both, dict(joined))
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
        faults.reach("replace_rows", [run_id], rows=sum(t.num_rows for t in partials.values()))
    log.warning(
        "run %s: its %d rows here replaced by the %d rows of digest %s the cluster chose; "
        "%d joins and %d aggregates computed again",
        run_id,
        old.num_rows,
        new.num_rows,
        chosen[:12],
        len(joined),
        len(aggregates),
    )
    return True


def _schema(plan: RawStreamPlan | JoinStreamPlan) -> pa.Schema:
    """The archived rows of a raw or join stream, with their run."""
    return arrow_schema(plan.columns).append(pa.field(RUN_COLUMN, pa.int64()))


def _join_again(
    connection: sa.Connection,
    cursor: psycopg.Cursor,
    raw: RawStreamPlan,
    dependents: list[ComputedPlan],
) -> dict[str, pa.Table]:
    """Every join computed from ``raw``'s runs, archived again over the rows archived now
    (as when it was created); by join, its rows before and after, for the serial streams
    over it to repair their windows. A batch of another source probed ``raw``'s old rows
    must be computed again: ``raw``'s version moves on (ingest/joins.py)."""
    joins = [p for p in dependents if isinstance(p, JoinStreamPlan)]
    if not joins:
        return {}
    versions = catalog.source_versions
    connection.execute(
        sa.update(versions)
        .where(versions.c.stream == raw.name)
        .values(version=versions.c.version + 1)
    )
    catalog.execute_plan_sql(connection, "SET LOCAL TIME ZONE 'UTC'")
    changed = {}
    for join in joins:
        archive = join_archive_table(join.name)
        before = copy_out(cursor, archive, _schema(join))
        cursor.execute(sql.SQL("DELETE FROM {}").format(internal_table(archive)))
        catalog.execute_plan_sql(connection, join.history_statement)
        changed[join.name] = pa.concat_tables([before, copy_out(cursor, archive, _schema(join))])
    return changed


def _partials(
    cursor: psycopg.Cursor,
    records: dict[str, StreamRecord],
    backend: SparkBackend,
    raw: RawStreamPlan,
    dependents: list[ComputedPlan],
) -> dict[str, pa.Table]:
    """The partial rows of every aggregate computed from ``raw``'s runs, over everything
    archived now: from each raw source's rows (a stream over several, UNION ALL, has
    some from each), or from the join's rows it reads."""
    wanted = {p.name for p in dependents if isinstance(p, ParallelAggregatePlan)}
    found: dict[str, list[pa.Table]] = {name: [] for name in wanted}
    direct: list[ComputedPlan] = [
        p
        for p in dependents
        if not (isinstance(p, ParallelAggregatePlan) and catalog.through_join(records, p))
        and not isinstance(p, JoinStreamPlan)
    ]
    for source in sorted({s for p in direct for s in p.raw_sources}):
        plan = records[source].plan
        assert isinstance(plan, RawStreamPlan)
        feeds = [p for p in catalog.dependents(records, source) if p in direct]
        if not any(isinstance(p, ParallelAggregatePlan) for p in feeds):
            continue
        rows = copy_out(cursor, raw_archive_table(source), _schema(plan))
        for name, table in backend.partials(rows, feeds, source=source).items():
            if name in wanted:
                found[name].append(table)
    for plan in dependents:
        if not (isinstance(plan, ParallelAggregatePlan) and catalog.through_join(records, plan)):
            continue
        join = catalog.row_source(records, plan)
        assert isinstance(join, JoinStreamPlan)
        rows = copy_out(cursor, join_archive_table(join.name), _schema(join))
        chain = catalog.lineage(records, plan)
        computed = backend.partials(rows, chain, source=join.name, input_view=join_view(join.name))
        found[plan.name].append(computed[plan.name])
    return {
        name: pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        for name, tables in found.items()
    }


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
    """Empty the stream's partial archive and what the reducer folded from it (with the
    rows it kept joined with tables, and the versions they were joined at)."""
    for name in (
        partial_archive_table(plan.name),
        consolidated_table(plan.name),
        consolidated_states_table(plan.name),
        joined_table(plan.name),
        joined_seen_table(plan.name),
    ):
        cursor.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s",
            [INTERNAL_SCHEMA, name],
        )
        if cursor.fetchone() is not None:
            cursor.execute(sql.SQL("DELETE FROM {}").format(internal_table(name)))
