"""Recording a followed stream's changes inside the transactions that make them (see the
package docstring for the invariant): a run's commit (``recording``), a serial repair
(``record_repair``), an ALTER's swap (``follow_definitions``), and the start of a feed
(``follow``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql

from rewriter.naming import CATALOG_SCHEMA, PUBLIC_SCHEMA
from rewriter.plan import ParallelAggregatePlan, RawStreamPlan, SerialAggregatePlan, StreamPlan
from server import catalog, faults
from server.catalog import PlanCache, StreamRecord, lineage, through_join
from server.errors import NoFeed, Unavailable
from server.feed import tables
from server.ingest.progress import micros, moment
from server.workers import serial  # a module: serial repairs call back into this one

log = logging.getLogger(__name__)

FEEDS = sql.Identifier(CATALOG_SCHEMA, "feeds")
ROWS = sql.Identifier(CATALOG_SCHEMA, "feed_rows")
CHANGES = sql.Identifier(CATALOG_SCHEMA, "feed_changes")
STREAMS = sql.Identifier(CATALOG_SCHEMA, "streams")
PROGRESS = sql.Identifier(CATALOG_SCHEMA, "stream_progress")
BACKFILLS = sql.Identifier(CATALOG_SCHEMA, "backfills")

FollowedPlan = ParallelAggregatePlan | SerialAggregatePlan
# Retention is applied when a stream's position passes a multiple of this: a DELETE per
# commit would cost more than the rows it keeps.
PRUNE_EVERY = 256


def refusal(plan: StreamPlan) -> str | None:
    """Why the feed cannot follow ``plan``'s view, or None if it can."""
    if not isinstance(plan, FollowedPlan) or (
        isinstance(plan, SerialAggregatePlan) and plan.ranks_windows
    ):
        return (
            f"the change feed follows aggregate streams (CREATE STREAM ... AS SELECT ... "
            f"GROUP BY ...); {plan.name!r} is a {plan.kind} stream of another kind"
        )
    return None


@dataclass(frozen=True)
class ViewShape:
    """How the feed tells a stream's view rows apart: the column giving a row's window (if
    the view shows one) and the columns that identify a row (window first)."""

    stream: str
    window: str | None
    window_is_end: bool
    size_us: int
    keys: tuple[str, ...]

    @classmethod
    def of(cls, plan: FollowedPlan) -> ViewShape:
        windows = [o for o in plan.outputs if o.role in ("window_start", "window_end")]
        keys = [o.name for o in plan.outputs if o.role in ("key", "group")]
        first = windows[0] if windows else None
        return cls(
            stream=plan.name,
            window=first.name if first else None,
            window_is_end=first is not None and first.role == "window_end",
            size_us=plan.window_size_us,
            keys=tuple([o.name for o in windows] + keys),
        )

    def window_values(self, starts: np.ndarray) -> list[datetime]:
        """The values of the window column for windows starting at ``starts`` (µs)."""
        shift = self.size_us if self.window_is_end else 0
        return [moment(int(s) + shift) for s in np.unique(starts).tolist()]

    def window_end_us(self, value: datetime) -> int:
        return micros(value) + (0 if self.window_is_end else self.size_us)


@dataclass(frozen=True)
class Followed:
    """A followed stream's ``feeds`` row, locked: its last position and its creation."""

    stream: str
    position: int
    pruned_through: int
    created_seq: int | None
    current_seq: int
    version: int
    # The oids of the tables its view joins on read, and the sum of their versions its
    # announced rows hold (server/feed/tables.py); None where it joins none.
    tables: list[int] | None
    tables_version: int | None
    # A stream back-filling (created again under a followed name) changes its view with
    # every chunk, unannounced: it is left alone until done, then announced whole.
    backfilling: bool = False


def _driver(connection: sa.Connection) -> psycopg.Connection[Any]:
    driver = connection.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def _followed_names(driver: psycopg.Connection[Any], names: list[str]) -> list[str]:
    query = sql.SQL("SELECT stream FROM {} WHERE stream = ANY(%s) ORDER BY stream").format(FEEDS)
    return [row[0] for row in driver.execute(query, (names,))]


