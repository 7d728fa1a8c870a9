"""Serial (SP) streams: windows materialized when they close, late data recorded as
corrections and repaired, and every view exact at every instant, across two levels; and a
top-N stream ranking each window of an aggregate stream, kept the same way."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from rewriter import naming
from server import faults
from server.workers.reducer import Reducer
from server.workers.serial import Materializer, Repairer
from tests.conftest import Strata, examples, plan_nodes
from tests.oracle import SnapshotReader, late, late_runs, with_a_late_run
from tests.test_reducer import Raising, strictly

START = datetime(2024, 6, 1, tzinfo=UTC)
RAW = "CREATE STREAM {ev} (campaign text, user_id bigint, t timestamptz) WITH (event_time = 't')"
STREAMS = {
    # PP: counts per campaign and minute.
    "per_minute": (
        "SELECT campaign, count(*) AS n, window_end AS t FROM TUMBLE({ev}, t, INTERVAL "
        "'1 minute') GROUP BY campaign, window_end"
    ),
    # SP, level 1: MAX over COUNT, a gather point.
    "top_per_5": (
        "SELECT max(n) AS top, count(*) AS campaigns, window_end AS t FROM TUMBLE({per_minute}, "
        "t, INTERVAL '5 minutes') GROUP BY window_end"
    ),
    # SP, level 2: over a serial stream, with HAVING over its final values.
    "busy_per_15": (
        "SELECT max(top) AS top, sum(campaigns) AS campaigns, window_start FROM "
        "TUMBLE({top_per_5}, t, INTERVAL '15 minutes') GROUP BY window_start HAVING max(top) > 3"
    ),
    # SP: the top 2 campaigns of each minute, ranked when the minute closes.
    "leaders": (
        "SELECT campaign, n, t FROM (SELECT campaign, n, t, ROW_NUMBER() OVER (PARTITION BY t "
        "ORDER BY n DESC, campaign) AS rn FROM {per_minute}) x WHERE rn <= 2"
    ),
}
SERIAL = ("top_per_5", "busy_per_15", "leaders")
# Each serial stream's archived columns, the last its window's start or end, and its width
# when the end (what the window's start is behind it).
ARCHIVED = {
    "top_per_5": ("top, campaigns, t", timedelta(minutes=5)),
    "busy_per_15": ("top, campaigns, window_start", timedelta(0)),
    "leaders": ("campaign, n, t", timedelta(minutes=1)),
}
EXAMPLES = itertools.count()  # fresh stream names for each property example


def _minute(column: str, seconds: int) -> str:
    return f"to_timestamp(floor(extract(epoch FROM {column}) / {seconds}) * {seconds})"


def oracles(ev: str) -> dict[str, str]:
    """Each stream as one plain GROUP BY over the raw archive."""
    counts = (
        f"SELECT campaign, count(*) AS n, {_minute('t', 60)} AS w FROM {ev} GROUP BY campaign, w"
    )
    tops = (
        f"SELECT max(n) AS top, count(*) AS campaigns, {_minute('w', 300)} AS w5 "
        f"FROM ({counts}) c GROUP BY w5"
    )
    return {
        "per_minute": f"SELECT campaign, n, w + interval '1 minute' FROM ({counts}) c",
        "top_per_5": f"SELECT top, campaigns, w5 + interval '5 minutes' FROM ({tops}) x",
        "busy_per_15": (
            f"SELECT max(top), sum(campaigns), {_minute('w5', 900)} AS w15 FROM ({tops}) x "
            "GROUP BY w15 HAVING max(top) > 3"
        ),
        "leaders": (
            "SELECT campaign, n, w + interval '1 minute' FROM (SELECT campaign, n, w, "
            f"row_number() OVER (PARTITION BY w ORDER BY n DESC, campaign) AS r FROM ({counts}) "
            "c) x WHERE r <= 2"
        ),
    }


class Streams:
    """One set of the streams above, under names of its own (property examples share a db)."""

    def __init__(self, strata: Strata, suffix: str = "") -> None:
        self.strata = strata
        self.names = {name: f"{name}{suffix}" for name in ("ev", *STREAMS)}
        strata.create(RAW.format(ev=self.names["ev"]))
        for name, query in STREAMS.items():
            strata.create(f"CREATE STREAM {self.names[name]} AS {query.format(**self.names)}")
        self.oracles = oracles(self.names["ev"])
        engine, plans = strata.service.engine, strata.service.plans
        self.materializer = Materializer(engine, plans, batch=4)
        self.repairer = Repairer(engine, plans, batch=3)
        self.reducer = Reducer(engine, plans, min_rows=1, max_groups=5)

    def ingest(self, minutes: Sequence[float], rng: random.Random) -> None:
        lines = [
            json.dumps(
                {
                    "campaign": rng.choice("abc"),
                    "user_id": rng.randrange(10),
                    "t": (START + timedelta(minutes=m)).isoformat(),
                }
            )
            for m in minutes
        ]
        self.strata.ingest(self.names["ev"], "\n".join(lines) + "\n")

    def differ(self, connection: psycopg.Connection) -> list[str]:
        """Streams whose view differs from its oracle, read in the connection's transaction."""
        wrong = []
        for name, oracle in list(self.oracles.items()):  # may grow meanwhile
            view = connection.execute(f"SELECT * FROM {self.names[name]}").fetchall()  # type: ignore[arg-type]
            expected = connection.execute(oracle).fetchall()  # type: ignore[arg-type]
            if sorted(map(repr, view)) != sorted(map(repr, expected)):
                wrong.append(name)
        return wrong

    def wrong(self, connection: psycopg.Connection) -> list[str]:
        """Streams whose view differs from its oracle, all read in one snapshot."""
        with connection.transaction():
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return self.differ(connection)

    def archive(self, name: str) -> list[tuple]:
        """The archived rows of a serial stream (what a view reads for materialized windows)."""
        columns = ARCHIVED[name][0]
        return sorted(
            self.strata.query(f"SELECT {columns} FROM strata_internal.{self.names[name]}__serial"),
            key=repr,
        )

    def expected(self, name: str, *, archived: bool = False) -> list[tuple]:
        """The oracle's rows; with ``archived``, only those of windows materialized."""
        rows = self.strata.query(self.oracles[name])
        if archived:
            until = self.state(name)["materialized_until"]
            bound = datetime.fromisoformat(str(until)) if until else START - timedelta(days=1)
            width = ARCHIVED[name][1]
            rows = [r for r in rows if r[2] - width < bound]
        return sorted(rows, key=repr)

    def settle(self) -> None:
        """Let the materializer and the repairer catch up; then every archived row is
        exactly the oracle's."""
        while sum(self.materializer.run_once().values()):
            pass
        self.repairer.run_once()
        for name in SERIAL:
            assert self.archive(name) == self.expected(name, archived=True)

    def state(self, name: str) -> dict[str, object]:
        response = self.strata.client.get(f"/streams/{self.names[name]}")
        return response.json()["progress"]["serial"]  # type: ignore[no-any-return]


