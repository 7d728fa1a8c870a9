"""Serial (SP) streams kept in an archive: materialized when their windows close, repaired
after late data (seeds/003).

A serial stream's view reads its archive for the windows materialized and not awaiting
repair, and computes every other window on read from the consolidated source (see
rewriter/build_serial.py), so what the workers do never changes a view's result:

- The *materializer* advances ``serial_progress.materialized_until`` window by window once
  the watermarks of the raw sources have passed the windows' ends, writing each window's
  rows in the same transaction.
- A run committing rows into windows already materialized records them in
  ``corrections`` inside the run's own commit transaction (see ``record_corrections``),
  for every serial stream the rows reach, however many streams lie between.
- The *repairer* recomputes exactly the corrected windows, counts a revision for each in
  ``window_revisions``, and strikes the corrections off, in one transaction.

Locks keep the three consistent: the materializer holds the stream's ``serial_progress``
row FOR UPDATE before it reads the source; a commit reads the row FOR SHARE, so it either
commits before the materializer reads (its rows are in the window) or sees the new bound
(and records a correction). The materializer inserts the row the first time, and then
waits for the commits in flight into the raw sources (they found no row to lock). The
repairer locks the correction rows it repairs; a commit adding to one of them waits, and
records it again after the repair.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from rewriter import naming
from rewriter.plan import (
    JoinStreamPlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
)
from server import catalog, faults, feed
from server.catalog import ComputedPlan, PlanCache, StreamRecord, lineage, row_source
from server.ingest.progress import micros, moment
from server.metrics import Metrics
from server.settings import DEFAULTS
from server.workers.loop import Worker


def serial_streams(records: dict[str, StreamRecord], source: str) -> list[SerialAggregatePlan]:
    """Serial streams whose rows come from the stream ``source`` (a raw stream, or a join
    stream: the rows it adds), however many streams lie between, in creation order."""
    return [
        r.plan
        for r in records.values()
        if isinstance(r.plan, SerialAggregatePlan) and row_source(records, r.plan).name == source
    ]


def window_starts(times: np.ndarray, chain: list[ComputedPlan]) -> np.ndarray:
    """The windows of the last stream in ``chain`` (raw side first) that rows with event
    times ``times`` (µs) fall in, one entry per row and window. Each stream places a row of
    its source by the start of the source's window."""
    for plan in chain:
        if isinstance(plan, ProjectionStreamPlan):
            continue  # a projection passes its source's event time through unchanged
        assert not isinstance(plan, JoinStreamPlan), "a lineage starts below a join"
        slide, size = plan.window_slide_us, plan.window_size_us
        first = times - np.mod(times, slide)
        times = np.concatenate([first - k * slide for k in range(size // slide)])
    return times


def record_corrections(
    connection: sa.Connection,
    records: dict[str, StreamRecord],
    raw: RawStreamPlan,
    data: pa.Table,
    joined: dict[str, pa.Table | None] | None = None,
) -> None:
    """In a run's commit transaction: note the materialized windows of serial streams that
    the committed rows ``data`` of ``raw`` change, and those that the rows the commit adds
    to join streams (``joined``, by join) change.

    An outer join's view also changes where a row of its preserved input arrives without
    a match (a NULL-padded row appears) or a late match arrives (the padded row goes): the
    first is the preserved row's event time, the second the new pair's, which is the same.
    """
    joined = joined or {}
    plans = [(p, s) for s in (raw.name, *joined) for p in serial_streams(records, s)]
    if not plans or data.num_rows == 0:
        return
    progress = catalog.serial_progress
    bounds = {
        row.stream: row.materialized_until
        for row in connection.execute(
            sa.select(progress.c.stream, progress.c.materialized_until)
            .where(progress.c.stream.in_(sorted({p.name for p, _ in plans})))
            .order_by(progress.c.stream)
            .with_for_update(read=True)
        )
        if row.materialized_until is not None
    }
    if not bounds:
        return
    times: dict[str, np.ndarray] = {}
    corrections = []
    for plan, source in plans:
        until = bounds.get(plan.name)
        if until is None:
            continue
        if source not in times:
            times[source] = _source_times(records, raw, data, source, joined.get(source))
        rows = times[source]
        if rows.size == 0:
            continue
        starts = window_starts(rows, lineage(records, plan))
        starts = starts[starts < micros(until)]
        for start, count in zip(*np.unique(starts, return_counts=True), strict=True):
            corrections.append(
                {"stream": plan.name, "window_start": moment(int(start)), "late_rows": int(count)}
            )
    if not corrections:
        return
    table = catalog.corrections
    upsert = postgresql.insert(table).values(corrections)
    connection.execute(
        upsert.on_conflict_do_update(
            index_elements=[table.c.stream, table.c.window_start],
            set_={"late_rows": table.c.late_rows + upsert.excluded.late_rows},
        )
    )


def _source_times(
    records: dict[str, StreamRecord],
    raw: RawStreamPlan,
    data: pa.Table,
    source: str,
    rows: pa.Table | None,
) -> np.ndarray:
    """Event times (µs) of what the commit adds to ``source``: the raw rows ``data`` of
    ``raw``, or the rows ``rows`` it adds to the join ``source``, with, for an outer join,
    the preserved input's new rows."""
    if source == raw.name:
        return _micros(data, raw.event_time)
    join = records[source].plan
    assert isinstance(join, JoinStreamPlan)
    found = [_micros(rows, join.event_time)] if rows is not None else []
    for position in join.preserved:
        given = join.inputs[position]
        if position == join.event_time_input and given.source == raw.name:
            found.append(_input_times(join, _micros(data, given.event_time)))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _micros(data: pa.Table, column: str) -> np.ndarray:
    """Event times in µs, rows without one left out (an outer join's padded side)."""
    values = data[column].drop_null() if data.num_rows else data[column]
    return values.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _input_times(join: JoinStreamPlan, times: np.ndarray) -> np.ndarray:
    """The join's event times of rows of its event-time input with raw times ``times``."""
    given = join.inputs[join.event_time_input]
    if join.event_time_column == given.event_time or given.window_us is None:
        return times
    start = times - np.mod(times, given.window_us)
    if join.event_time_column == naming.WINDOW_START_COLUMN:
        return start
    return start + given.window_us


def _set(driver: object, name: str, value: str) -> None:
    driver.execute("SELECT set_config(%s, %s, true)", (name, value))  # type: ignore[attr-defined]


def _windows_literal(windows: list[datetime]) -> str:
    return "{" + ",".join(w.isoformat() for w in windows) + "}"


def _recompute(
    driver: object,
    plan: SerialAggregatePlan,
    windows: list[datetime],
    *,
    start: str = "infinity",
    end: str = "infinity",
) -> None:
    """Replace the archived rows of ``windows`` and of the windows starting in
    [``start``, ``end``) with their current results."""
    _set(driver, naming.SERIAL_WINDOWS_SETTING, _windows_literal(windows))
    _set(driver, naming.SERIAL_FROM_SETTING, start)
    _set(driver, naming.SERIAL_TO_SETTING, end)
    driver.execute(plan.serial.delete_statement)  # type: ignore[attr-defined]
    driver.execute(plan.serial.insert_statement)  # type: ignore[attr-defined]


class _SerialWorker(Worker):
    """A worker over serial streams; ``batch`` is the most windows one step handles."""

    def __init__(
        self,
        engine: sa.Engine,
        plans: PlanCache,
        *,
        interval: float = DEFAULTS.serial_interval,
        batch: int = 1000,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(engine, plans, interval=interval, batch=batch, metrics=metrics)

    def applies_to(self, plan: StreamPlan) -> bool:
        return isinstance(plan, SerialAggregatePlan)


class Materializer(_SerialWorker):
    """Writes the windows of serial streams into their archives once they are closed."""

    name = "materializer"

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, SerialAggregatePlan)
        progress = catalog.serial_progress
        with self.transaction() as connection:
            if not self.plans.hold(connection, plan):
                return 0
            first = connection.execute(
                postgresql.insert(progress)
                .values(stream=plan.name)
                .on_conflict_do_nothing()
                .returning(progress.c.stream)
            ).first()
            if first is not None:
                # A commit in flight found no row to lock, so it neither waits for this
                # transaction nor notes corrections: wait for those commits to be in. Later
                # ones find the row, and wait for it.
                catalog.lock_raw_archives(connection, plan.raw_sources)
            until = connection.execute(
                sa.select(progress.c.materialized_until)
                .where(progress.c.stream == plan.name)
                .with_for_update()
            ).scalar_one()
            closed = self._closed(connection, plan)
            if closed is None or (until is not None and until >= closed):
                return 0
            driver = connection.connection.driver_connection
            start = until.isoformat() if until else "-infinity"
            _set(driver, naming.SERIAL_FROM_SETTING, start)
            _set(driver, naming.SERIAL_TO_SETTING, closed.isoformat())
            _set(driver, naming.SERIAL_LIMIT_SETTING, str(self.batch))
            windows = [row[0] for row in driver.execute(plan.serial.windows_query)]  # type: ignore[union-attr]
            full = len(windows) >= self.batch
            reached = moment(micros(windows[-1]) + plan.window_size_us) if full else closed
            if windows:  # every window in [start, reached) with source rows: by range
                _recompute(driver, plan, [], start=start, end=reached.isoformat())
                faults.reach("materialize", [plan.name], windows=len(windows), until=reached)
            connection.execute(
                sa.update(progress)
                .where(progress.c.stream == plan.name)
                .values(
                    materialized_until=reached,
                    windows=progress.c.windows + len(windows),
                    updated_at=sa.func.now(),
                )
            )
            return len(windows)

    def _closed(self, connection: sa.Connection, plan: SerialAggregatePlan) -> datetime | None:
        """Start of the first window not closed yet: every window before it ended behind the
        watermarks of all raw sources, and no stream it reads is still back-filling."""
        records = self.plans.load(connection)
        names = [p.name for p in lineage(records, plan)]
        backfilling = connection.execute(
            sa.select(sa.func.count())
            .select_from(catalog.backfills)
            .where(catalog.backfills.c.stream.in_(names), catalog.backfills.c.finished_at.is_(None))
        ).scalar_one()
        if backfilling:
            return None
        marks = connection.execute(
            sa.select(catalog.stream_progress.c.watermark).where(
                catalog.stream_progress.c.stream.in_(plan.raw_sources)
            )
        ).scalars()
        known = [m for m in marks if m is not None]
        if len(known) < len(plan.raw_sources):
            return None
        bound = micros(min(known))
        return moment(bound - bound % plan.window_size_us)


class Repairer(_SerialWorker):
    """Recomputes the archived windows of serial streams that late data changed."""

    name = "repair"

    def step(self, plan: StreamPlan) -> int:
        assert isinstance(plan, SerialAggregatePlan)
        corrections, revisions = catalog.corrections, catalog.window_revisions
        with self.transaction() as connection:
            if not self.plans.hold(connection, plan):
                return 0
            windows = list(
                connection.execute(
                    sa.select(corrections.c.window_start)
                    .where(corrections.c.stream == plan.name)
                    .order_by(corrections.c.window_start)
                    .limit(self.batch)
                    .with_for_update()
                ).scalars()
            )
            if not windows:
                return 0
            _recompute(connection.connection.driver_connection, plan, windows)
            feed.record_repair(connection, plan, windows)
            upsert = postgresql.insert(revisions).values(
                [
                    {
                        "stream": plan.name,
                        "window_start": w,
                        "revisions": 1,
                        "repaired_at": sa.func.now(),
                    }
                    for w in windows
                ]
            )
            connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=[revisions.c.stream, revisions.c.window_start],
                    set_={"revisions": revisions.c.revisions + 1, "repaired_at": sa.func.now()},
                )
            )
            connection.execute(
                sa.delete(corrections).where(
                    corrections.c.stream == plan.name, corrections.c.window_start.in_(windows)
                )
            )
            faults.reach("repair", [plan.name], windows=windows)
            return len(windows)


def serial_state(connection: sa.Connection, name: str) -> dict[str, object]:
    """What GET /streams/{name} shows about a serial stream's archive and its repairs."""
    progress = connection.execute(
        sa.select(catalog.serial_progress).where(catalog.serial_progress.c.stream == name)
    ).first()
    pending = connection.execute(
        sa.select(
            sa.func.count(), sa.func.coalesce(sa.func.sum(catalog.corrections.c.late_rows), 0)
        ).where(catalog.corrections.c.stream == name)
    ).one()
    revisions = catalog.window_revisions
    revised = connection.execute(
        sa.select(
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(revisions.c.revisions), 0),
            sa.func.max(revisions.c.repaired_at),
        ).where(revisions.c.stream == name)
    ).one()
    until = progress.materialized_until if progress else None
    return {
        "materialized_until": until.isoformat() if until else None,
        "windows_materialized": progress.windows if progress else 0,
        "windows_awaiting_repair": int(pending[0]),
        "late_rows_awaiting_repair": int(pending[1]),
        "windows_revised": int(revised[0]),
        "revisions": int(revised[1]),
        "last_repaired_at": revised[2].isoformat() if revised[2] else None,
    }
