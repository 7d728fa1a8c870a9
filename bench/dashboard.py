"""Benchmark of a dashboard: the queries a dashboard sends to Strata's views, caught up and
with late data waiting, against the same queries over plain tables of the views' rows.

    python -m bench.dashboard [--hours 24] [--groups 1000] [--repeat 5] [--explain DIR]

What it does, in one process:

1. starts an embedded PostgreSQL in a temporary dir (or uses ``STRATA_DATABASE_URL``) and
   applies the migrations (bench.harness.database);
2. registers the streams of STREAMS in the catalog as ``POST /streams`` would
   (bench.harness.catalog), one of every view kind: a raw stream ``ev``; ``per_minute``
   (count and revenue per campaign and minute); ``per_5``, its 5-minute roll-up; ``hop``
   (count per campaign over sliding 5-minute windows); ``top_per_5`` (MAX over
   ``per_minute``'s count: serial); ``sketch`` (approx_percentile and
   approx_count_distinct per campaign and hour); ``leaders`` (top 10 campaigns a minute,
   kept per minute: serial) and ``running`` (each campaign's running total, on read),
   both over ``per_minute``; ``visits``
   (sessions, computed on read from ``ev``'s raw rows); and ``by_owner`` (an aggregate
   joined with the table ``owners``, which gives each campaign one of 20 owners);
3. fills every parallel stream's partial archive, as Spark would have written it, with one
   partial row per window and campaign over ``--hours`` hours, from the run (1..20) whose
   slice of the span holds the window, and ``ev``'s raw archive with a click or two per
   campaign every 10 minutes (RAW_FILL), and sets ``ev``'s watermark to the span's end so
   that every window is closed;
4. phase "caught up": runs the reducer and the materializer until they have nothing left
   to do (VACUUM ANALYZE after each, as autovacuum would): every serial window is
   archived, where a live system has its newest window open and computes it on read;
5. phase "late": adds late partial rows from 4 more runs (21..24, 20% of the runs), each
   for all campaigns and every window of one of 4 random slices of the span, into every
   parallel stream's partial archive (and a click per campaign every 10 minutes of the
   slice into ``ev``'s raw archive, each joining a session), records the corrections they
   make to the serial streams' materialized windows (as a run's commit would), and
   reduces nothing;
6. phase "folded": wakes the reducer (folding STRATA_REDUCE_CONCURRENCY streams at once,
   as by default) and the repairer, as the late runs' commit does (server/runtime.py
   wires it), and times how long from then until no serial window
   waits for its repair, and until no partial row waits for a fold either: the time from
   a late run's commit until its windows read at caught-up speed again;
7. phase "live": adds an on-time run (25) into the newest window of every stream, for
   every campaign, and reduces nothing: what a live system reads all the time, its open
   window taking runs between the reducer's folds (its goal is caught up's);
8. in each phase, for each query of QUERIES: ``CREATE TABLE plain_<view> AS SELECT * FROM
   <view>`` indexed on (t, campaign) or (t) (window_start for sessions), and times the
   query on the view and on the plain table (median of ``--repeat`` after one untimed
   run); both must give identical rows, or the benchmark fails.

With ``--explain DIR``, each phase also writes EXPLAIN (ANALYZE, BUFFERS) of every query
on the view to DIR (``<phase>-<view>-<query>.txt``, after the timed runs): the evidence of
where a view's time goes.

``make bench`` (scale ``full``) runs it twice: over the default day of 1,000 campaigns and
over 6 hours of 300 campaigns, whose figures are labelled "(6 h × 300 campaigns)".

Prints a table of the medians and their ratios. The goals: at most 1.5 times the plain
table caught up, folded and live, at most 3 times with late data waiting; missing them does
not fail.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg import sql

from bench.harness.catalog import register
from bench.harness.database import Measurement, measure, scalar, scratch_database
from bench.harness.errors import BenchError
from bench.harness.results import Result, check_scale
from rewriter.naming import (
    INTERNAL_SCHEMA,
    consolidated_table,
    partial_archive_table,
    raw_archive_table,
    serial_archive_table,
)
from rewriter.plan import ParallelAggregatePlan, SerialAggregatePlan, StreamPlan
from rewriter.tables import TableColumn, TableSchema
from server.catalog import PlanCache, create_catalog_engine
from server.settings import DEFAULTS
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer

DAY = datetime(2024, 6, 1, tzinfo=UTC)
RUNS = 20  # on-time runs, each covering 1/RUNS of the span
LATE_RUNS = 4  # late runs 21..24, each for one slice of the span
SEED = 2024
# The view's median / the plain table's, at most.
GOALS = {"caught up": 1.5, "late": 3.0, "folded": 1.5, "live": 1.5}
LIVE_RUN = RUNS + LATE_RUNS + 1  # the on-time run into the newest windows (phase "live")
STREAMS = {
    "ev": "CREATE STREAM ev (campaign text, user_id bigint, price double precision, "
    "t timestamptz) WITH (event_time = 't')",
    "per_minute": "CREATE STREAM per_minute AS SELECT campaign, count(*) AS n, "
    "sum(price) AS revenue, window_end AS t "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "per_5": "CREATE STREAM per_5 AS SELECT campaign, sum(n) AS n, sum(revenue) AS revenue, "
    "window_end AS t FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') "
    "GROUP BY campaign, window_end",
    "hop": "CREATE STREAM hop AS SELECT campaign, count(*) AS n, window_end AS t "
    "FROM HOP(ev, t, INTERVAL '1 minute', INTERVAL '5 minutes') GROUP BY campaign, window_end",
    "top_per_5": "CREATE STREAM top_per_5 AS SELECT max(n) AS top, count(*) AS campaigns, "
    "window_end AS t FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') GROUP BY window_end",
    "sketch": "CREATE STREAM sketch AS SELECT campaign, approx_percentile(price, 0.95) AS p95, "
    "approx_count_distinct(user_id) AS users, window_end AS t "
    "FROM TUMBLE(ev, t, INTERVAL '1 hour') GROUP BY campaign, window_end",
    # Top-N and running totals: views over per_minute's rows.
    "leaders": "CREATE STREAM leaders AS SELECT campaign, n, t FROM (SELECT campaign, n, t, "
    "ROW_NUMBER() OVER (PARTITION BY t ORDER BY n DESC, campaign) AS rn FROM per_minute) x "
    "WHERE rn <= 10",
    "running": "CREATE STREAM running AS SELECT campaign, t, sum(n) OVER (PARTITION BY campaign "
    "ORDER BY t) AS total FROM per_minute",
    # Sessions: computed on read from the raw rows.
    "visits": "CREATE STREAM visits AS SELECT campaign, count(*) AS n, window_start, window_end "
    "FROM SESSION(ev, t, INTERVAL '40 seconds') GROUP BY campaign, window_start",
    # An aggregate joined with a table: the partials per campaign, joined on read.
    "by_owner": "CREATE STREAM by_owner AS SELECT o.owner, sum(e.price) AS spent, "
    "count(*) AS n, window_end AS t FROM TUMBLE(ev, t, INTERVAL '1 minute') e "
    "JOIN owners o ON o.campaign = e.campaign GROUP BY o.owner, window_end",
}
# The table by_owner joins: every campaign's owner, 20 owners.
OWNERS = TableSchema(
    "owners", (TableColumn("campaign", "text"), TableColumn("owner", "text")), ("campaign",)
)
OWNERS_DDL = (
    "CREATE TABLE owners (campaign text PRIMARY KEY, owner text NOT NULL)",
    "INSERT INTO owners SELECT 'c' || g, 'o' || g %% 20 FROM generate_series(1, %(groups)s) g",
)
# Where a new window starts, per parallel stream (a hopping window's start moves by the hop).
STEPS = {
    "per_minute": timedelta(minutes=1),
    "per_5": timedelta(minutes=5),
    "hop": timedelta(minutes=1),
    "sketch": timedelta(hours=1),
    "by_owner": timedelta(minutes=1),
}
# A partial state per state name, of the window number w, the campaign number g and a salt
# (0 on time, the run when late). Sums are multiples of 0.25, exact in double precision, so
# that the view and the plain table add them up to the same bits in any order.
N = "((w * g + salt) %% 17 + 1)"  # %%: the statement has parameters
STATES = {
    "count": N,
    "sum": f"{N} * (g %% 7 + 1) * 0.25",
    "ddsketch": "jsonb_build_object(strata_ddsketch_bucket((g %% 97 + 1) * 0.5 + salt)::text, "
    f"{N})",
    "kmv": "ARRAY(SELECT hashtextextended((g * 100 + (w + salt + k) %% 100)::text, 0) "
    "FROM generate_series(1, 3) k ORDER BY 1)",
}
# Every state of a row: the slice's run, the window's start, the campaign.
FILL = (
    "INSERT INTO {archive} ({columns}) "
    "SELECT {run}, ws, 'c' || g, {states} "
    "FROM (SELECT w, %(start)s + w * %(step)s AS ws FROM generate_series(0, %(windows)s - 1) w) "
    "AS windows, generate_series(1, %(groups)s) g, (SELECT %(salt)s AS salt) AS salted "
    "WHERE ws >= %(lo)s AND ws < %(hi)s"
)

# Raw rows of ev, which the sessions view reads: for every campaign, a click in every 10
# minutes (at a second of them that varies with the campaign), and a second one 20 s later
# in a third of them; a late run adds a click 35 s after the first (joining its session).
CLICK = timedelta(minutes=10)
RAW_FILL = (
    "INSERT INTO {archive} (campaign, user_id, price, t, strata_run) "
    "SELECT 'c' || g, g * 1000 + w, 0.25 * (g %% 7 + 1), "
    "ws + make_interval(secs => (g * 7 + w) %% 300 + k), {run} "
    "FROM (SELECT w, %(start)s + w * %(step)s AS ws FROM generate_series(0, %(windows)s - 1) w) "
    "AS windows, generate_series(1, %(groups)s) g, {clicks} "
    "WHERE ws >= %(lo)s AND ws < %(hi)s"
)
ON_TIME_CLICKS = "unnest(CASE WHEN (w + g) %% 3 = 0 THEN ARRAY[0, 20] ELSE ARRAY[0] END) k"


@dataclass(frozen=True)
class Query:
    view: str
    name: str
    template: str  # over {rel}; {lo}, {hi}: the 6-hour filter; {hour}, {hour_end}: one hour


QUERIES = [
    Query(
        "per_minute",
        "per-minute series, 6 hours",
        "SELECT t, sum(n) FROM {rel} WHERE t >= '{lo}' AND t < '{hi}' GROUP BY t ORDER BY t",
    ),
    Query(
        "per_minute",
        "per-hour revenue by campaign",
        "SELECT date_trunc('hour', t) AS hour, campaign, sum(revenue) FROM {rel} "
        "GROUP BY 1, 2 ORDER BY 1, 2",
    ),
    Query("per_minute", "big number", "SELECT sum(n), sum(revenue) FROM {rel}"),
    Query(
        "per_minute",
        "top 10 campaigns, last day",
        "SELECT campaign, sum(revenue) AS revenue FROM {rel} "
        "WHERE t > '{end}'::timestamptz - interval '1 day' AND t <= '{end}' "
        "GROUP BY campaign ORDER BY revenue DESC, campaign LIMIT 10",
    ),
    Query(
        "per_minute",
        "one campaign, one hour",
        "SELECT t, n, revenue FROM {rel} WHERE campaign = 'c7' "
        "AND t > '{hour}' AND t <= '{hour_end}' ORDER BY t",
    ),
    Query(
        "per_5",
        "5-minute roll-up by hour",
        "SELECT date_trunc('hour', t) AS hour, sum(n), sum(revenue) FROM {rel} "
        "GROUP BY 1 ORDER BY 1",
    ),
    Query(
        "hop",
        "per-hour sum, 6 hours",
        "SELECT date_trunc('hour', t) AS hour, sum(n) FROM {rel} "
        "WHERE t >= '{lo}' AND t < '{hi}' GROUP BY 1 ORDER BY 1",
    ),
    Query(
        "top_per_5",
        "serial by hour",
        "SELECT date_trunc('hour', t) AS hour, max(top) FROM {rel} GROUP BY 1 ORDER BY 1",
    ),
    Query(
        "sketch",
        "p95 and users by campaign",
        "SELECT campaign, max(p95), sum(users) FROM {rel} GROUP BY campaign ORDER BY campaign",
    ),
    Query(
        "leaders",
        "top 10 a minute, one hour",
        "SELECT t, campaign, n FROM {rel} WHERE t > '{hour}' AND t <= '{hour_end}' "
        "ORDER BY t, n DESC, campaign",
    ),
    Query(
        "running",
        "one campaign's running total, one hour",
        "SELECT t, total FROM {rel} WHERE campaign = 'c7' AND t > '{hour}' "
        "AND t <= '{hour_end}' ORDER BY t",
    ),
    Query(
        "visits",
        "one campaign's sessions, one hour",
        "SELECT window_start, window_end, n FROM {rel} WHERE campaign = 'c7' "
        "AND window_start >= '{hour}' AND window_start < '{hour_end}' ORDER BY window_start",
    ),
    Query(
        "by_owner",
        "spend by owner, 6 hours",
        "SELECT owner, sum(spent), sum(n) FROM {rel} WHERE t >= '{lo}' AND t < '{hi}' "
        "GROUP BY owner ORDER BY owner",
    ),
]
BASELINE = "the same query over a plain table of the view's rows"


@dataclass(frozen=True)
class Span:
    """The event time the data covers, and the ranges the dashboard's filters ask for."""

    hours: int

    @property
    def end(self) -> datetime:
        return DAY + timedelta(hours=self.hours)

    def slice(self, index: int) -> tuple[datetime, datetime]:
        """The window starts of run ``index + 1``'s slice of the span."""
        length = timedelta(hours=self.hours) / RUNS
        return DAY + index * length, DAY + (index + 1) * length

    def sql(self, query: Query, rel: str) -> str:
        lo = DAY + timedelta(hours=self.hours) / 4  # 6 hours from 06:00 over a day
        hour = DAY + timedelta(hours=self.hours) / 2
        return query.template.format(
            rel=rel,
            lo=lo.isoformat(sep=" "),
            hi=(lo + timedelta(hours=6)).isoformat(sep=" "),
            end=self.end.isoformat(sep=" "),
            hour=hour.isoformat(sep=" "),
            hour_end=(hour + timedelta(hours=1)).isoformat(sep=" "),
        )


