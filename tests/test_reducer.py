"""The reducer folds partial rows without ever changing what a view says."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg

from rewriter import naming
from rewriter.plan import ParallelAggregatePlan, StreamPlan
from server.workers.loop import Worker
from server.workers.reducer import Reducer, lock_reducer
from tests.conftest import Strata, plan_nodes
from tests.oracle import SnapshotReader

START = datetime(2024, 6, 1, tzinfo=UTC)
STREAMS = {
    "per_minute": (
        "SELECT campaign, count(*) AS n, sum(price) AS s, avg(price) AS a, min(price) AS lo, "
        "max(price) AS hi, count(DISTINCT user_id) AS users, var_samp(price) AS v, "
        "window_end AS t FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "SELECT campaign, count(*), sum(price), avg(price), min(price), max(price), "
        "count(DISTINCT user_id), var_samp(price), {w60} + interval '1 minute' "
        "FROM ev GROUP BY campaign, {w60}",
    ),
    "sliding": (
        "SELECT count(*) AS n, window_start FROM HOP(ev, t, INTERVAL '1 minute', "
        "INTERVAL '3 minutes') GROUP BY window_start",
        "SELECT count(*), w FROM ev CROSS JOIN LATERAL generate_series({w60} - "
        "interval '2 minutes', {w60}, interval '1 minute') AS w GROUP BY w",
    ),
    "per_five": (
        "SELECT campaign, sum(n) AS n, window_end AS t FROM TUMBLE(per_minute, t, "
        "INTERVAL '5 minutes') GROUP BY campaign, window_end",
        "SELECT campaign, count(*)::numeric, {w300} + interval '5 minutes' FROM ev "
        "GROUP BY campaign, {w300}",
    ),
}


def _window(seconds: int) -> str:
    return f"to_timestamp(floor(extract(epoch FROM t) / {seconds}) * {seconds})"


def _oracle(name: str) -> str:
    return STREAMS[name][1].format(w60=_window(60), w300=_window(300))


def _run(rng: random.Random, rows: int) -> str:
    lines = []
    for _ in range(rows):
        at = START + timedelta(seconds=rng.randrange(0, 900), microseconds=rng.randrange(10**6))
        lines.append(
            json.dumps(
                {
                    "campaign": rng.choice(["a", "b", "c"]),
                    "user_id": rng.randrange(20),
                    "price": str(Decimal(rng.randrange(1, 10000)) / 100),
                    "t": at.isoformat(),
                }
            )
        )
    return "\n".join(lines) + "\n"


def _priced_rows(rng: random.Random, minutes: range, *, campaigns: int, per_minute: int) -> str:
    """NDJSON rows of campaigns c0.. with a price, ``per_minute`` at random times in each of
    ``minutes`` (after START)."""
    return "".join(
        json.dumps(
            {
                "campaign": f"c{rng.randrange(campaigns)}",
                "price": str(Decimal(rng.randrange(1, 10000)) / 100),
                "t": (START + timedelta(minutes=m, seconds=rng.randrange(60))).isoformat(),
            }
        )
        + "\n"
        for m in minutes
        for _ in range(per_minute)
    )


def _setup(strata: Strata) -> None:
    strata.create(
        "CREATE STREAM ev (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    for name, (query, _oracle_sql) in STREAMS.items():
        strata.create(f"CREATE STREAM {name} AS {query}")


def _differ(connection: psycopg.Connection) -> list[str]:
    """Names of views that differ from their oracle, read in the connection's transaction."""
    wrong = []
    for name in STREAMS:
        view = connection.execute(f"SELECT * FROM {name}").fetchall()  # type: ignore[arg-type]
        oracle = connection.execute(_oracle(name)).fetchall()  # type: ignore[arg-type]
        if sorted(map(repr, view)) != sorted(map(repr, oracle)):
            wrong.append(name)
    return wrong


def _consistent(connection: psycopg.Connection) -> list[str]:
    """Names of views that differ from their oracle, both read in one snapshot."""
    with connection.transaction():
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return _differ(connection)