def _lock(driver: psycopg.Connection[Any], names: list[str] | None) -> dict[str, Followed]:
    """Lock the ``feeds`` rows of the streams ``names`` (None: all), in name order, and
    read them with their stream's current creation."""
    query = sql.SQL(
        "SELECT f.stream, f.position, f.pruned_through, f.created_seq, s.created_seq, "
        "s.version, f.tables, f.tables_version, EXISTS (SELECT FROM {} b "
        "WHERE b.stream = f.stream "
        "AND b.finished_at IS NULL) FROM {} f JOIN {} s ON s.name = f.stream {} "
        "ORDER BY f.stream FOR UPDATE OF f"
    ).format(
        BACKFILLS,
        FEEDS,
        STREAMS,
        sql.SQL("WHERE f.stream = ANY(%s)") if names is not None else sql.SQL(""),
    )
    rows = driver.execute(query, (names,) if names is not None else None).fetchall()
    return {row[0]: Followed(*row) for row in rows}


def _current(shape: ViewShape, windowed: bool, outside: bool) -> sql.Composed:
    """CTEs ``viewed`` and ``now``: the view's rows (of %(windows)s or all, or of the
    others) by identity - their key, or where two rows share a key (the view does not show
    every group column) the key and the row - as jsonb, with their window."""
    window = sql.Identifier(shape.window) if shape.window else None
    match = sql.SQL("<> ALL" if outside else "= ANY")
    return sql.SQL(
        "viewed AS (SELECT {key} AS key, to_jsonb(v.*) AS row, {win} AS win "
        "FROM {view} AS v {view_where}), "
        "now AS (SELECT key, row, win, CASE WHEN count(*) OVER (PARTITION BY key) = 1 "
        "THEN key::text ELSE key::text || chr(31) || row::text END AS identity FROM viewed)"
    ).format(
        key=sql.SQL("jsonb_build_object({})").format(
            sql.SQL(", ").join(
                sql.SQL("{}, v.{}").format(sql.Literal(k), sql.Identifier(k)) for k in shape.keys
            )
        ),
        win=sql.SQL("v.{}").format(window) if window else sql.SQL("NULL::timestamptz"),
        view=sql.Identifier(PUBLIC_SCHEMA, shape.stream),
        view_where=(
            sql.SQL("WHERE v.{} {} (%(windows)s)").format(window, match)
            if windowed and window
            else sql.SQL("")
        ),
    )


@dataclass(frozen=True)
class _Cause:
    """What made the changes: ``name`` (run, repair, alter, create, table), the runs committed and
    the watermark of the raw stream they came to before they did (µs; lateness)."""

    name: str
    runs: tuple[str, ...] = ()
    watermark: int | None = None
    late: bool = False  # every change of this cause is late (a repair)


def _announce(
    driver: psycopg.Connection[Any],
    followed: Followed,
    shape: ViewShape,
    windows: list[datetime] | None,
    cause: _Cause,
    outside: bool = False,
) -> Followed:
    """Append the differences between the view and the announced rows (of ``windows``,
    or all; ``outside``: of the other windows) as changes after ``followed``'s position,
    and announce the view's rows: one statement (``_diff``), so that a commit touching
    thousands of rows neither parses nor sends them one by one."""
    run = cause.name == "run" and shape.window is not None
    params: dict[str, object] = {
        "stream": shape.stream,
        "windows": windows,
        "base": followed.position,
        "run": run,
        "watermark": moment(cause.watermark) if cause.watermark is not None else None,
        "size": 0 if shape.window_is_end else shape.size_us,
        "late": cause.late,
        "cause": cause.name,
        "runs": list(cause.runs) or None,
    }
    row = driver.execute(_diff(shape, windows is not None, outside), params).fetchone()
    position = followed.position + (int(row[0]) if row else 0)
    driver.execute(
        sql.SQL("UPDATE {} SET position = %s, created_seq = %s WHERE stream = %s").format(FEEDS),
        (position, followed.current_seq, followed.stream),
    )
    return replace(followed, position=position, created_seq=followed.current_seq)