# ---- data ------------------------------------------------------------------------------


def parallel_plans(plans: dict[str, StreamPlan]) -> list[ParallelAggregatePlan]:
    return [p for p in plans.values() if isinstance(p, ParallelAggregatePlan)]


def serial_plans(plans: dict[str, StreamPlan]) -> list[SerialAggregatePlan]:
    return [p for p in plans.values() if isinstance(p, SerialAggregatePlan)]


def _runs(
    span: Span, windows: int, late: tuple[int, int] | None, newest: timedelta | None = None
) -> tuple[str, tuple[datetime, datetime]]:
    """The run of each filled row (SQL over the window number w: on time, the run whose
    slice holds the window; late, the late run; ``newest``: LIVE_RUN, into the windows
    starting in the span's last ``newest``) and the range of window starts filled."""
    if newest is not None:
        return str(LIVE_RUN), (span.end - newest, span.end)
    if late is None:
        return f"w * {RUNS} / {windows} + 1", (DAY, span.end)
    return str(late[1]), span.slice(late[0])


def fill(
    conn: psycopg.Connection,
    plan: ParallelAggregatePlan,
    span: Span,
    groups: int,
    *,
    late: tuple[int, int] | None = None,  # (slice, run): a late run's rows for one slice
    newest: bool = False,  # LIVE_RUN's rows for the newest window
) -> None:
    """Partial rows for every window and campaign of the span (on time: from the run of
    the window's slice), or of one slice (late), or of the newest window (LIVE_RUN)."""
    states = {s.column: s.name for a in plan.aggregates for s in a.states}
    unknown = set(states.values()) - set(STATES)
    if unknown:
        raise BenchError(f"{plan.name} has states this benchmark cannot generate: {unknown}")
    step = STEPS[plan.name]
    windows = int(timedelta(hours=span.hours) / step)
    key = next(c for c, _ in plan.partial_columns if c.startswith("key_"))
    columns = ["strata_run", "window_start", key, *states]
    run, (lo, hi) = _runs(span, windows, late, step if newest else None)
    salt = LIVE_RUN if newest else 0 if late is None else late[1]
    statement = FILL.format(
        archive=f'"{INTERNAL_SCHEMA}"."{partial_archive_table(plan.name)}"',
        columns=", ".join(f'"{c}"' for c in columns),
        run=run,
        states=", ".join(STATES[name] for name in states.values()),
    )
    params = {"start": DAY, "step": step, "windows": windows, "groups": groups}
    conn.execute(statement, params | {"salt": salt, "lo": lo, "hi": hi})  # type: ignore[arg-type]