def strictly(worker: Worker) -> dict[str, int]:
    """``worker.run_once()``, raising what it would only log: a pass skips a stream whose
    step failed (the loop must go on), and a test must not."""
    failures: list[logging.LogRecord] = []
    me = threading.get_ident()

    class Failures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == me:  # not another thread's worker of the same name
                failures.append(record)

    handler = Failures(logging.WARNING)
    worker.log.addHandler(handler)
    try:
        done = worker.run_once()
    finally:
        worker.log.removeHandler(handler)
    if failures:
        first = failures[0]
        cause = first.exc_info[1] if first.exc_info else None
        raise AssertionError(f"{worker.name}: {first.getMessage()}") from cause
    return done


class Raising(threading.Thread):
    """A thread whose exception ``reraise`` raises once it is joined (a thread's exception
    is otherwise only a warning)."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.work = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as error:  # noqa: BLE001 - re-raised by reraise
            self.error = error

    def reraise(self) -> None:
        assert not self.is_alive(), f"the {self.name} thread did not stop"
        if self.error is not None:
            raise AssertionError(f"the {self.name} thread failed") from self.error


def _partial_rows(strata: Strata, name: str) -> tuple[int, int]:
    return strata.query(
        "SELECT count(*), count(DISTINCT (window_start, key_0)) "
        f"FROM strata_internal.{name}__partial"
    )[0]


def _reduced_rows(strata: Strata, name: str) -> tuple[int, int]:
    return strata.query(
        "SELECT count(*), count(DISTINCT (window_start, key_0)) "
        f"FROM strata_internal.{name}__reduced"
    )[0]


def test_reduction_converges_to_one_row_per_window_and_group(strata: Strata) -> None:
    _setup(strata)
    rng = random.Random(1)
    for _ in range(8):
        strata.ingest("ev", _run(rng, 60))
    rows, groups = _partial_rows(strata, "per_minute")
    assert rows > groups  # several runs touched the same windows
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        assert _consistent(connection) == []
        # A pass of a few windows at a time leaves some windows reduced and some not.
        reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, max_groups=2)
        with strata.service.engine.connect() as catalog:
            per_minute = strata.service.plans.load(catalog)["per_minute"].plan
        assert reducer.step(per_minute) > 0
        assert 0 < _partial_rows(strata, "per_minute")[0] < rows
        assert _consistent(connection) == []
        folded = reducer.run_once()
        assert folded["per_minute"] > 0 and folded["sliding"] > 0 and folded["per_five"] > 0
        # Every partial row moved: one consolidated row per window and group.
        assert _partial_rows(strata, "per_minute") == (0, 0)
        assert _reduced_rows(strata, "per_minute") == (groups, groups)
        assert _consistent(connection) == []
        # Late data after reduction still merges with the folded rows, on read and when
        # folded in turn.
        strata.ingest("ev", _run(rng, 40))
        assert _partial_rows(strata, "per_minute")[0] > 0
        assert _consistent(connection) == []
        assert reducer.run_once()["per_minute"] > 0
        assert _consistent(connection) == []
        assert _partial_rows(strata, "per_minute") == (0, 0)


def test_views_never_change_while_the_reducer_runs(strata: Strata) -> None:
    _setup(strata)
    rng = random.Random(2)
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, max_groups=3)
    stop = threading.Event()
    folds: list[dict[str, int]] = []

    def check(connection: psycopg.Connection) -> None:
        assert _differ(connection) == [], "views differ from their oracles"

    def reduce() -> None:
        while not stop.is_set():
            folds.append(strictly(reducer))

    reducing = Raising(reduce, "reducer")
    with SnapshotReader(strata.database_url, check, min_snapshots=10):
        reducing.start()
        try:
            for _ in range(10):
                strata.ingest("ev", _run(rng, 50))
        finally:
            stop.set()
            reducing.join(300)
    reducing.reraise()
    assert sum(f.get("per_minute", 0) for f in folds) > 0, "the reducer must have folded"
    assert strata.query("SELECT count(*) FROM per_minute")[0][0] > 0


def test_null_keys_fold_and_the_fold_finds_its_rows_by_index(strata: Strata) -> None:
    """NULL group keys are groups of their own, folded like any other; and the statement
    finds the rows it moves by an index or hash condition, never by comparing keys row by
    row in a join filter, which with one wide window and many groups took minutes (a
    window with a NULL key is rewritten whole, found by its start)."""
    strata.create(
        "CREATE STREAM nk (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        "CREATE STREAM nk_day AS SELECT campaign, user_id, count(*) AS n, sum(price) AS s, "
        "window_end AS t FROM TUMBLE(nk, t, INTERVAL '1 day') GROUP BY campaign, user_id, "
        "window_end"
    )
    rng = random.Random(3)
    for _ in range(4):
        lines = []
        for _ in range(200):
            row = {
                "campaign": rng.choice(["a", "b", None]),
                "user_id": rng.choice([1, 2, 3, None]),
                "price": str(Decimal(rng.randrange(1, 10000)) / 100),
                "t": (START + timedelta(hours=rng.randrange(0, 20))).isoformat(),
            }
            lines.append(json.dumps({k: v for k, v in row.items() if v is not None}))
        strata.ingest("nk", "\n".join(lines) + "\n")
    archive = "strata_internal.nk_day__partial"
    groups = strata.query(
        f"SELECT count(*) FROM (SELECT DISTINCT window_start, key_0, key_1 FROM {archive}) g"
    )[0][0]
    assert strata.query(f"SELECT count(*) FROM {archive}")[0][0] == 4 * groups  # 4 runs each
    assert groups == 12  # every (campaign, user_id) pair, NULLs included
    oracle = (
        "SELECT campaign, user_id, count(*), sum(price), "
        "date_bin('1 day', t, '1970-01-01 00:00:00+00') + interval '1 day' "
        "FROM nk GROUP BY 1, 2, 5"
    )
    before = sorted(map(repr, strata.query("SELECT * FROM nk_day")))
    assert before == sorted(map(repr, strata.query(oracle)))

    with strata.service.engine.connect() as catalog:
        plan = strata.service.plans.load(catalog)["nk_day"].plan
    assert isinstance(plan, ParallelAggregatePlan)
    statement = plan.reduce_statement
    with psycopg.connect(strata.database_url) as connection:
        explained = "\n".join(
            row[0]
            for row in connection.execute(
                "EXPLAIN " + statement, {"min_rows": 1, "max_groups": 100}
            ).fetchall()
        )
    # Found by conditions of an index or a hash: no comparison of keys row by row.
    assert "Join Filter" not in explained, explained
    condition = explained.split("Cond:")[1].splitlines()[0]
    assert "window_start" in condition, explained

    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, max_groups=100)
    assert reducer.run_once()["nk_day"] == groups
    assert strata.query(f"SELECT count(*) FROM {archive}")[0][0] == 0
    reduced = "strata_internal.nk_day__reduced"
    assert strata.query(f"SELECT count(*) FROM {reduced}")[0][0] == groups
    assert sorted(map(repr, strata.query("SELECT * FROM nk_day"))) == before


def _rewritten_groups(strata: Strata, name: str, fold: Callable[[], object]) -> set[tuple]:
    """The (window start, key) pairs whose consolidated rows ``fold`` wrote anew, in the
    finals and the states alike (a row written by the fold has the fold's xmin)."""
    tables = {
        "finals": f"SELECT window_start, key_0, xmin::text FROM strata_internal.{name}__reduced",
        "states": (
            f"SELECT window_start, key_0, xmin::text FROM strata_internal.{name}__reduced_states"
        ),
    }
    before = {t: set(strata.query(q)) for t, q in tables.items()}
    fold()
    changed = {t: {r[:2] for r in set(strata.query(q)) - before[t]} for t, q in tables.items()}
    assert changed["finals"] == changed["states"], changed
    return changed["finals"]


def _finals_looked_up(strata: Strata, name: str) -> int:
    """How many (window, group) pairs the stream's next fold looks up in its finals to
    take them out, by the group (EXPLAIN ANALYZE of the fold, rolled back)."""
    with strata.service.engine.connect() as catalog:
        plan = strata.service.plans.load(catalog)[name].plan
    assert isinstance(plan, ParallelAggregatePlan)
    with psycopg.connect(strata.database_url) as connection:
        explained = connection.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + plan.reduce_statement,
            {"min_rows": 0, "max_groups": 100},
        ).fetchone()
        connection.rollback()
    assert explained is not None
    deletes = [
        node
        for node in plan_nodes(explained[0][0]["Plan"])
        if node.get("Operation") == "Delete"
        and node.get("Relation Name") == f"{name}__reduced"
        and node.get("Alias") == "f"
    ]
    by_group = deletes[0]  # the group step; the whole-window step follows it
    return sum(
        int(n["Actual Rows"] * n["Actual Loops"])
        for n in plan_nodes(by_group)
        if n.get("Alias", "").startswith("changed")  # PostgreSQL numbers repeated aliases
    )


