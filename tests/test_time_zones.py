"""Windows of a day and longer are whole microseconds from the epoch in every time zone: a
day window's end is 24 hours after its start, a one-day session gap 24 hours, also across a
daylight-saving change, whatever the TimeZone of the session that reads a view or of the
database the server's workers fold and materialize in.

PostgreSQL adds INTERVAL '1 day' in the session's time zone (23 or 25 hours across a
daylight-saving change), so every SQL the rewriter writes adds a window's size spelled in
hours (rewriter.resolve_window.fixed_interval). Here the database's own default zone is New
York's, so the reducer's fold and the serial workers run in it, and each view is read from
sessions in UTC, New York and Kathmandu (+05:45, no daylight saving) before the fold, after
it, and after the serial workers, and by a snapshot reader in New York's zone all along:
every read equal to a Python model of the windows computed in microseconds, independently
of the views' SQL. The upgrade test stands up what the previous release left (its views,
and the window ends its workers stored in such a zone) and needs migration 0028 to make
each exact.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import SparkSession

from rewriter import naming
from rewriter.rename import replaced_views
from server.catalog import migrate
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata, strata_client
from tests.oracle import SnapshotReader, execute, ndjson
from tests.test_upgrade import downgrade_to, list_waiting_windows

DAY = timedelta(days=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Both of New York's daylight-saving changes of 2024 (March 10, November 3), each inside
# the rows' days.
SPANS = (datetime(2024, 3, 7, tzinfo=UTC), datetime(2024, 10, 31, tzinfo=UTC))
ZONES = ("UTC", "America/New_York", "Asia/Kathmandu")
STREAMS = {
    "daily": "SELECT k, count(*) AS c, sum(n) AS total, window_end AS t "
    "FROM TUMBLE(ev, t, INTERVAL '1 day') GROUP BY k, window_end",
    "two_days": "SELECT k, count(*) AS c, window_end AS t "
    "FROM HOP(ev, t, INTERVAL '1 day', INTERVAL '2 days') GROUP BY k, window_end",
    # Serial (MAX over COUNT): materialized by the workers, windows of two days.
    "busiest": "SELECT max(c) AS top, window_end AS t FROM TUMBLE(daily, t, INTERVAL '2 days') "
    "GROUP BY window_end",
    "visits": "SELECT k, count(*) AS c, window_start, window_end "
    "FROM SESSION(ev, t, INTERVAL '1 day') GROUP BY k, window_start",
    # Top-N over the raw rows' day windows: the largest n of each day, ties kept.
    "largest": "SELECT k, n, window_end FROM (SELECT k, n, window_end, RANK() OVER "
    "(PARTITION BY window_start ORDER BY n DESC) AS r FROM TUMBLE(ev, t, INTERVAL '1 day') e) x "
    "WHERE r = 1",
}


@pytest.fixture
def strata(fresh_db: str, spark: SparkSession, tmp_path: Path) -> Iterator[Strata]:
    """Strata on a database whose sessions default to New York's time zone; no worker runs
    until the test runs it."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET TimeZone = 'America/New_York'").format(
                sql.Identifier(name)
            )
        )
    with strata_client(fresh_db, spark, tmp_path) as instance:
        yield instance


def _rows(rng: random.Random) -> list[dict[str, object]]:
    """Events over six days around each daylight-saving change, at most 30 hours apart
    per key (so sessions of a one-day gap both join and split)."""
    rows = []
    for first in SPANS:
        for key in ("a", "b", "c"):
            at = first + timedelta(hours=rng.uniform(0, 6))
            while at < first + 6 * DAY:
                rows.append({"k": key, "n": rng.randrange(1, 100), "t": at.isoformat()})
                at += timedelta(hours=rng.choice([1, 5, 11, 23.5, 24.5, 30]))
    return rows