def _diff(shape: ViewShape, windowed: bool, outside: bool) -> sql.Composed:
    """The statement of ``_announce``: the view's rows (``_current``) against the announced
    rows (of the same windows); each difference a change
    numbered after %(base)s in identity order (as Python sorts strings: COLLATE "C"), and
    the announced rows updated; the number of changes. jsonb compares numbers by value,
    so 1.0 and 1.00 are no change. A run's change is late when the watermark before it
    (%(watermark)s) had reached the end of the row's window."""
    match = sql.SQL("<> ALL" if outside else "= ANY")
    return sql.SQL(
        "WITH {current}, "
        "before AS (SELECT identity, key, row, win, revision FROM {rows} "
        "WHERE stream = %(stream)s {rows_where}), "
        "d AS (SELECT coalesce(n.identity, b.identity) AS identity, "
        "coalesce(n.key, b.key) AS key, b.row AS old, n.row AS new, "
        "coalesce(n.win, b.win) AS win, coalesce(b.revision, 0) + 1 AS revision "
        "FROM now n FULL JOIN before b ON b.identity = n.identity "
        "WHERE n.row IS DISTINCT FROM b.row), "
        "c AS (SELECT d.*, %(base)s::bigint + row_number() OVER (ORDER BY identity "
        'COLLATE "C") AS position, %(watermark)s::timestamptz - (win + %(size)s::bigint '
        "* interval '1 microsecond') AS behind FROM d), "
        "changed AS (INSERT INTO {changes} (stream, position, op, key, old, new, late, "
        "lateness_seconds, revision, cause, runs) SELECT %(stream)s, position, "
        "CASE WHEN old IS NULL THEN 'insert' WHEN new IS NULL THEN 'delete' "
        "ELSE 'update' END, key, old, new, "
        "CASE WHEN %(run)s AND win IS NOT NULL THEN coalesce(behind >= interval '0', false) "
        "ELSE %(late)s END, "
        "CASE WHEN %(run)s AND win IS NOT NULL THEN CASE WHEN behind >= interval '0' "
        "THEN extract(epoch FROM behind)::double precision ELSE 0 END END, "
        "revision, %(cause)s, %(runs)s::text[] FROM c), "
        "announced AS (INSERT INTO {rows} (stream, identity, win, key, row, revision) "
        "SELECT %(stream)s, identity, win, key, new, revision FROM d "
        "ON CONFLICT (stream, identity) DO UPDATE SET win = excluded.win, "
        "key = excluded.key, row = excluded.row, revision = excluded.revision) "
        "SELECT count(*) FROM d"
    ).format(
        current=_current(shape, windowed, outside),
        rows=ROWS,
        rows_where=sql.SQL("AND win {} (%(windows)s)").format(match) if windowed else sql.SQL(""),
        changes=CHANGES,
    )


def _catch_up(driver: psycopg.Connection[Any], followed: Followed, plan: StreamPlan) -> Followed:
    """Announce the whole view anew when the stream was redefined (an ALTER's swap) or
    dropped and created again since the feed last looked, and watch the tables it joins
    now."""
    if followed.created_seq == followed.current_seq or refusal(plan) is not None:
        return followed
    assert isinstance(plan, FollowedPlan)
    oids = _watched(driver, plan)
    seen = tables.version(driver, oids) if oids is not None else None
    cause = _Cause("alter" if followed.version > 1 else "create")
    state = _announce(driver, followed, ViewShape.of(plan), None, cause)
    tables.remember(driver, state.stream, oids, seen)
    return replace(state, tables=oids, tables_version=seen)


def _watched(driver: psycopg.Connection[Any], plan: FollowedPlan) -> list[int] | None:
    """The oids of the tables ``plan``'s view joins, watched from now (None: none). A
    redefinition the feed cannot watch the tables of (it joins a view now) is announced
    all the same, without its tables' changes: a run's commit must not fail for it."""
    if not isinstance(plan, ParallelAggregatePlan) or not plan.tables:
        return None
    try:
        return tables.watch(driver, plan.name, plan.tables)
    except NoFeed as refused:
        log.warning("the change feed does not see the tables of %s: %s", plan.name, refused)
        return None


def _tables_caught_up(
    driver: psycopg.Connection[Any],
    state: Followed,
    shape: ViewShape,
    but: list[datetime] | None = None,
) -> Followed:
    """Announce what the tables ``state``'s view joins changed since its rows were
    announced, if they did (cause ``table``); ``but``: windows whose changes the caller
    announces next, in the same transaction (a run's commit, which then names them)."""
    if state.tables is None:
        return state
    seen = tables.version(driver, state.tables)  # read before the view rows: see tables.py
    if seen == state.tables_version:
        return state
    before = state.position
    state = _announce(driver, state, shape, but, _Cause("table"), outside=but is not None)
    tables.remember(driver, state.stream, state.tables, seen)
    faults.reach("feed_table", [state.stream], changes=list(range(before + 1, state.position + 1)))
    return replace(state, tables_version=seen)