def test_a_fold_rewrites_the_groups_it_brings_and_a_window_with_a_null_key_whole(
    strata: Strata,
) -> None:
    """A late run touching two campaigns of a day of 200 rewrites those two consolidated
    rows, not the day's 200 (a long window taking runs in order was rewritten whole at
    every pass, and HiBench's repartition, a million groups in one window, spent most of
    its time there); a window where the fold brings a NULL key is rewritten whole. After
    every fold the view is the batch query over the raw rows."""
    strata.create(
        "CREATE STREAM gk (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        "CREATE STREAM gk_day AS SELECT campaign, count(*) AS n, sum(price) AS s, "
        "window_end AS t FROM TUMBLE(gk, t, INTERVAL '1 day') GROUP BY campaign, window_end"
    )
    rng = random.Random(17)

    def rows(campaigns: list[str | None], days: list[int]) -> str:
        lines = []
        for campaign in campaigns:
            for day in days:
                row = {
                    "campaign": campaign,
                    "price": str(Decimal(rng.randrange(1, 10000)) / 100),
                    "t": (START + timedelta(days=day, minutes=rng.randrange(1440))).isoformat(),
                }
                lines.append(json.dumps({k: v for k, v in row.items() if v is not None}))
        return "\n".join(lines) + "\n"

    oracle = (
        "SELECT campaign, count(*), sum(price), "
        "date_bin('1 day', t, '1970-01-01 00:00:00+00') + interval '1 day' "
        "FROM gk GROUP BY 1, 4"
    )

    def exact() -> bool:
        return sorted(map(repr, strata.query("SELECT * FROM gk_day"))) == sorted(
            map(repr, strata.query(oracle))
        )

    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0, max_groups=100)
    day_one, day_two = START, START + timedelta(days=1)
    strata.ingest("gk", rows([f"c{i}" for i in range(200)], [0, 1]))
    assert len(_rewritten_groups(strata, "gk_day", reducer.run_once)) == 400
    assert exact()

    strata.ingest("gk", rows(["c3", "c7", "c7"], [0]))
    assert _rewritten_groups(strata, "gk_day", reducer.run_once) == {
        (day_one, "c3"),
        (day_one, "c7"),
    }
    assert exact()

    # Fifty new campaigns and one known: the finals are looked up for the one state the
    # fold takes out, not for the 51 groups it brings (a fold of new groups, as HiBench's
    # repartition's, probed the finals' index for rows that are not there).
    strata.ingest("gk", rows([*(f"n{i}" for i in range(50)), "c3"], [0]))
    assert _finals_looked_up(strata, "gk_day") == 1
    assert len(_rewritten_groups(strata, "gk_day", reducer.run_once)) == 51
    assert exact()

    strata.ingest("gk", rows([None, "c5"], [1]) + rows(["c9"], [0]))
    rewritten = _rewritten_groups(strata, "gk_day", reducer.run_once)
    assert rewritten == {(day_one, "c9"), (day_two, None)} | {
        (day_two, f"c{i}") for i in range(200)
    }
    assert exact()
    # The NULL group's state merges with what later folds bring to it.
    strata.ingest("gk", rows([None, None], [1]))
    assert (day_two, None) in _rewritten_groups(strata, "gk_day", reducer.run_once)
    assert exact()
    assert strata.query("SELECT count(*) FROM strata_internal.gk_day__partial") == [(0,)]
    assert strata.query(
        "SELECT count(*), count(DISTINCT (window_start, key_0)) "
        "FROM strata_internal.gk_day__reduced"
    ) == [(451, 451)]


