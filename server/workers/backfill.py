"""Back-fill ("nostalgia", seeds/003): a new parallel stream computed over the history its
raw sources already archived, in bounded chunks, while new runs keep flowing.

When the stream is created, the runs its sources had committed are listed in
``backfill_runs`` (under a SHARE lock, so no run commits meanwhile: every run committed
later carries the new stream itself). A chunk is a few of those runs: their raw rows are
read back, Spark computes the stream's partial rows (through the streams below it, for a
roll-up), and one transaction writes them and strikes the runs off the list. So no run is
counted twice or missed, and a crash at any point just redoes the chunk.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from rewriter.naming import (
    INTERNAL_SCHEMA,
    RUN_COLUMN,
    RUN_ROWS_VIEW,
    join_archive_table,
    join_view,
    made_with,
    partial_archive_table,
    raw_archive_table,
)
from rewriter.plan import JoinStreamPlan, ParallelAggregatePlan, RawStreamPlan, StreamPlan
from server import catalog, faults
from server.catalog import PlanCache
from server.engines.backend import SparkBackend
from server.ingest.archive import copy_in, copy_out
from server.ingest.parse import arrow_schema
from server.ingest.progress import record_changes
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.workers.loop import Worker


def plan_backfill(
    connection: sa.Connection, records: dict[str, catalog.StreamRecord], plan: ParallelAggregatePlan
) -> None:
    """List the committed runs of ``plan``'s raw sources (caller holds their SHARE locks),
    or, for a stream built on a join, the runs of the join's archived rows."""
    source = catalog.row_source(records, plan)
    if isinstance(source, JoinStreamPlan):
        joined = sa.table(
            join_archive_table(source.name), sa.column(RUN_COLUMN), schema=INTERNAL_SCHEMA
        )
        run = joined.c[RUN_COLUMN]
        pending = sa.select(
            sa.literal(plan.name), run, sa.literal(source.name), sa.func.count()
        ).group_by(run)
    else:
        runs = catalog.runs
        pending = (
            sa.select(sa.literal(plan.name), runs.c.seq, runs.c.stream, runs.c.rows)
            .where(runs.c.stream.in_(plan.raw_sources), runs.c.status == "committed")
            .where(runs.c.rows > 0)
        )
    connection.execute(
        sa.insert(catalog.backfill_runs).from_select(["stream", "run", "source", "rows"], pending)
    )
    total = connection.execute(
        sa.select(sa.func.coalesce(sa.func.sum(catalog.backfill_runs.c.rows), 0)).where(
            catalog.backfill_runs.c.stream == plan.name
        )
    ).scalar_one()
    connection.execute(
        sa.insert(catalog.backfills).values(
            stream=plan.name,
            total_rows=total,
            done_rows=0,
            finished_at=sa.func.now() if total == 0 else None,
        )
    )