def _streams_and_rows(strata: Strata, seed: int) -> list[dict[str, object]]:
    """The raw stream ev and STREAMS over it; the events of _rows, shuffled by ``seed``."""
    strata.create("CREATE STREAM ev (k text, n bigint, t timestamptz) WITH (event_time = 't')")
    for name, query in STREAMS.items():
        strata.create(f"CREATE STREAM {name} AS {query}")
    rng = random.Random(seed)
    rows = _rows(rng)
    rng.shuffle(rows)
    return rows


def _micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


def _start(moment: datetime, size: timedelta) -> datetime:
    """The window of ``size`` holding ``moment``, in microseconds from the epoch."""
    step = _micros(EPOCH + size)
    return EPOCH + timedelta(microseconds=_micros(moment) // step * step)


def _oracles(rows: list[dict[str, object]]) -> dict[str, set[tuple[object, ...]]]:
    """Each view's rows, computed from the events in Python."""
    events = [(str(r["k"]), int(r["n"]), datetime.fromisoformat(str(r["t"]))) for r in rows]
    daily: dict[tuple[str, datetime], list[int]] = defaultdict(list)
    two_days: dict[tuple[str, datetime], int] = defaultdict(int)
    for key, n, at in events:
        start = _start(at, DAY)
        daily[key, start].append(n)
        for window in (start - DAY, start):
            two_days[key, window] += 1
    busiest: dict[datetime, int] = defaultdict(int)
    for (_, start), values in daily.items():
        serial = _start(start, 2 * DAY)
        busiest[serial] = max(busiest[serial], len(values))
    visits = set()
    for key in sorted({k for k, _, _ in events}):
        times = sorted(at for k, _, at in events if k == key)
        session = [times[0]]
        for at in times[1:]:
            if at - session[-1] >= DAY:
                visits.add((key, len(session), session[0], session[-1] + DAY))
                session = []
            session.append(at)
        visits.add((key, len(session), session[0], session[-1] + DAY))
    largest = {}
    for _, n, at in events:
        start = _start(at, DAY)
        largest[start] = max(largest.get(start, n), n)
    return {
        "largest": {
            (k, n, _start(at, DAY) + DAY) for k, n, at in events if largest[_start(at, DAY)] == n
        },
        "daily": {(k, len(v), sum(v), s + DAY) for (k, s), v in daily.items()},
        "two_days": {(k, c, s + 2 * DAY) for (k, s), c in two_days.items()},
        "busiest": {(top, s + 2 * DAY) for s, top in busiest.items()},
        "visits": visits,
    }


def _in_utc(row: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(v.astimezone(UTC) if isinstance(v, datetime) else v for v in row)


def _check(conn: psycopg.Connection, oracles: dict[str, set[tuple[object, ...]]]) -> None:
    """Every view read on ``conn`` equals its oracle."""
    zone = conn.info.parameter_status("TimeZone")
    for view, expected in oracles.items():
        statement = sql.SQL("SELECT * FROM {}").format(sql.Identifier(view))
        found = {_in_utc(row) for row in conn.execute(statement).fetchall()}
        assert found == expected, (zone, view, sorted(found ^ expected, key=str)[:6])


def _check_every_zone(strata: Strata, oracles: dict[str, set[tuple[object, ...]]]) -> None:
    for zone in ZONES:
        with psycopg.connect(strata.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("SET TimeZone = {}").format(sql.Literal(zone)))
            _check(conn, oracles)


def test_day_windows_are_24_hours_in_every_time_zone(strata: Strata) -> None:
    rows = _streams_and_rows(strata, 2024)
    oracles = _oracles(rows)
    engine, plans = strata.service.engine, strata.service.plans
    # A reader in the database's zone, New York's, meanwhile: every snapshot it takes
    # equals the model of the raw rows in it, while runs commit, the reducer folds in that
    # zone and the serial workers materialize and repair in it.
    with SnapshotReader(strata.database_url, _exact_in_snapshot, min_snapshots=5):
        for part in range(8):
            strata.ingest("ev", ndjson(rows[part::8]))
        waiting = strata.query("SELECT count(*) FROM strata_internal.daily__partial")[0][0]
        assert waiting > 0  # read merged on read first: the window ends the view computes
        _check_every_zone(strata, oracles)
        while any(Reducer(engine, plans, min_rows=0).run_once().values()):
            pass
        assert strata.query("SELECT count(*) FROM strata_internal.daily__partial")[0][0] == 0
        _check_every_zone(strata, oracles)
        _settle(strata)
    archived = strata.query("SELECT count(*) FROM strata_internal.busiest__serial")[0][0]
    assert archived > 0  # the serial windows read from the archive, as the workers wrote
    _check_every_zone(strata, oracles)


def _exact_in_snapshot(conn: psycopg.Connection) -> None:
    """The views equal the model of the raw rows read in the same snapshot."""
    raw = conn.execute("SELECT k, n, t FROM ev").fetchall()
    _check(conn, _oracles([{"k": k, "n": n, "t": t.isoformat()} for k, n, t in raw]))


def test_the_upgrade_sets_day_windows_to_24_hours(strata: Strata) -> None:
    """0028 on a database the previous release left: views that add '1 day' and '2 days',
    consolidated window ends and serial windows a fold and the materializer wrote in New
    York's zone (an hour off across the change). After the upgrade every view is exact in
    every zone, the serial windows computed on read until the repairer writes them again,
    and ingest stays exact."""
    rows = _streams_and_rows(strata, 28)
    parts = [rows[part::4] for part in range(3)]
    # The third part late into November's days alone: March's serial windows keep what
    # the previous release wrote until the upgrade lists them.
    november = SPANS[1].isoformat()
    parts.append([r for r in parts[2] if str(r["t"]) < november] + rows[3::4])
    parts[2] = [r for r in parts[2] if str(r["t"]) >= november]
    for part in parts[:2]:
        strata.ingest("ev", ndjson(part))
    engine, plans = strata.service.engine, strata.service.plans
    downgrade_to(engine, "0027")
    aggregates = strata.query(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'strata_internal' AND c.relname LIKE '%%\\_\\_partial'"
    )
    list_waiting_windows(strata.database_url, [name for (name,) in aggregates])
    # The previous release: its SQL adds whole days, which its fold and materializer ran in
    # the database's zone, New York's.
    with engine.connect() as connection:
        records = plans.load(connection)
    for record in records.values():
        for statement in replaced_views(record.plan):
            for hours, days in (("24 hours", "1 day"), ("48 hours", "2 days")):
                statement = statement.replace(f"'{hours}'", f"'{days}'")
            execute(strata, statement)
    _settle(strata)
    # What its fold and its materializer wrote there (today's workers run today's SQL).
    for table, end, start, size in (
        ("daily__reduced", "window_end", "window_start", "1 day"),
        ("two_days__reduced", "window_end", "window_start", "2 days"),
        ("busiest__serial", "t", naming.SERIAL_WINDOW_COLUMN, "2 days"),
    ):
        execute(strata, f"UPDATE strata_internal.{table} SET {end} = {start} + interval '{size}'")
    strata.ingest("ev", ndjson(parts[2]))  # waiting for the reducer: merged on read
    oracles = _oracles(parts[0] + parts[1] + parts[2])
    with pytest.raises(AssertionError):
        _check_every_zone(strata, oracles)
    migrate(engine)
    assert strata.query("SELECT count(*) FROM strata_catalog.corrections")[0][0] > 0
    _check_every_zone(strata, oracles)
    _settle(strata)
    assert strata.query("SELECT count(*) FROM strata_catalog.corrections") == [(0,)]
    _check_every_zone(strata, oracles)
    strata.ingest("ev", ndjson(parts[3]))  # late, after the upgrade
    _check_every_zone(strata, _oracles(rows))
    _settle(strata)
    _check_every_zone(strata, _oracles(rows))


def _settle(strata: Strata) -> None:
    """The reducer, the materializer and the repairer, each until it has nothing to do."""
    engine, plans = strata.service.engine, strata.service.plans
    workers = (Reducer(engine, plans, min_rows=0), Materializer(engine, plans))
    for worker in (*workers, Repairer(engine, plans)):
        while any(worker.run_once().values()):
            pass