def test_a_filter_on_a_key_reads_one_range_of_the_reduced_windows(strata: Strata) -> None:
    """A dashboard's filter on a key alone (a campaign's running total), or on a key and a
    time range, is an index condition on the reduced windows' keys and window end: one
    range of the index, where the index on the window end and keys had to be searched
    once per window (361 searches for a campaign's 6 hours). The rows are the batch
    query's."""
    strata.create(
        "CREATE STREAM kc (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        "CREATE STREAM kc_minute AS SELECT campaign, count(*) AS n, sum(price) AS s, "
        "window_end AS t FROM TUMBLE(kc, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    rng = random.Random(11)
    lines = [
        json.dumps(
            {
                "campaign": f"c{campaign}",
                "price": str(Decimal(rng.randrange(1, 10000)) / 100),
                "t": (START + timedelta(minutes=minute, seconds=rng.randrange(60))).isoformat(),
            }
        )
        for minute in range(360)
        for campaign in range(40)
    ]
    strata.ingest("kc", "\n".join(lines) + "\n")
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    assert strata.query("SELECT count(*) FROM strata_internal.kc_minute__partial") == [(0,)]

    hour = (START + timedelta(hours=3), START + timedelta(hours=4))
    queries = {
        "key": ("SELECT t, n, s FROM kc_minute WHERE campaign = 'c7' ORDER BY t", ()),
        "key and hour": (
            "SELECT t, n, s FROM kc_minute WHERE campaign = 'c7' AND t > %s AND t <= %s ORDER BY t",
            hour,
        ),
    }
    minute = "date_bin('1 minute', t, '1970-01-01 00:00:00+00')"
    oracles = {
        "key": (
            f"SELECT {minute} + interval '1 minute', count(*), sum(price) FROM kc "
            f"WHERE campaign = 'c7' GROUP BY {minute} ORDER BY 1",
            (),
        ),
        "key and hour": (
            f"SELECT {minute} + interval '1 minute' AS e, count(*), sum(price) FROM kc "
            f"WHERE campaign = 'c7' GROUP BY {minute} "
            f"HAVING {minute} + interval '1 minute' > %s "
            f"AND {minute} + interval '1 minute' <= %s ORDER BY 1",
            hour,
        ),
    }
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        connection.execute("ANALYZE strata_internal.kc_minute__reduced")
        for name, (query, params) in queries.items():
            rows = connection.execute(query, params).fetchall()
            oracle, oracle_params = oracles[name]
            assert rows and rows == connection.execute(oracle, oracle_params).fetchall(), name
            explained = "\n".join(
                row[0] for row in connection.execute("EXPLAIN " + query, params).fetchall()
            )
            assert "kc_minute__reduced_key_end" in explained, explained
            condition = explained.split("kc_minute__reduced_key_end")[1].split("Cond:")[1]
            assert "key_0 = 'c7'" in condition.splitlines()[0], explained
    assert len(rows) == 60


def test_the_windows_that_wait_are_found_by_index_and_only_when_rows_wait(
    strata: Strata,
) -> None:
    """The windows whose partial rows wait for the reducer (merged on read) come from the
    stream's function, which reads the list of waiting windows: exactly the distinct
    window starts of the archive, HOP's panes too; a read while rows wait calls it
    instead of reading every partial row, and a caught-up read never calls it. The rows
    are the batch query's over the raw rows in both states."""
    strata.create(
        "CREATE STREAM kw (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        "CREATE STREAM kw_minute AS SELECT campaign, count(*) AS n, sum(price) AS s, "
        "window_end AS t FROM TUMBLE(kw, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    strata.create(
        "CREATE STREAM kw_hop AS SELECT campaign, count(*) AS n, window_end AS t "
        "FROM HOP(kw, t, INTERVAL '1 minute', INTERVAL '3 minutes') GROUP BY campaign, window_end"
    )
    rng = random.Random(12)

    def run(minutes: range) -> str:
        return _priced_rows(rng, minutes, campaigns=30, per_minute=20)

    strata.ingest("kw", run(range(120)))
    Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
    strata.ingest("kw", run(range(30, 70, 3)))  # late rows into 14 reduced windows
    minute = "date_bin('1 minute', t, '1970-01-01 00:00:00+00')"
    oracles = {
        "SELECT campaign, n, s, t FROM kw_minute": (
            f"SELECT campaign, count(*), sum(price), {minute} + interval '1 minute' FROM kw "
            f"GROUP BY campaign, {minute}"
        ),
        "SELECT campaign, n, t FROM kw_hop": (
            "SELECT campaign, count(*), e FROM kw, LATERAL (SELECT "
            f"{minute} + interval '1 minute' * k AS e FROM generate_series(1, 3) k) w "
            "GROUP BY campaign, e"
        ),
    }
    key_read = "SELECT t, n, s FROM kw_minute WHERE campaign = 'c7' ORDER BY t"

    def explained(connection: psycopg.Connection) -> str:
        plan = connection.execute("EXPLAIN (ANALYZE, COSTS OFF) " + key_read).fetchall()
        return "\n".join(row[0] for row in plan)

    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        for stream in ("kw_minute", "kw_hop"):
            function = f"strata_internal.{naming.waiting_windows_function(stream)}"
            archive = f"strata_internal.{stream}__partial"
            waiting = connection.execute(f"SELECT * FROM {function}() ORDER BY 1").fetchall()
            distinct = f"SELECT DISTINCT window_start FROM {archive} ORDER BY 1"
            assert len(waiting) > 1 and waiting == connection.execute(distinct).fetchall()
        for view, oracle in oracles.items():
            got = sorted(connection.execute(view).fetchall())
            assert got and got == sorted(connection.execute(oracle).fetchall()), view
        waiting_plan = explained(connection)
        function = naming.waiting_windows_function("kw_minute")
        scans = [line for line in waiting_plan.splitlines() if function in line]
        assert scans and not any("never executed" in line for line in scans), waiting_plan
        # The archive's rows read are c7's (the merge, dead index entries too) and one (does
        # any wait?), never all of them.
        archive_rows = connection.execute(
            "SELECT count(*) FROM strata_internal.kw_minute__partial"
        ).fetchone()
        key_rows = connection.execute(
            "SELECT count(*) FROM strata_internal.kw_minute__partial WHERE key_0 = 'c7'"
        ).fetchone()
        assert archive_rows and key_rows and archive_rows[0] > 4 * key_rows[0] > 0
        read = [
            float(re.search(r" rows=([0-9.]+)", line).group(1))  # type: ignore[union-attr]
            for line in waiting_plan.splitlines()
            if "on kw_minute__partial" in line and "never executed" not in line
        ]
        assert read and max(read) < archive_rows[0] / 4, waiting_plan
        Reducer(strata.service.engine, strata.service.plans, min_rows=0).run_once()
        for view, oracle in oracles.items():
            got = sorted(connection.execute(view).fetchall())
            assert got and got == sorted(connection.execute(oracle).fetchall()), view
        caught_up = explained(connection)
        calls = [
            line for line in caught_up.splitlines() if function in line or "ProjectSet" in line
        ]
        assert calls and all("never executed" in line for line in calls), caught_up


def test_the_reducer_folds_streams_at_once_each_exact(strata: Strata) -> None:
    """With a concurrency of 2 (the default) the reducer folds two streams at the same
    time, each on its own connection: the two first steps meet at a barrier they could not
    both reach one after the other. Every view then equals its batch query, with nothing
    left unfolded; with a concurrency of 1 the barrier is never met."""
    strata.create("CREATE STREAM kp (campaign text, t timestamptz) WITH (event_time = 't')")
    for name, size in (("kp_minute", "1 minute"), ("kp_hour", "1 hour")):
        strata.create(
            f"CREATE STREAM {name} AS SELECT campaign, count(*) AS n, window_end AS t "
            f"FROM TUMBLE(kp, t, INTERVAL '{size}') GROUP BY campaign, window_end"
        )
    rng = random.Random(14)
    body = "".join(
        json.dumps(
            {
                "campaign": f"c{rng.randrange(5)}",
                "t": (START + timedelta(seconds=rng.randrange(4 * 3600))).isoformat(),
            }
        )
        + "\n"
        for _ in range(2000)
    )
    strata.ingest("kp", body)

    class Meeting(Reducer):
        """A reducer whose first step of each stream waits for the other stream's."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.barrier = threading.Barrier(2, timeout=5)
            self.met: set[str] = set()

        def step(self, plan: StreamPlan) -> int:
            if plan.name not in self.met:
                self.met.add(plan.name)
                self.barrier.wait()
            return super().step(plan)

    alone = Meeting(strata.service.engine, strata.service.plans, min_rows=0, concurrency=1)
    assert alone.run_once() == {}  # both steps failed at the broken barrier, nothing folded
    assert alone.barrier.broken
    together = Meeting(strata.service.engine, strata.service.plans, min_rows=0)
    assert together.concurrency == 2
    folded = together.run_once()
    assert folded.keys() == {"kp_minute", "kp_hour"} and all(folded.values()), folded
    for name, size in (("kp_minute", "1 minute"), ("kp_hour", "1 hour")):
        assert strata.query(f"SELECT count(*) FROM strata_internal.{name}__partial") == [(0,)]
        window = f"date_bin('{size}', t, timestamptz 'epoch') + interval '{size}'"
        oracle = f"SELECT campaign, count(*), {window} FROM kp GROUP BY 1, 3"
        assert sorted(strata.query(f"SELECT * FROM {name}")) == sorted(strata.query(oracle))


LISTED = (
    "SELECT window_start, generation FROM strata_internal.waiting_windows "
    "WHERE archive = %s::regclass ORDER BY window_start"
)


def _minute_stream(strata: Strata, raw: str) -> tuple[str, str, Callable[[range], str]]:
    """A raw stream ``raw`` and ``raw``_minute counting and summing per campaign and minute:
    the view's query, its batch query over the raw rows, and rows for some minutes."""
    strata.create(
        f"CREATE STREAM {raw} (campaign text, price numeric(12,4), t timestamptz) "
        "WITH (event_time = 't')"
    )
    strata.create(
        f"CREATE STREAM {raw}_minute AS SELECT campaign, count(*) AS n, sum(price) AS s, "
        f"window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, "
        "window_end"
    )
    rng = random.Random(len(raw))

    def rows(minutes: range) -> str:
        return _priced_rows(rng, minutes, campaigns=5, per_minute=10)

    minute = "date_bin('1 minute', t, '1970-01-01 00:00:00+00')"
    oracle = (
        f"SELECT campaign, count(*), sum(price), {minute} + interval '1 minute' FROM {raw} "
        f"GROUP BY campaign, {minute}"
    )
    return f"SELECT campaign, n, s, t FROM {raw}_minute", oracle, rows


def _exact(strata: Strata, view: str, oracle: str) -> None:
    got = sorted(strata.query(view))
    assert got and got == sorted(strata.query(oracle))


def _wait_for_lock_wait(strata: Strata, query: str, failure: str) -> None:
    """Until a session whose statement is LIKE ``query`` waits for a lock; ``failure``
    is the assertion's message after 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        blocked = strata.query(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            query,
        )
        if blocked[0][0]:
            return
        time.sleep(0.05)
    raise AssertionError(failure)


def _wait_for_blocked_fold(strata: Strata) -> None:
    """Until a fold's statement waits for a row lock (its snapshot is taken)."""
    _wait_for_lock_wait(strata, "%gone AS (DELETE%", "the fold never waited for the held rows")


def test_a_commit_racing_the_fold_keeps_its_window_listed(strata: Strata) -> None:
    """A run that lists a window again while a fold of it runs (after the fold's snapshot,
    before its end) keeps the window listed: the fold unlists only at the generation its
    snapshot shows, and the run's partial rows, which it did not see, are merged on read.
    The view equals the batch query over the raw rows after the race and after the next
    fold. (The fold is held inside its statement by a lock on the window's partial rows,
    and the run commits through the server meanwhile.)"""
    view, oracle, rows = _minute_stream(strata, "rc")
    archive = "strata_internal.rc_minute__partial"
    strata.ingest("rc", rows(range(30)))
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0)
    strictly(reducer)
    assert strata.query(LISTED, archive) == []
    strata.ingest("rc", rows(range(5, 7)))  # late rows in two folded windows
    window = START + timedelta(minutes=5)
    before = dict(strata.query(LISTED, archive))
    assert list(before) == [window, window + timedelta(minutes=1)]
    with psycopg.connect(strata.database_url) as holder:
        holder.execute(f"SELECT 1 FROM {archive} WHERE window_start = %s FOR UPDATE", [window])
        fold = Raising(lambda: strictly(reducer), "fold")
        fold.start()
        _wait_for_blocked_fold(strata)
        strata.ingest("rc", rows(range(5, 6)))  # commits while the fold waits
        assert dict(strata.query(LISTED, archive))[window] == before[window] + 1
        holder.rollback()
    fold.join(timeout=60)
    fold.reraise()
    _exact(strata, view, oracle)
    waiting = strata.query(f"SELECT DISTINCT window_start FROM {archive}")
    assert waiting == [(window,)]  # the run's rows, which the fold did not see
    assert [w for w, _ in strata.query(LISTED, archive)] == [window]
    strictly(reducer)
    assert strata.query(LISTED, archive) == []
    _exact(strata, view, oracle)