def fill_raw(
    conn: psycopg.Connection,
    span: Span,
    groups: int,
    *,
    late: tuple[int, int] | None = None,
    newest: bool = False,
) -> None:
    """Raw rows of ev for the whole span (on time: each from the run of its slice), or a late
    run's click in every 10 minutes of one slice, or LIVE_RUN's in the last 10 minutes, for
    every campaign (RAW_FILL)."""
    windows = int(timedelta(hours=span.hours) / CLICK)
    run, (lo, hi) = _runs(span, windows, late, CLICK if newest else None)
    clicks = ON_TIME_CLICKS if late is None and not newest else "(SELECT 35 AS k) AS late"
    statement = RAW_FILL.format(
        archive=f'"{INTERNAL_SCHEMA}"."{raw_archive_table("ev")}"', run=run, clicks=clicks
    )
    params = {"start": DAY, "step": CLICK, "windows": windows, "groups": groups}
    conn.execute(statement, params | {"lo": lo, "hi": hi})  # type: ignore[arg-type]


def vacuum(conn: psycopg.Connection) -> None:
    """VACUUM ANALYZE of every internal table, as autovacuum would after a worker's pass."""
    tables = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s", (INTERNAL_SCHEMA,)
    ).fetchall()
    for (table,) in tables:
        conn.execute(f'VACUUM ANALYZE "{INTERNAL_SCHEMA}"."{table}"')  # type: ignore[arg-type]