def test_closed_windows_are_archived_and_late_data_repaired_across_two_levels(
    strata: Strata,
) -> None:
    streams = Streams(strata)
    rng = random.Random(7)
    streams.ingest([rng.uniform(0, 60) for _ in range(300)] + [60.0], rng)
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        assert streams.wrong(connection) == []
        # Watermark at 60 minutes: top_per_5 has 12 closed windows, busy_per_15 4, leaders
        # 60 (up to two campaigns each).
        while sum(streams.materializer.run_once().values()):
            pass
        for name in SERIAL:
            assert streams.archive(name) == streams.expected(name, archived=True)
        assert len(streams.archive("top_per_5")) == 12
        assert len({row[2] for row in streams.archive("leaders")}) == 60
        assert 60 < len(streams.archive("leaders")) <= 120
        assert streams.state("top_per_5")["materialized_until"] == "2024-06-01T01:00:00+00:00"
        assert streams.state("top_per_5")["windows_materialized"] == 12
        assert streams.state("busy_per_15")["materialized_until"] == "2024-06-01T01:00:00+00:00"
        assert streams.wrong(connection) == []

        # Late rows, all in one campaign so the maxima move, into closed windows 5 and 30.
        late = [6.5] * 40 + [33.0] * 40
        streams.strata.ingest(
            streams.names["ev"],
            "".join(
                json.dumps(
                    {"campaign": "z", "user_id": 1, "t": (START + timedelta(minutes=m)).isoformat()}
                )
                + "\n"
                for m in late
            ),
        )
        # Exact at once, before any repair: the changed windows are computed on read...
        assert streams.wrong(connection) == []
        # ...while the archive still holds what they were (the test can fail).
        for name in SERIAL:
            assert streams.archive(name) != streams.expected(name, archived=True)
        assert sorted(
            strata.query("SELECT stream, window_start, late_rows FROM strata_catalog.corrections")
        ) == [
            ("busy_per_15", START, 40),
            ("busy_per_15", START + timedelta(minutes=30), 40),
            ("leaders", START + timedelta(minutes=6), 40),
            ("leaders", START + timedelta(minutes=33), 40),
            ("top_per_5", START + timedelta(minutes=5), 40),
            ("top_per_5", START + timedelta(minutes=30), 40),
        ]
        assert streams.state("top_per_5")["windows_awaiting_repair"] == 2
        # z leads those two minutes now.
        assert ("z", 40, START + timedelta(minutes=7)) in streams.expected("leaders")

        assert streams.repairer.run_once() == {"top_per_5": 2, "busy_per_15": 2, "leaders": 2}
        for name in SERIAL:
            assert streams.archive(name) == streams.expected(name, archived=True)
        assert strata.query("SELECT count(*) FROM strata_catalog.corrections") == [(0,)]
        assert streams.wrong(connection) == []

        # Again into window 5: its second revision.
        streams.ingest([7.0, 8.0], rng)
        streams.repairer.run_once()
        assert streams.state("top_per_5") | {"last_repaired_at": None} == {
            "materialized_until": "2024-06-01T01:00:00+00:00",
            "windows_materialized": 12,
            "windows_awaiting_repair": 0,
            "late_rows_awaiting_repair": 0,
            "windows_revised": 2,
            "revisions": 3,
            "last_repaired_at": None,
        }
        assert strata.query(
            "SELECT revisions FROM strata_catalog.window_revisions "
            "WHERE stream = 'top_per_5' AND window_start = %s",
            START + timedelta(minutes=5),
        ) == [(2,)]
        assert streams.wrong(connection) == []