def test_a_window_the_fold_cannot_unlist_is_read_exactly_until_a_later_fold_does(
    strata: Strata,
) -> None:
    """A fold does not wait for a listed window's row that a commit holds (a commit may wait
    for the fold's rows): the window stays listed without partial rows, and reads stay
    exact, both when it is older than every partial row (it is not merged then: its rows
    would be read twice) and when it is not (merged from its consolidated rows alone). The
    next fold unlists it."""
    view, oracle, rows = _minute_stream(strata, "sk")
    archive = "strata_internal.sk_minute__partial"
    strata.ingest("sk", rows(range(30)))
    reducer = Reducer(strata.service.engine, strata.service.plans, min_rows=0)
    strictly(reducer)
    strata.ingest("sk", rows(range(5, 6)))
    window = START + timedelta(minutes=5)
    with psycopg.connect(strata.database_url) as holder:
        holder.execute(
            "SELECT 1 FROM strata_internal.waiting_windows WHERE window_start = %s FOR UPDATE",
            [window],
        )
        fold = Raising(lambda: strictly(reducer), "fold")
        fold.start()
        fold.join(timeout=60)
        fold.reraise()
        assert strata.query(f"SELECT count(*) FROM {archive}") == [(0,)]
        assert [w for w, _ in strata.query(LISTED, archive)] == [window]
        _exact(strata, view, oracle)
        strata.ingest("sk", rows(range(10, 11)))  # the held window is older than these
        later = window + timedelta(minutes=5)
        assert [w for w, _ in strata.query(LISTED, archive)] == [window, later]
        _exact(strata, view, oracle)
        strata.ingest("sk", rows(range(3, 4)))  # and newer than these
        _exact(strata, view, oracle)
        holder.rollback()
    strictly(reducer)
    assert strata.query(LISTED, archive) == []
    _exact(strata, view, oracle)