def internal_rows(conn: psycopg.Connection, table: str) -> int:
    return int(scalar(conn, f'SELECT count(*) FROM "{INTERNAL_SCHEMA}"."{table}"'))


def shape(conn: psycopg.Connection, plans: dict[str, StreamPlan]) -> str:
    """Rows waiting in each partial archive and reduced in each consolidated table, and the
    serial streams' archived rows."""
    counts = ", ".join(
        f"{p.name} {internal_rows(conn, partial_archive_table(p.name)):,}"
        f"/{internal_rows(conn, consolidated_table(p.name)):,}"
        for p in parallel_plans(plans)
    )
    archived = ", ".join(
        f"{p.name} {internal_rows(conn, serial_archive_table(p.name)):,}"
        for p in serial_plans(plans)
    )
    return f"partial/reduced rows {counts}; serial rows archived {archived}"


def catch_up(conn: psycopg.Connection, url: str) -> None:
    """The reducer folds every partial row, then the materializer archives every closed
    window of the serial streams, each until it has nothing left to do."""
    engine = create_catalog_engine(url)
    try:
        for worker in (
            Reducer(engine, PlanCache(), min_rows=0, max_groups=1_000_000),
            Materializer(engine, PlanCache(), batch=1000),
        ):
            for _ in range(10):
                done = worker.run_once()
                vacuum(conn)
                if not any(done.values()):
                    break
    finally:
        engine.dispose()