def test_a_read_plans_the_archive_and_two_calls_not_the_source(strata: Strata) -> None:
    """The windows a serial view computes on read are computed by functions of the
    stream's (those not materialized yet, those awaiting repair), which PostgreSQL plans
    once per session: a read plans the archive and the calls, never the source's view
    (planning it at every read took three times as long as reading the archive). Exact
    whether the windows are archived, computed, or both."""
    streams = Streams(strata)
    rng = random.Random(3)
    streams.ingest([rng.uniform(0, 60) for _ in range(200)] + [60.0], rng)
    while sum(streams.materializer.run_once().values()):
        pass
    streams.ingest([rng.uniform(0, 70) for _ in range(30)], rng)  # late rows and a new window
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        assert streams.wrong(connection) == []
        assert streams.state("top_per_5")["windows_awaiting_repair"] > 0
        for name in SERIAL:
            plan = "\n".join(
                row[0]
                for row in connection.execute(f"EXPLAIN SELECT * FROM {streams.names[name]}")  # type: ignore[arg-type]
            )
            for function in (
                naming.serial_live_function(streams.names[name]),
                naming.serial_awaiting_function(streams.names[name]),
            ):
                assert f"Function Scan on {function}" in plan, plan
            assert f"{streams.names[name]}__serial" in plan, plan
            assert "per_minute" not in plan, plan  # the source's view and tables
        streams.settle()
        assert streams.wrong(connection) == []