def test_a_drop_waits_for_the_fold_in_flight(strata: Strata) -> None:
    """A DROP STREAM while the reducer's step holds the stream (its catalog row locked FOR
    SHARE, PlanCache.hold) and has not yet run its fold: the DROP waits for the fold to
    commit, then drops the stream. It took the stream's tables first and its catalog row
    last, so the fold waited for the tables and the DROP for the row: PostgreSQL broke the
    deadlock by failing the DROP (a 503 "PostgreSQL is unreachable" in the Flink
    benchmark's Nexmark part)."""
    _view, _oracle, rows = _minute_stream(strata, "dr")
    view = "dr_minute"
    strata.ingest("dr", rows(range(10)))
    with strata.service.engine.connect() as catalog:
        plan = strata.service.plans.load(catalog)[view].plan
    assert isinstance(plan, ParallelAggregatePlan)
    with strata.service.engine.connect() as connection, connection.begin():
        # Reducer.step up to its fold.
        lock_reducer(connection, view)
        assert strata.service.plans.hold(connection, plan)
        drop = Raising(lambda: strata.service.drop_stream(view), "drop")
        drop.start()
        _wait_for_lock_wait(strata, "%streams%", "the DROP never waited")
        driver = connection.connection.driver_connection
        assert driver is not None
        folded = driver.execute(plan.reduce_statement, {"min_rows": 0, "max_groups": 100})
        assert folded.rowcount > 0
    drop.join(timeout=60)
    drop.reraise()
    assert strata.client.get(f"/streams/{view}").status_code == 404
    assert strata.query(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'strata_internal' AND tablename ~ %s",
        f"^{view}__",
    ) == [(0,)]