def add_late_runs(
    conn: psycopg.Connection, plans: dict[str, StreamPlan], span: Span, groups: int
) -> list[int]:
    """Late runs 21..24 for 4 random slices; records the corrections of the serial
    streams' materialized windows that their source's late rows reach, as their commit
    would. Returns the slices."""
    slices = sorted(random.Random(SEED).sample(range(RUNS), LATE_RUNS))
    for offset, index in enumerate(slices):
        for plan in parallel_plans(plans):
            fill(conn, plan, span, groups, late=(index, RUNS + 1 + offset))
        fill_raw(conn, span, groups, late=(index, RUNS + 1 + offset))
    record_corrections(conn, plans)
    vacuum(conn)
    return slices


def record_corrections(conn: psycopg.Connection, plans: dict[str, StreamPlan]) -> None:
    """The corrections of the serial streams' materialized windows that their source's
    partial rows from runs after RUNS reach, as the runs' commit records them."""
    for serial in serial_plans(plans):
        # The window of each such partial row of the source, as a commit places it
        # (server-side record_corrections): the serial window its source window starts in.
        conn.execute(
            sql.SQL(
                "INSERT INTO strata_catalog.corrections (stream, window_start, late_rows, "
                "noted_at) SELECT %s, date_bin(make_interval(secs => %s), window_start, %s), "
                "count(*), now() FROM {} WHERE strata_run > %s GROUP BY 2"
            ).format(sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(serial.source))),
            (serial.name, serial.window_size_us / 1e6, DAY, RUNS),
        )