def _prune(driver: psycopg.Connection[Any], before: int, after: Followed, retention: float) -> None:
    """Drop the changes older than ``retention`` seconds, a prefix of positions, when the
    position passed a multiple of PRUNE_EVERY."""
    if before // PRUNE_EVERY == after.position // PRUNE_EVERY:
        return
    driver.execute(
        sql.SQL(
            "WITH old AS (SELECT max(position) AS upto FROM {changes} WHERE stream = %(s)s "
            "AND committed_at < now() - make_interval(secs => %(r)s)), "
            "gone AS (DELETE FROM {changes} WHERE stream = %(s)s "
            "AND position <= (SELECT upto FROM old)) "
            "UPDATE {feeds} SET pruned_through = greatest(pruned_through, "
            "coalesce((SELECT upto FROM old), 0)) WHERE stream = %(s)s"
        ).format(changes=CHANGES, feeds=FEEDS),
        {"s": after.stream, "r": retention},
    )


def _followable(records: dict[str, StreamRecord], raw: str) -> list[str]:
    return [
        r.name
        for r in records.values()
        if isinstance(r.plan, FollowedPlan)
        and raw in r.plan.raw_sources
        and refusal(r.plan) is None
    ]


def _windows(
    records: dict[str, StreamRecord], plan: FollowedPlan, shape: ViewShape, times: np.ndarray
) -> list[datetime] | None:
    """The view's windows that raw rows with event times ``times`` may change; None (the
    whole view) where the view shows no window or the rows reach it through a join or a
    stream computed on read."""
    if shape.window is None:
        return None
    try:
        if through_join(records, plan):
            return None
        chain = lineage(records, plan)
    except AssertionError:  # a lineage through a stream computed on read
        return None
    return shape.window_values(serial.window_starts(times, chain))


@contextmanager
def recording(
    connection: sa.Connection,
    records: dict[str, StreamRecord],
    raw: RawStreamPlan,
    data: pa.Table,
    runs: list[str],
    *,
    retention: float,
    cause: str = "run",
) -> Iterator[None]:
    """Around the end of a run commit's transaction (after its partial rows, before its
    progress is recorded): on leaving, announce what the commit changed in every followed
    stream fed by ``raw``. Lateness is measured against the watermark read on entering.
    ``cause`` is ``replace`` where a cluster node puts the rows the cluster chose for a run
    in place of its own (server/replication/replace.py): ``data`` then holds both."""
    driver = _driver(connection)
    names = _followable(records, raw.name)
    followed = _followed_names(driver, names) if names else []
    if not followed:
        yield
        return
    mark = driver.execute(
        sql.SQL("SELECT watermark FROM {} WHERE stream = %s").format(PROGRESS), (raw.name,)
    ).fetchone()
    watermark = micros(mark[0]) if mark and mark[0] else None
    yield
    times = data[raw.event_time].cast(pa.int64()).to_numpy(zero_copy_only=False)
    made = _Cause(cause, tuple(runs), watermark)
    for name, state in _lock(driver, followed).items():
        if state.backfilling:
            continue
        plan = records[name].plan
        assert isinstance(plan, FollowedPlan)
        start = state.position
        state = _catch_up(driver, state, plan)
        shape = ViewShape.of(plan)
        windows = _windows(records, plan, shape, times)
        if windows is not None:  # a table change not announced yet, outside the run's windows
            state = _tables_caught_up(driver, state, shape, but=windows)
        state = _announce(driver, state, shape, windows, made)
        state = _tables_caught_up(driver, state, shape)  # one committed meanwhile
        _prune(driver, start, state, retention)


def record_repair(
    connection: sa.Connection, plan: SerialAggregatePlan, windows: list[datetime]
) -> None:
    """In a serial repair's transaction, after it recomputed the windows starting at
    ``windows``: announce what changed (the view reads repaired windows on read until the
    repair, so this is normally nothing)."""
    driver = _driver(connection)
    locked = _lock(driver, [plan.name])
    if plan.name not in locked or locked[plan.name].backfilling:
        return
    shape = ViewShape.of(plan)
    values = None
    if shape.window is not None:
        values = shape.window_values(np.array([micros(w) for w in windows], dtype=np.int64))
    state = _catch_up(driver, locked[plan.name], plan)
    _announce(driver, state, shape, values, _Cause("repair", late=True))