class Backfiller(Worker):
    name = "backfill"

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        backend: SparkBackend,
        *,
        scratch: Path | None = None,
        chunk_rows: int = DEFAULTS.backfill_chunk_rows,
        interval: float = 0.5,
        metrics: Metrics | None = None,
    ) -> None:
        # A step handles at most one chunk; "batch" 1 makes the loop run it again at once.
        super().__init__(engine, plans, interval=interval, batch=1, metrics=metrics)
        self.backend = backend
        self.chunk_rows = chunk_rows
        # Where a chunk is written for local Spark to read as a file, which is far faster
        # than shipping the rows from the driver inside the tasks.
        self.scratch = scratch

    def applies_to(self, plan: StreamPlan) -> bool:
        return isinstance(plan, ParallelAggregatePlan)

    def start(
        self,
        lease: Callable[[], bool] | None = None,
        fence: Callable[[sa.Connection], bool] | None = None,
    ) -> None:
        if self.scratch is not None and self.scratch.exists():
            for leftover in self.scratch.glob("backfill-*.parquet"):  # from a crash
                leftover.unlink(missing_ok=True)
        super().start(lease, fence)

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, ParallelAggregatePlan)
        listed = catalog.backfill_runs
        with self.transaction() as connection:
            if not self.plans.hold(connection, plan):
                return 0
            candidates = connection.execute(
                sa.select(listed.c.run, listed.c.source, listed.c.rows)
                .where(listed.c.stream == plan.name)
                .order_by(listed.c.source, listed.c.run)
                .limit(1000)
                .with_for_update(skip_locked=True)
            ).all()
            if not candidates:
                return 0
            source = candidates[0].source
            chunk: list[int] = []
            rows = 0
            for run in candidates:
                if run.source != source or (chunk and rows + run.rows > self.chunk_rows):
                    break
                chunk.append(run.run)
                rows += run.rows
            records = self.plans.load(connection)
            rows_of = records[source].plan
            assert isinstance(rows_of, RawStreamPlan | JoinStreamPlan)
            cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
            schema = arrow_schema(rows_of.columns).append(pa.field(RUN_COLUMN, pa.int64()))
            if isinstance(rows_of, JoinStreamPlan):
                archive, view = join_archive_table(source), join_view(source)
            else:
                archive, view = raw_archive_table(source), RUN_ROWS_VIEW
            history = copy_out(cursor, archive, schema, runs=chunk)
            chain = catalog.lineage(records, plan)
            partial = self._partials(history, chain, source, view)[plan.name]
            copy_in(cursor, partial_archive_table(plan.name), partial)
            faults.reach("backfill_chunk", [plan.name], runs=chunk, rows=history.num_rows)
            if isinstance(rows_of, RawStreamPlan) and history.num_rows:
                # The history's rows per window, for strata_window_status (a stream through
                # a join places rows by the join's rows: not counted).
                record_changes(
                    connection,
                    [plan],
                    history[rows_of.event_time].cast(pa.int64()).to_numpy(),
                    history[RUN_COLUMN].to_numpy(),
                )
            connection.execute(
                sa.delete(listed).where(listed.c.stream == plan.name, listed.c.run.in_(chunk))
            )
            left = connection.execute(
                sa.select(sa.func.count()).where(listed.c.stream == plan.name)
            ).scalar_one()
            backfills = catalog.backfills
            connection.execute(
                sa.update(backfills)
                .where(backfills.c.stream == plan.name)
                .values(
                    done_rows=backfills.c.done_rows + history.num_rows,
                    # The wall clock, not the transaction's start: the chunk's own time counts.
                    finished_at=sa.func.clock_timestamp() if left == 0 else None,
                )
            )
        return 1

    def _partials(
        self, history: pa.Table, chain: list[catalog.ComputedPlan], source: str, view: str
    ) -> dict[str, pa.Table]:
        if self.scratch is None or not self.backend.reads_files or history.num_rows == 0:
            return self.backend.partials(history, chain, source=source, input_view=view)
        self.scratch.mkdir(parents=True, exist_ok=True)
        path = self.scratch / f"backfill-{uuid.uuid4().hex}.parquet"
        try:
            pq.write_table(history, path, compression="none")
            return self.backend.partials(
                history, chain, source=source, files=[str(path)], input_view=view
            )
        finally:
            path.unlink(missing_ok=True)


def backfill_progress(connection: sa.Connection, name: str) -> dict[str, object] | None:
    """Rows done and to do, rate and ETA of the back-fill of ``name`` and of the streams
    made with it (its view reads them: it is complete when they all are), summed, with
    each one's own under ``streams``; None if none of them had one."""
    backfills = catalog.backfills
    found = sa.select(backfills).where(backfills.c.stream.in_(with_made(connection, name)))
    states = {s.stream: s for s in connection.execute(found)}
    if not states:
        return None
    now: datetime = connection.execute(sa.select(sa.func.now())).scalar_one()
    running = [n for n, s in states.items() if s.finished_at is None]
    started = min(s.started_at for s in states.values())
    end = now if running else max(s.finished_at for s in states.values())
    done = sum(s.done_rows for s in states.values())
    total = sum(s.total_rows for s in states.values())
    rate = done / max((end - started).total_seconds(), 1e-6)
    return {
        "state": "running" if running else "done",
        "rows_done": done,
        "rows_total": total,
        "rows_per_second": round(rate),
        "eta_seconds": (round((total - done) / rate, 1) if rate else None) if running else 0,
        "started_at": started.isoformat(),
        "finished_at": None if running else end.isoformat(),
        "streams": {
            n: {
                "state": "running" if s.finished_at is None else "done",
                "rows_done": s.done_rows,
                "rows_total": s.total_rows,
            }
            for n, s in states.items()
        },
    }


def with_made(connection: sa.Connection, name: str) -> list[str]:
    """``name`` and the streams made with it (naming.made_with), at any depth."""
    names = connection.execute(sa.select(catalog.streams.c.name)).scalars().all()
    found, every = [name], [name]
    while found:
        found = [c for n in found for c in made_with(n, names)]
        every += found
    return every


def wait_for(engine: sa.Engine, name: str, timeout: float = 600) -> None:
    """Block until ``name``'s back-fill is done, and those of the streams made with it (a
    view over them is complete then), for callers that want it complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            progress = backfill_progress(connection, name)
        if progress is None or progress["state"] == "done":
            return
        time.sleep(0.1)
    raise TimeoutError(f"back-fill of {name!r} did not finish in {timeout} s")