def _calls(connection: psycopg.Connection, query: str, function: str) -> int:
    """How many times reading ``query`` ran the function ``function`` (EXPLAIN ANALYZE:
    0 when its node was never executed)."""
    plan = connection.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").fetchone()[0]  # type: ignore[index]
    loops = [
        n["Actual Loops"] for n in plan_nodes(plan[0]["Plan"]) if n.get("Function Name") == function
    ]
    assert len(loops) == 1, plan
    return int(loops[0])


def test_a_filtered_read_computes_the_windows_awaiting_repair_only_when_it_keeps_one(
    strata: Strata,
) -> None:
    """A view shows the columns of a window awaiting repair (its start or end, the window
    column a top-N shows) from the list of those windows, so that a reader's filter on them
    reaches the list: a read of an hour late data has not touched does not run the function
    that computes them (a dashboard's hour at caught-up speed while the repairer has not
    run); a read that keeps one runs it once. Exact either way, against an oracle over the
    raw rows."""
    streams = Streams(strata)
    rng = random.Random(5)
    streams.ingest([rng.uniform(0, 60) for _ in range(200)] + [60.0], rng)
    while sum(streams.materializer.run_once().values()):
        pass
    streams.ingest([7.2, 8.4, 33.5], rng)  # late rows: windows 5 and 30 of top_per_5
    minute = timedelta(minutes=1)
    awaiting = {
        "top_per_5": [START + 5 * minute, START + 30 * minute],
        "leaders": [START + 7 * minute, START + 8 * minute, START + 33 * minute],
    }
    # name: ranges (lo, hi] of its window column t in minutes after START: one untouched by
    # the late rows, one that keeps one window awaiting repair.
    ranges = {"top_per_5": ((40, 60), (30, 35)), "leaders": ((40, 50), (30, 40))}
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        for name, windows in awaiting.items():
            listed = connection.execute(
                "SELECT window_start FROM strata_catalog.corrections WHERE stream = %s ORDER BY 1",
                (streams.names[name],),
            ).fetchall()
            assert [w for (w,) in listed] == windows
            function = naming.serial_awaiting_function(streams.names[name])
            oracle = strata.query(streams.oracles[name])
            for (lo, hi), calls in zip(ranges[name], (0, 1), strict=True):
                low, high = START + lo * minute, START + hi * minute
                query = (
                    sql.SQL("SELECT * FROM {} WHERE t > {} AND t <= {}")
                    .format(sql.Identifier(streams.names[name]), low, high)
                    .as_string(connection)
                )
                assert _calls(connection, query, function) == calls, query
                read = connection.execute(query).fetchall()  # type: ignore[call-overload]
                expected = [r for r in oracle if low < r[2] <= high]
                assert read and sorted(read, key=repr) == sorted(expected, key=repr), query
        assert streams.wrong(connection) == []


def test_described_with_its_archive(strata: Strata) -> None:
    Streams(strata)
    described = strata.client.get("/streams/top_per_5").json()
    assert described["parallelism"] == "SP"
    ddl = " ".join(described["rewrite"]["ddl"])
    assert "strata_internal" in ddl and "top_per_5__serial" in ddl
    assert "strata_serial_corrected" in described["rewrite"]["view_sql"].lower()
    assert described["progress"]["serial"]["materialized_until"] is None