def follow_definitions(connection: sa.Connection, plans: PlanCache) -> int:
    """Announce the whole view of every followed stream redefined (by an ALTER's swap) or
    created anew since its feed last looked; how many were."""
    driver = _driver(connection)
    records = plans.load(connection)
    caught = 0
    for name, state in _lock(driver, None).items():
        if state.created_seq != state.current_seq and name in records and not state.backfilling:
            _catch_up(driver, state, records[name].plan)
            caught += 1
    return caught


def follow_tables(connection: sa.Connection, plans: PlanCache, names: list[str]) -> int:
    """Announce what the tables joined by the followed streams ``names`` changed since
    their rows were announced (a subscriber's poll; a run's commit, in a transaction before
    its own so that its changes name the run alone); how many streams had changes. Looks
    without a lock first: a stream whose tables did not change costs one query."""
    driver = _driver(connection)
    if not [name for name in names if tables.moved(driver, name)]:
        return 0
    records = plans.load(connection)
    caught = 0
    for name, state in _lock(driver, names).items():
        if name not in records or state.backfilling:
            continue
        plan = records[name].plan
        state = _catch_up(driver, state, plan)
        if isinstance(plan, FollowedPlan):
            start = state.position
            after = _tables_caught_up(driver, state, ViewShape.of(plan))
            caught += after.position > start
    return caught


def redefined(connection: sa.Connection, name: str) -> bool:
    """Whether ``name``'s feed has yet to announce a redefinition (no lock taken)."""
    row = (
        _driver(connection)
        .execute(
            sql.SQL(
                "SELECT f.created_seq IS DISTINCT FROM s.created_seq FROM {} f "
                "JOIN {} s ON s.name = f.stream WHERE f.stream = %s"
            ).format(FEEDS, STREAMS),
            (name,),
        )
        .fetchone()
    )
    return bool(row and row[0])


def follow(engine: sa.Engine, plans: PlanCache, name: str) -> bool:
    """Start following ``name`` (whose plan the feed can follow) unless it is: its view as
    it is now becomes the announced rows, at position 0. Runs of its sources wait meanwhile
    (SHARE locks), so each commits before (in the rows) or after (announced by itself).
    Whether this call started it."""
    with engine.begin() as connection:
        records = plans.load(connection)
        plan = records[name].plan
        assert isinstance(plan, FollowedPlan)
        driver = _driver(connection)
        if _followed_names(driver, [name]):
            return False
        catalog.lock_raw_archives(connection, plan.raw_sources)
        backfilling = driver.execute(
            sql.SQL("SELECT FROM {} WHERE stream = %s AND finished_at IS NULL").format(BACKFILLS),
            (name,),
        ).fetchone()
        if backfilling is not None:
            raise Unavailable(
                f"stream {name!r} is back-filling its history: its changes can be followed "
                "once that is done (see progress.backfill of GET /streams/{name})",
                retry_after=5,
            )
        started = driver.execute(
            sql.SQL(
                "INSERT INTO {} (stream) VALUES (%s) ON CONFLICT DO NOTHING RETURNING stream"
            ).format(FEEDS),
            (name,),
        ).fetchone()
        if started is None:
            return False
        driver.execute(sql.SQL("DELETE FROM {} WHERE stream = %s").format(ROWS), (name,))
        oids = (
            tables.watch(driver, name, plan.tables)
            if isinstance(plan, ParallelAggregatePlan) and plan.tables
            else None
        )
        tables.remember(driver, name, oids, tables.version(driver, oids) if oids else None)
        driver.execute(
            sql.SQL(
                "WITH {} INSERT INTO {} (stream, identity, win, key, row, revision) "
                "SELECT %(stream)s, identity, win, key, row, 0 FROM now"
            ).format(_current(ViewShape.of(plan), False, False), ROWS),
            {"stream": name},
        )
        driver.execute(
            sql.SQL(
                "UPDATE {} SET created_seq = (SELECT created_seq FROM {} WHERE name = %s) "
                "WHERE stream = %s"
            ).format(FEEDS, STREAMS),
            (name, name),
        )
        return True
