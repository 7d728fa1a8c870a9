"""Progress indicators: a watermark per raw stream and the late data behind it.

The watermark of a raw stream is the latest event time committed, minus the stream's
``delay``. A row whose event time is behind the watermark when its run commits is *late*:
it is archived and counted like any other row (nothing is ever dropped), and it is also
counted here, per raw stream and per window of every parallel stream fed by it, so that
users see how late their data is. Recorded in the run's own commit transaction.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import overload

import numpy as np
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY

from rewriter.naming import RUN_COLUMN
from rewriter.plan import ParallelAggregatePlan, RawStreamPlan
from server import catalog

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIMESTAMPTZ = sa.DateTime(timezone=True)


@overload
def micros(moment: datetime) -> int: ...
@overload
def micros(moment: None) -> None: ...
def micros(moment: datetime | None) -> int | None:
    return None if moment is None else (moment - EPOCH) // timedelta(microseconds=1)


def moment(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def record_progress(
    connection: sa.Connection,
    raw: RawStreamPlan,
    dependents: list[ParallelAggregatePlan],
    data: pa.Table,
    seqs: list[int],
) -> int:
    """Advance ``raw``'s watermark over the committed runs ``seqs`` (in order) and count the
    rows that came behind it; returns how many did."""
    progress = catalog.stream_progress
    connection.execute(postgresql.insert(progress).values(stream=raw.name).on_conflict_do_nothing())
    state = connection.execute(
        sa.select(progress.c.watermark, progress.c.max_lateness)
        .where(progress.c.stream == raw.name)
        .with_for_update()
    ).one()
    watermark = micros(state.watermark)
    max_lateness = state.max_lateness
    times = data[raw.event_time].cast(pa.int64()).to_numpy()
    runs = data[RUN_COLUMN].to_numpy()
    late_rows = late_runs = 0
    windows: Counter[tuple[str, int]] = Counter()
    window_runs: Counter[tuple[str, int]] = Counter()
    record_changes(connection, dependents, times, runs)
    for seq in sorted(seqs):
        run_times = times[runs == seq]
        if run_times.size == 0:
            continue
        if watermark is not None:
            late = run_times[run_times < watermark]
            if late.size:
                late_runs += 1
                late_rows += int(late.size)
                behind = timedelta(microseconds=int(watermark - late.min()))
                max_lateness = behind if max_lateness is None else max(max_lateness, behind)
                for plan in dependents:
                    # An aggregate without a window has one, at the epoch (pane 0).
                    placed = late - np.mod(late, plan.pane_us) if plan.pane_us else late * 0
                    starts, counts = np.unique(placed, return_counts=True)
                    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
                        windows[(plan.name, start)] += count
                        window_runs[(plan.name, start)] += 1
        newest = int(run_times.max()) - raw.delay_us
        watermark = newest if watermark is None else max(watermark, newest)
    connection.execute(
        sa.update(progress)
        .where(progress.c.stream == raw.name)
        .values(
            watermark=moment(watermark) if watermark is not None else None,
            rows=progress.c.rows + int(times.size),
            runs=progress.c.runs + len(seqs),
            late_rows=progress.c.late_rows + late_rows,
            late_runs=progress.c.late_runs + late_runs,
            max_lateness=max_lateness,
            last_late_at=sa.func.now() if late_rows else progress.c.last_late_at,
        )
    )
    if windows:
        _add_per_window(
            connection,
            catalog.window_lateness,
            {"late_rows": windows, "late_runs": window_runs},
            stamp="last_late_at",
        )
    return late_rows


def record_changes(
    connection: sa.Connection,
    plans: list[ParallelAggregatePlan],
    times: np.ndarray,
    run_of: np.ndarray,
) -> None:
    """Add the rows (event times ``times``, in microseconds, of the runs ``run_of``) a
    commit brings to each pane of each windowed stream of ``plans`` in window_changes."""
    rows: Counter[tuple[str, int]] = Counter()
    runs: Counter[tuple[str, int]] = Counter()
    # A batch holds a few runs: the panes of each, one at a time (np.unique over (pane,
    # run) pairs sorts them as rows, fifteen times slower).
    by_run = [run_of == run for run in np.unique(run_of)]
    for plan in plans:
        if not plan.pane_us:
            continue  # no window: nothing for strata_window_status
        panes = times - np.mod(times, plan.pane_us)
        for start, count in zip(*np.unique(panes, return_counts=True), strict=True):
            rows[(plan.name, int(start))] += int(count)
        for of_run in by_run if len(by_run) > 1 else [slice(None)]:
            for start in np.unique(panes[of_run]).tolist():
                runs[(plan.name, start)] += 1
    if not rows:
        return
    _add_per_window(
        connection, catalog.window_changes, {"rows": rows, "runs": runs}, stamp="last_changed_at"
    )


def _add_per_window(
    connection: sa.Connection,
    table: sa.Table,
    counts: dict[str, Counter[tuple[str, int]]],
    *,
    stamp: str,
) -> None:
    """Add ``counts`` (column -> (stream, window start) -> count) to ``table``'s rows, and
    set its ``stamp`` column to now, in one upsert. The rows go in as one array per column
    (unnest): a late run touches a row per window of a day, and a VALUES list of them
    took SQLAlchemy longer to compile than PostgreSQL to apply."""
    keys = sorted(next(iter(counts.values())))
    columns = list(counts)
    rows = (
        sa.func.unnest(
            sa.bindparam("streams", [stream for stream, _ in keys], type_=ARRAY(sa.Text)),
            sa.bindparam("starts", [moment(start) for _, start in keys], type_=ARRAY(TIMESTAMPTZ)),
            *[
                sa.bindparam(
                    f"counts_{column}", [counted[k] for k in keys], type_=ARRAY(sa.BigInteger)
                )
                for column, counted in counts.items()
            ],
        )
        .table_valued("stream", "window_start", *columns)
        .render_derived(name="arrived")
    )
    upsert = postgresql.insert(table).from_select(
        ["stream", "window_start", *columns, stamp],
        sa.select(rows.c.stream, rows.c.window_start, *[rows.c[c] for c in columns], sa.func.now()),
    )
    connection.execute(
        upsert.on_conflict_do_update(
            index_elements=[table.c.stream, table.c.window_start],
            set_={
                **{column: table.c[column] + upsert.excluded[column] for column in counts},
                stamp: sa.func.now(),
            },
        )
    )


def stream_progress(
    connection: sa.Connection, name: str, raw_source: str, *, late_rows_of: str | None = None
) -> dict[str, object]:
    """What GET /streams/{name} shows about event-time progress and late data; the late
    rows of a derived stream are counted per window of ``late_rows_of`` (the stream itself,
    or the stream a serial stream aggregates)."""
    progress = catalog.stream_progress
    state = connection.execute(sa.select(progress).where(progress.c.stream == raw_source)).first()
    shown: dict[str, object] = {
        "watermark": state.watermark.isoformat() if state and state.watermark else None,
    }
    if name == raw_source:
        return shown | {
            "rows": state.rows if state else 0,
            "runs": state.runs if state else 0,
            "late_rows": state.late_rows if state else 0,
            "late_runs": state.late_runs if state else 0,
            "max_lateness_seconds": (
                state.max_lateness.total_seconds() if state and state.max_lateness else None
            ),
            "last_late_at": (
                state.last_late_at.isoformat() if state and state.last_late_at else None
            ),
        }
    lateness = catalog.window_lateness
    counted = late_rows_of or name
    totals = connection.execute(
        sa.select(sa.func.coalesce(sa.func.sum(lateness.c.late_rows), 0), sa.func.count()).where(
            lateness.c.stream == counted
        )
    ).one()
    latest = connection.execute(
        sa.select(lateness.c.window_start, lateness.c.late_rows, lateness.c.late_runs)
        .where(lateness.c.stream == counted)
        .order_by(lateness.c.last_late_at.desc(), lateness.c.window_start.desc())
        .limit(10)
    ).all()
    return shown | {
        "late_rows": int(totals[0]),
        "late_windows": int(totals[1]),
        "latest_late_windows": [
            {
                "window_start": r.window_start.isoformat(),
                "late_rows": r.late_rows,
                "late_runs": r.late_runs,
            }
            for r in latest
        ],
    }