@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.floats(0, 90), min_size=2, max_size=120).filter(
        lambda minutes: len(set(minutes)) > 1  # a late run needs two times
    ),
    st.integers(2, 6),
    st.lists(st.sampled_from(["materialize", "repair", "reduce", "check"]), max_size=12),
    st.randoms(use_true_random=False),
)
def test_exact_whatever_the_order_of_runs_and_workers(
    module_strata: Strata,
    minutes: list[float],
    splits: int,
    actions: list[str],
    rng: random.Random,
) -> None:
    """Rows split into runs, shuffled (so much of it arrives late: one run at least), with
    the workers run between runs in any order: every view equals its oracle after every
    run and worker pass and at the end, and once the workers have caught up, the archives
    do too."""
    streams = Streams(module_strata, suffix=f"_{next(EXAMPLES)}")
    rng.shuffle(minutes)
    splits = min(splits, len(minutes))
    runs = with_a_late_run([minutes[i::splits] for i in range(splits)], float)
    with psycopg.connect(module_strata.database_url, autocommit=True) as connection:
        for index, run in enumerate(runs):
            streams.ingest(run, rng)
            assert streams.wrong(connection) == []
            for action in actions[index :: len(runs)]:
                if action == "materialize":
                    strictly(streams.materializer)
                elif action == "repair":
                    strictly(streams.repairer)
                elif action == "reduce":
                    strictly(streams.reducer)
                assert streams.wrong(connection) == []
        streams.settle()
        assert streams.wrong(connection) == []
    # The example proved something: counts to compare, and a run that came late.
    assert module_strata.query(streams.oracles["top_per_5"])
    assert late(runs, float) and late_runs(module_strata, streams.names["ev"]) > 0


def test_a_first_materialization_waits_for_the_commit_in_flight(strata: Strata) -> None:
    """A run's commit is held inside its transaction, after it has looked for serial
    windows already materialized (none yet: nothing noted), while the materializer writes a
    stream's first windows: the materializer must wait for the commit (its rows then in the
    windows), or the archive would miss them with no correction to say so."""
    streams = Streams(strata)
    rng = random.Random(11)
    streams.ingest([rng.uniform(0, 60) for _ in range(100)] + [60.0], rng)
    assert streams.state("top_per_5")["materialized_until"] is None
    body = "".join(
        json.dumps({"campaign": "z", "user_id": 1, "t": (START + timedelta(minutes=m)).isoformat()})
        + "\n"
        for m in [6.5] * 30
    )
    committing = Raising(lambda: strata.ingest(streams.names["ev"], body, run_id="late"), "run")
    materializing = Raising(lambda: strictly(streams.materializer), "materializer")
    with faults.hold("in_pg_write", "late") as held:
        committing.start()
        assert held.reached.wait(120), "the run's commit never reached its transaction's end"
        materializing.start()
        materializing.join(3)  # done by now if it does not wait for the commit
    committing.join(120)
    materializing.join(120)
    committing.reraise()
    materializing.reraise()
    assert streams.state("top_per_5")["materialized_until"] == "2024-06-01T01:00:00+00:00"
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        assert streams.wrong(connection) == []
    streams.settle()


@pytest.mark.parametrize("seed", [3, 4])
def test_views_exact_at_every_instant_while_all_workers_run(strata: Strata, seed: int) -> None:
    """Late runs keep coming while the materializer, the repairer and the reducer run at
    random moments and a new stream back-fills over the history in small chunks; a reader
    compares every view with its oracle in one snapshot, again and again (a stream being
    back-filled joins the comparison once its back-fill is done)."""
    streams = Streams(strata)
    rng = random.Random(seed)
    streams.ingest([rng.uniform(0, 60) for _ in range(200)], rng)
    strata.runtime.workers["backfill"].chunk_rows = 150  # type: ignore[attr-defined]
    stop = threading.Event()
    done: dict[str, int] = {"materializer": 0, "repair": 0, "reducer": 0}

    def check(connection: psycopg.Connection) -> None:
        assert streams.differ(connection) == [], "views differ from their oracles"

    def work() -> None:
        timing = random.Random(seed)
        while not stop.is_set():
            worker = timing.choice([streams.materializer, streams.repairer, streams.reducer])
            done[worker.name] += sum(strictly(worker).values())
            time.sleep(timing.uniform(0, 0.05))

    def backfill() -> None:
        time.sleep(random.Random(seed).uniform(0.5, 3.0))
        strata.create(
            "CREATE STREAM per_2 AS SELECT campaign, count(*) AS n, window_start "
            "FROM TUMBLE(ev, t, INTERVAL '2 minutes') GROUP BY campaign, window_start"
        )
        streams.names["per_2"] = "per_2"
        streams.oracles["per_2"] = (
            f"SELECT campaign, count(*), {_minute('t', 120)} AS w FROM ev GROUP BY campaign, w"
        )

    working, backfilling = Raising(work, "worker"), Raising(backfill, "back-fill")
    with SnapshotReader(strata.database_url, check, min_snapshots=10):
        working.start()
        backfilling.start()
        try:
            for _ in range(12):
                # Mostly late: anywhere in the hour already seen, a little beyond it.
                streams.ingest([rng.uniform(0, 70) for _ in range(40)], rng)
        finally:
            backfilling.join(300)
            stop.set()
            working.join(300)
    backfilling.reraise()
    working.reraise()
    assert done["materializer"] > 0 and done["repair"] > 0 and done["reducer"] > 0, done
    assert "per_2" in streams.oracles
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        assert streams.wrong(connection) == []
    streams.settle()
    assert late_runs(strata, "ev") > 0