def add_live_run(
    conn: psycopg.Connection, plans: dict[str, StreamPlan], span: Span, groups: int
) -> None:
    """An on-time run (LIVE_RUN) into the newest window of every stream, for every
    campaign, not yet reduced: how a live system always reads, its open window taking runs
    between the reducer's folds (and its serial streams computing their newest window from
    it)."""
    for plan in parallel_plans(plans):
        fill(conn, plan, span, groups, newest=True)
    fill_raw(conn, span, groups, newest=True)
    record_corrections(conn, plans)
    vacuum(conn)


def waiting(conn: psycopg.Connection, tables: list[str]) -> bool:
    """Whether a row waits in any of the catalog or internal ``tables`` (schema-qualified)."""
    probes = [f"EXISTS (SELECT FROM {t})" for t in tables]
    return bool(scalar(conn, f"SELECT {' OR '.join(probes)}"))


@dataclass(frozen=True)
class Settled:
    """Seconds from the wake until the serial view's corrected windows are repaired, and
    until every late partial row is folded as well."""

    serial: float
    every_view: float


def fold_late_runs(conn: psycopg.Connection, url: str, plans: dict[str, StreamPlan]) -> Settled:
    """The reducer and the repairer, on intervals too long to matter, woken as the late
    runs' commit wakes them (server/runtime.py), and how long until nothing waits."""
    corrections = ["strata_catalog.corrections"]
    partials = [
        f'"{INTERNAL_SCHEMA}"."{partial_archive_table(p.name)}"' for p in parallel_plans(plans)
    ]
    engine = create_catalog_engine(url)
    cache = PlanCache()
    workers = [Reducer(engine, cache, interval=3600), Repairer(engine, cache, interval=3600)]
    try:
        for worker in workers:
            worker.start()
        started = time.perf_counter()
        for worker in workers:
            worker.wake()
        serial = None
        while waiting(conn, corrections + partials):
            if serial is None and not waiting(conn, corrections):
                serial = time.perf_counter() - started
            time.sleep(0.01)
        every_view = time.perf_counter() - started
        return Settled(every_view if serial is None else serial, every_view)
    finally:
        for worker in workers:
            worker.stop()
        engine.dispose()


