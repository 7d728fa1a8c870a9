"""Kill -9 while a join batch commits: of the whole server, of PostgreSQL alone, of the Spark
JVM alone. After recovery (and retrying what the server never took) the join and the
streams built on it equal their batch queries: no pair lost, none doubled. So do running
totals, sessions, a top-N and a query over a subquery, of a raw stream and of the join."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import (
    Ledger,
    arm,
    assert_pending_when_struck,
    check_ledger,
    disarm,
    fired,
    wait_until_settled,
)
from tests.oracle import canonical
from tests.test_e2e import Server

pytestmark = pytest.mark.e2e

START = datetime(2024, 9, 1, tzinfo=UTC)
STREAMS = (
    "CREATE STREAM ls (k integer, v integer, t timestamptz) WITH (event_time = 't')",
    "CREATE STREAM rs (k integer, w integer, t timestamptz) WITH (event_time = 't')",
    "CREATE STREAM lr AS SELECT l.k, l.v, r.w, r.t FROM ls l JOIN rs r ON l.k = r.k",
    "CREATE STREAM lr_hourly AS SELECT k, count(*) AS n, sum(w) AS w, window_start "
    "FROM TUMBLE(lr, t, INTERVAL '1 hour') GROUP BY k, window_start",
    # Serial (gather points): MAX over COUNT over the join, an aggregate over a LEFT join.
    "CREATE STREAM lr_top AS SELECT max(n) AS top, window_start "
    "FROM TUMBLE(lr_hourly, window_start, INTERVAL '2 hours') GROUP BY window_start",
    "CREATE STREAM lr_left AS SELECT l.k, r.w, l.t FROM ls l LEFT JOIN rs r ON l.k = r.k",
    "CREATE STREAM lr_left_hourly AS SELECT count(*) AS n, count(w) AS matched, window_start "
    "FROM TUMBLE(lr_left, t, INTERVAL '1 hour') GROUP BY window_start",
    # Joined with the table dim on read: a raw stream's and a join stream's partials.
    "CREATE STREAM ls_by_group AS SELECT d.g, count(*) AS n, sum(l.v) AS v, window_start "
    "FROM TUMBLE(ls, t, INTERVAL '1 hour') l JOIN dim d ON d.k = l.k GROUP BY d.g, window_start",
    "CREATE STREAM lr_by_group AS SELECT d.g, sum(j.w) AS w, window_end FROM TUMBLE(lr, t, "
    "INTERVAL '1 hour') j LEFT JOIN dim d ON d.k = j.k GROUP BY d.g, window_end",
    # Running totals (partials per run), of a stream and of a join (its companion stream),
    # and the streams computed on read: sessions, a top-N, a query over a subquery.
    "CREATE STREAM ls_totals AS SELECT k, count(*) AS n, sum(v) AS v FROM ls GROUP BY k",
    "CREATE STREAM lr_totals AS SELECT l.k, count(*) AS n, max(r.w) AS top "
    "FROM ls l JOIN rs r ON l.k = r.k GROUP BY l.k",
    "CREATE STREAM ls_sessions AS SELECT k, count(*) AS n, window_start, window_end "
    "FROM SESSION(ls, t, INTERVAL '10 minutes') GROUP BY k, window_start, window_end",
    "CREATE STREAM ls_top AS SELECT * FROM (SELECT k, v, t, ROW_NUMBER() OVER "
    "(PARTITION BY k ORDER BY v DESC, t) AS rn FROM ls) x WHERE rn <= 2",
    "CREATE STREAM lr_busiest AS SELECT max(n) AS top, count(*) AS keys FROM (SELECT l.k, "
    "count(*) AS n FROM ls l JOIN rs r ON l.k = r.k GROUP BY l.k) c",
)
TABLE = (
    "CREATE TABLE dim (k integer PRIMARY KEY, g integer)",
    "INSERT INTO dim SELECT k, k % 3 FROM generate_series(0, 14) k",
)
ORACLES = {
    "SELECT k, v, w, t FROM lr": "SELECT l.k, l.v, r.w, r.t FROM ls l JOIN rs r ON l.k = r.k",
    "SELECT k, n, w, window_start FROM lr_hourly": (
        "SELECT l.k, count(*), sum(r.w), date_bin('1 hour', r.t, timestamptz 'epoch') "
        "FROM ls l JOIN rs r ON l.k = r.k GROUP BY 1, 4"
    ),
    "SELECT top, window_start FROM lr_top": (
        "SELECT max(n), date_bin('2 hours', w, timestamptz 'epoch') FROM (SELECT count(*) AS n, "
        "date_bin('1 hour', r.t, timestamptz 'epoch') AS w FROM ls l JOIN rs r ON l.k = r.k "
        "GROUP BY l.k, 2) c GROUP BY 2"
    ),
    "SELECT n, matched, window_start FROM lr_left_hourly": (
        "SELECT count(*), count(r.w), date_bin('1 hour', l.t, timestamptz 'epoch') "
        "FROM ls l LEFT JOIN rs r ON l.k = r.k GROUP BY 3"
    ),
    "SELECT g, n, v, window_start FROM ls_by_group": (
        "SELECT d.g, count(*), sum(l.v), date_bin('1 hour', l.t, timestamptz 'epoch') "
        "FROM ls l JOIN dim d ON d.k = l.k GROUP BY 1, 4"
    ),
    "SELECT g, w, window_end FROM lr_by_group": (
        "SELECT d.g, sum(r.w), date_bin('1 hour', r.t, timestamptz 'epoch') + interval '1 hour' "
        "FROM ls l JOIN rs r ON l.k = r.k LEFT JOIN dim d ON d.k = l.k GROUP BY 1, 3"
    ),
    "SELECT k, n, v FROM ls_totals": "SELECT k, count(*), sum(v) FROM ls GROUP BY k",
    "SELECT k, n, top FROM lr_totals": (
        "SELECT l.k, count(*), max(r.w) FROM ls l JOIN rs r ON l.k = r.k GROUP BY l.k"
    ),
    "SELECT k, n, window_start, window_end FROM ls_sessions": (
        "SELECT k, count(*), min(t), max(t) + INTERVAL '10 minutes' FROM (SELECT k, t, "
        "sum(fresh) OVER (PARTITION BY k ORDER BY t) AS s FROM (SELECT k, t, CASE WHEN "
        "t - lag(t) OVER (PARTITION BY k ORDER BY t) < INTERVAL '10 minutes' THEN 0 ELSE 1 "
        "END AS fresh FROM ls) m) n GROUP BY k, s"
    ),
    "SELECT k, v, t, rn FROM ls_top": (
        "SELECT * FROM (SELECT k, v, t, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC, t) "
        "AS rn FROM ls) x WHERE rn <= 2"
    ),
    "SELECT top, keys FROM lr_busiest": (
        "SELECT max(n), count(*) FROM (SELECT l.k, count(*) AS n FROM ls l JOIN rs r "
        "ON l.k = r.k GROUP BY l.k) c"
    ),
}


def _body(rng: random.Random, column: str) -> str:
    rows = [
        {
            "k": rng.randrange(20),
            column: rng.randrange(100),
            "t": (START + timedelta(seconds=rng.randrange(7200))).isoformat(),
        }
        for _ in range(rng.randrange(20, 60))
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _sent(ledger: Ledger, stream: str) -> list[dict]:
    return [
        json.loads(line)
        for run_stream, body in ledger.bodies.values()
        if run_stream == stream
        for line in body.splitlines()
    ]


def _joined(ledger: Ledger) -> list[tuple]:
    """The inner join ls ⋈ rs on k of every row the test sent, computed in Python: an
    oracle that a run archived twice (or lost) cannot fool, as it fools a batch query over
    the archives."""
    by_key: dict[int, list[dict]] = {}
    for right in _sent(ledger, "rs"):
        by_key.setdefault(right["k"], []).append(right)
    return canonical(
        [
            (left["k"], left["v"], right["w"], datetime.fromisoformat(right["t"]))
            for left in _sent(ledger, "ls")
            for right in by_key.get(left["k"], [])
        ]
    )


@pytest.mark.parametrize("target", ["server", "postgres", "spark"])
def test_kill_while_a_join_batch_commits(tmp_path: Path, target: str) -> None:
    rng = random.Random(5)
    trigger = f"join-{target}"
    phase = "in_spark" if target == "spark" else "in_pg_write"
    server = Server(tmp_path / "data")
    arm(server, f"{phase}:{target}:{trigger}")
    server.start()
    ledger = Ledger()
    try:
        client = httpx.Client(base_url=server.url, timeout=60)
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            for statement in TABLE:
                connection.execute(statement)  # type: ignore[arg-type]
        for statement in STREAMS:
            client.post("/streams", json={"sql": statement}).raise_for_status()
        for i in range(8):  # history on both sides
            stream, column = ("ls", "v") if i % 2 else ("rs", "w")
            assert ledger.post(
                server.url, f"before-{i}", _body(rng, column), wait=True, stream=stream
            )
        # The trigger, a run of ls, commits while runs of both sides keep arriving.
        waiting = threading.Thread(
            target=ledger.post,
            args=(server.url, trigger, _body(rng, "v")),
            kwargs={"wait": True, "stream": "ls"},
        )
        waiting.start()
        for i in range(6):
            time.sleep(0.2)
            stream, column = ("rs", "w") if i % 2 == 0 else ("ls", "v")
            ledger.post(server.url, f"during-{i}", _body(rng, column), wait=False, stream=stream)
        waiting.join()
        if target == "server":
            assert server.process is not None
            assert server.process.wait(timeout=60) == -signal.SIGKILL
        strike = fired(server, phase, trigger, within=60)
        assert trigger in strike["keys"]
        if target == "server":
            disarm(server)
            server.start()
            client = httpx.Client(base_url=server.url, timeout=60)
        # Every acknowledged run commits without a retry; the others are posted again
        # with their run ids (what the server took commits once).
        found = wait_until_settled(client, set(ledger.bodies))
        assert {found[r] for r in ledger.acknowledged} == {"committed"}, found
        assert set(found.values()) <= {"committed", "unknown"}, found
        check_ledger(server.database_url, ledger)
        for run_id, (stream, body) in sorted(ledger.bodies.items()):
            assert ledger.post(server.url, run_id, body, wait=True, stream=stream), run_id
        assert_pending_when_struck(server, strike, trigger)
        # The set check: every run sent is archived once, whole.
        totals = check_ledger(server.database_url, ledger)
        for stream in ("ls", "rs"):
            assert totals[stream] == len(_sent(ledger, stream)), stream
        with psycopg.connect(server.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            joined = canonical(connection.execute("SELECT k, v, w, t FROM lr").fetchall())
            for view, oracle in ORACLES.items():
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
                assert got == want, view
        assert joined == _joined(ledger), "the join differs from the pairs of the rows sent"
        assert len(joined) > 100
    finally:
        server.close()


# The streams of the kill in the reducer's rewrite of joined rows: dim joined on read.
JOINED = ("ls", "rs", "lr", "ls_by_group", "lr_by_group")


def _current(database_url: str, stream: str) -> bool:
    """Whether ``stream``'s joined rows follow dim's current version (rewriter/build_joined)."""
    seen = f"strata_internal.{stream}__joined_seen"
    with psycopg.connect(database_url) as connection:
        row = connection.execute(
            f"SELECT coalesce((SELECT max(seen) FROM {seen}) = (SELECT sum(version) FROM "  # type: ignore[arg-type]
            "strata_catalog.table_versions WHERE relation = 'dim'::regclass), false)"
        ).fetchone()
    return bool(row and row[0])


def _until(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout:g} s"
        time.sleep(0.2)


def test_kill_while_the_reducer_writes_joined_rows_anew(tmp_path: Path) -> None:
    """kill -9 of the whole server inside the reducer's rewrite of ls_by_group's joined rows
    after dim changed (its second; the first came with the stream), runs arriving: the
    rewrite is rolled back with the fold of its step (PostgreSQL outlives the kill and
    still has the rows of before, not current, so the views join on read). After the
    restart every acknowledged run is archived once and the streams joining dim equal
    their batch queries, their joined rows written anew and equal to the views."""
    rng = random.Random(8)
    ledger = Ledger()
    server = Server(
        tmp_path / "data",
        env={"STRATA_REDUCE_INTERVAL": "0.2", "STRATA_REDUCE_MIN_ROWS": "0"},
    )
    arm(server, "join_refresh:server:ls_by_group@2")
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=60)
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            for statement in TABLE:
                connection.execute(statement)  # type: ignore[arg-type]
        for statement in STREAMS:
            if statement.split()[2] in JOINED:
                client.post("/streams", json={"sql": statement}).raise_for_status()
        for i in range(6):
            stream, column = ("ls", "v") if i % 2 else ("rs", "w")
            assert ledger.post(
                server.url, f"before-{i}", _body(rng, column), wait=True, stream=stream
            )
        _until(lambda: _current(server.database_url, "ls_by_group"), "written")
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            connection.execute("UPDATE dim SET g = g + 1 WHERE k % 2 = 0")
        for i in range(4):
            stream, column = ("ls", "v") if i % 2 else ("rs", "w")
            ledger.post(server.url, f"during-{i}", _body(rng, column), wait=False, stream=stream)
        assert server.process is not None
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        strike = fired(server, "join_refresh", "ls_by_group")
        assert strike["in_flight"]["tables"] == ["dim"]
        assert not _current(server.database_url, "ls_by_group")  # rolled back

        disarm(server)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=60)
        found = wait_until_settled(client, set(ledger.bodies))
        assert {found[r] for r in ledger.acknowledged} == {"committed"}, found
        for run_id, (stream, body) in sorted(ledger.bodies.items()):
            assert ledger.post(server.url, run_id, body, wait=True, stream=stream), run_id
        totals = check_ledger(server.database_url, ledger)
        for stream in ("ls", "rs"):
            assert totals[stream] == len(_sent(ledger, stream)), stream
        for stream in ("ls_by_group", "lr_by_group"):
            _until(lambda s=stream: _current(server.database_url, s), f"{stream} written")
        kept = {
            "SELECT g, n, v, window_start FROM ls_by_group": (
                "SELECT g, n, v, window_start FROM strata_internal.ls_by_group__joined"
            ),
            "SELECT g, w, window_end FROM lr_by_group": (
                "SELECT g, w, window_end FROM strata_internal.lr_by_group__joined"
            ),
        }
        with psycopg.connect(server.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            waiting = connection.execute(
                "SELECT EXISTS (SELECT FROM strata_internal.ls_by_group__partial)"
            ).fetchone()
            for view, joined in kept.items():
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(ORACLES[view]).fetchall())  # type: ignore[arg-type]
                assert got == want and len(got) > 5, view
                if waiting == (False,) and view.endswith("ls_by_group"):
                    assert got == canonical(connection.execute(joined).fetchall()), view  # type: ignore[arg-type]
    finally:
        server.close()