def _interrupt(strata: Strata, work: Callable[[], object], table: str, statement: str) -> None:
    """Run ``work`` in a thread and kill its PostgreSQL backend while it waits, inside its
    transaction, to run ``statement`` on ``table`` (held locked meanwhile): the worker dies
    midway, as in a crash: of the killed connection, and of nothing else."""
    thread = Raising(work, "worker")
    with psycopg.connect(strata.database_url) as blocker:
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # type: ignore[arg-type]
        thread.start()
        for _ in range(200):
            waiting = strata.query(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                statement + "%",
            )
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the worker never reached the statement"
        strata.query("SELECT pg_terminate_backend(%s)", waiting[0][0])
        blocker.rollback()
    thread.join(300)
    assert not thread.is_alive(), "the worker did not stop"
    assert thread.error is not None, "the worker must have failed"
    if not _killed(thread.error):
        thread.reraise()  # a failure of its own, not the one the test caused


def _killed(error: BaseException) -> bool:
    """Whether ``error`` is the database error of a connection PostgreSQL terminated: a
    driver's error, caused (as Python shows it) by the termination."""
    if not isinstance(error, sa.exc.DBAPIError | psycopg.Error):
        return False
    seen: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in seen:
        if isinstance(cause, psycopg.errors.AdminShutdown):
            return True
        seen.append(cause)
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return False


def test_materializer_and_repairer_killed_midway_leave_nothing_half_done(strata: Strata) -> None:
    streams = Streams(strata)
    rng = random.Random(11)
    streams.ingest([rng.uniform(0, 60) for _ in range(200)] + [60.0], rng)
    archive = "strata_internal.top_per_5__serial"
    plan = strata.service.stream("top_per_5").plan
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        _interrupt(strata, lambda: streams.materializer.step(plan), archive, "DELETE FROM")
        assert streams.state("top_per_5")["materialized_until"] is None
        assert streams.archive("top_per_5") == []
        assert streams.wrong(connection) == []
        while sum(streams.materializer.run_once().values()):
            pass
        assert len(streams.archive("top_per_5")) == 12

        streams.ingest([12.0] * 30, rng)
        before = streams.archive("top_per_5")
        # Killed after rewriting the window in the archive, before counting the revision.
        revisions = "strata_catalog.window_revisions"
        _interrupt(strata, lambda: streams.repairer.step(plan), revisions, "INSERT INTO")
        assert streams.state("top_per_5")["windows_awaiting_repair"] == 1
        assert streams.state("top_per_5")["revisions"] == 0
        assert streams.archive("top_per_5") == before
        assert streams.wrong(connection) == []
        streams.repairer.run_once()
        assert streams.state("top_per_5")["revisions"] == 1
        assert streams.archive("top_per_5") == streams.expected("top_per_5", archived=True)
        assert streams.wrong(connection) == []