# ---- queries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    phase: str
    query: Query
    view: Measurement
    plain: Measurement

    @property
    def ratio(self) -> float:
        return self.view.median_ms / self.plain.median_ms if self.plain.median_ms else 0.0


def plain_tables(conn: psycopg.Connection) -> None:
    """``plain_<view>``: the view's rows, indexed as a dashboard's table would be."""
    for view in dict.fromkeys(q.view for q in QUERIES):
        plain = f"plain_{view}"
        conn.execute(f"DROP TABLE IF EXISTS {plain}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {plain} AS SELECT * FROM {view}")  # type: ignore[arg-type]
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            (plain,),
        ).fetchall()
        when = "t" if ("t",) in columns else "window_start"
        key = f"{when}, campaign" if ("campaign",) in columns else when
        conn.execute(f"CREATE INDEX {plain}_t ON {plain} ({key})")  # type: ignore[arg-type]
        conn.execute(f"ANALYZE {plain}")  # type: ignore[arg-type]


def explain(conn: psycopg.Connection, sql: str, path: Path) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of ``sql``, written to ``path``."""
    rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").fetchall()  # type: ignore[arg-type]
    path.write_text("".join(f"{row[0]}\n" for row in rows))


def time_queries(
    conn: psycopg.Connection, phase: str, span: Span, repeat: int, explained: Path | None = None
) -> list[Timed]:
    plain_tables(conn)
    timed = []
    for query in QUERIES:
        view = measure(conn, span.sql(query, query.view), repeat)
        plain = measure(conn, span.sql(query, f"plain_{query.view}"), repeat)
        if view.result != plain.result:
            raise BenchError(f"{phase}, {query.name}: the view and the plain table disagree")
        if not view.result:
            raise BenchError(f"{phase}, {query.name}: no rows")
        timed.append(Timed(phase, query, view, plain))
        if explained is not None:
            name = re.sub(r"\W+", "-", f"{phase} {query.view} {query.name}").strip("-")
            explain(conn, span.sql(query, query.view), explained / f"{name}.txt")
    return timed


def run_benchmark(args: argparse.Namespace, label: str = "") -> list[Result]:
    """The four phases over ``args.hours`` x ``args.groups``; ``label`` tells the figures of
    a second scale apart from the default one's (for example " (6 h × 300 campaigns)")."""
    span = Span(args.hours)
    explained = args.explain
    if explained is not None:
        explained.mkdir(parents=True, exist_ok=True)
    with (
        scratch_database("strata-bench-dashboard-") as database,
        psycopg.connect(database.url, autocommit=True) as conn,
    ):
        for statement in OWNERS_DDL:
            conn.execute(statement, {"groups": args.groups})  # type: ignore[arg-type]
        plans = register(conn, STREAMS, {OWNERS.name: OWNERS})
        for plan in parallel_plans(plans):
            fill(conn, plan, span, args.groups)
        fill_raw(conn, span, args.groups)
        conn.execute(
            "INSERT INTO strata_catalog.stream_progress (stream, watermark, rows, runs, "
            "late_rows, late_runs) VALUES ('ev', %s, 0, %s, 0, 0)",
            (span.end, RUNS),
        )
        vacuum(conn)
        catch_up(conn, database.url)
        print(f"caught up: {shape(conn, plans)}")
        timings = time_queries(conn, "caught up", span, args.repeat, explained)
        slices = add_late_runs(conn, plans, span, args.groups)
        print(f"late runs for slices {slices}: {shape(conn, plans)}")
        timings += time_queries(conn, "late", span, args.repeat, explained)
        settled = fold_late_runs(conn, database.url, plans)
        print(
            f"repaired {settled.serial:.2f} s, folded {settled.every_view:.2f} s after the "
            f"wake: {shape(conn, plans)}"
        )
        vacuum(conn)
        timings += time_queries(conn, "folded", span, args.repeat, explained)
        add_live_run(conn, plans, span, args.groups)
        print(f"a live run into the newest windows: {shape(conn, plans)}")
        timings += time_queries(conn, "live", span, args.repeat, explained)
    print(f"{args.hours} hours x {args.groups} campaigns, medians of {args.repeat}")
    print(
        f"late runs' commit to caught-up reads: serial view {settled.serial:.2f} s, "
        f"every view {settled.every_view:.2f} s"
    )
    print(f"{'phase':<10} {'query':<42} {'view ms':>9} {'plain ms':>9} {'ratio':>7}  goal")
    for t in timings:
        print(
            f"{t.phase:<10} {t.query.view + ': ' + t.query.name:<42} {t.view.median_ms:>9.2f} "
            f"{t.plain.median_ms:>9.2f} {t.ratio:>7.2f}  <= {GOALS[t.phase]}"
        )
    context = {"hours": args.hours, "groups": args.groups, "repeat": args.repeat}
    # Before, a late commit's fold waited for the reducer's next pass and its repair for
    # the repairer's: up to an interval each (5 s by default).
    caught_up = [
        Result(
            figure=f"dashboard{label}: from {LATE_RUNS} late runs' commit until {what} reads at "
            f"caught-up speed ({how})",
            value=seconds,
            baseline=seconds + interval,
            baseline_name=f"the same {how}, after the {setting} as before (at most "
            f"{interval:g} s more)",
            unit="s",
            better="lower",
            notes=f"the baseline adds {setting}, the longest wait a late commit no longer has; "
            f"the reducer folds {DEFAULTS.reduce_concurrency} streams at once "
            "(STRATA_REDUCE_CONCURRENCY)",
            context=context,
        )
        for what, how, seconds, setting, interval in (
            (
                "the serial view",
                "the woken repairer's repair",
                settled.serial,
                "STRATA_SERIAL_INTERVAL",
                DEFAULTS.serial_interval,
            ),
            (
                "every view",
                "the woken reducer's fold",
                settled.every_view,
                "STRATA_REDUCE_INTERVAL",
                DEFAULTS.reduce_interval,
            ),
        )
    ]
    return [
        Result(
            figure=f"dashboard{label} {t.phase}: {t.query.view}: {t.query.name}",
            value=t.view.median_ms,
            baseline=t.plain.median_ms,
            baseline_name=BASELINE,
            unit="ms",
            better="lower",
            notes=f"goal: at most {GOALS[t.phase]}x the plain table",
            context=context,
        )
        for t in timings
    ] + caught_up


# The runs of each scale of bench/run.py: the label of their figures and their arguments.
# full measures the default day of 1,000 campaigns and a smaller one, 6 hours of 300, where
# the fixed costs of a view (planning, the branches it checks) weigh more against the rows.
SCALES = {
    "smoke": [("", ["--hours", "2", "--groups", "20", "--repeat", "2"])],
    "full": [("", []), (" (6 h × 300 campaigns)", ["--hours", "6", "--groups", "300"])],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    logging.basicConfig(level=logging.WARNING)
    return [
        result
        for label, arguments in SCALES[check_scale(scale)]
        for result in run_benchmark(_parser().parse_args(arguments), label)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.hours <= 0 or args.groups <= 0 or args.repeat <= 0:
        parser.error("--hours, --groups and --repeat must be positive")
    logging.basicConfig(level=logging.WARNING)
    run_benchmark(args)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hours", type=int, default=24, help="hours of event time (24)")
    parser.add_argument("--groups", type=int, default=1000, help="campaigns (1000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per query (5)")
    parser.add_argument(
        "--explain",
        type=Path,
        metavar="DIR",
        help="write EXPLAIN (ANALYZE, BUFFERS) of each query on the view, per phase, to DIR",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
