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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

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
NDJSON = {"content-type": "application/x-ndjson"}


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


def _post(url: str, stream: str, run_id: str, body: str, *, wait: bool) -> bool:
    try:
        response = httpx.post(
            f"{url}/streams/{stream}/runs",
            params={"run_id": run_id, "wait": "true" if wait else "false"},
            content=body,
            headers=NDJSON,
            timeout=120,
        )
    except httpx.TransportError:
        return False  # the server died under the request
    return response.status_code in (200, 202)


@pytest.mark.parametrize("target", ["server", "postgres", "spark"])
def test_kill_while_a_join_batch_commits(tmp_path: Path, target: str) -> None:
    rng = random.Random(5)
    trigger = f"join-{target}"
    phase = "in_spark" if target == "spark" else "in_pg_write"
    server = Server(tmp_path / "data", env={"STRATA_FAULT": f"{phase}:{target}:{trigger}"})
    server.start()
    bodies: dict[str, tuple[str, str]] = {}
    acknowledged: set[str] = set()
    try:
        client = httpx.Client(base_url=server.url, timeout=60)
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            for statement in TABLE:
                connection.execute(statement)  # type: ignore[arg-type]
        for statement in STREAMS:
            client.post("/streams", json={"sql": statement}).raise_for_status()
        for i in range(8):  # history on both sides
            stream, column = ("ls", "v") if i % 2 else ("rs", "w")
            bodies[f"before-{i}"] = (stream, _body(rng, column))
            assert _post(server.url, stream, f"before-{i}", bodies[f"before-{i}"][1], wait=True)
            acknowledged.add(f"before-{i}")
        # The trigger, a run of ls, commits while runs of both sides keep arriving.
        bodies[trigger] = ("ls", _body(rng, "v"))
        outcome: list[bool] = []
        waiting = threading.Thread(
            target=lambda: outcome.append(
                _post(server.url, "ls", trigger, bodies[trigger][1], wait=True)
            )
        )
        waiting.start()
        for i in range(6):
            time.sleep(0.2)
            stream, column = ("rs", "w") if i % 2 == 0 else ("ls", "v")
            bodies[f"during-{i}"] = (stream, _body(rng, column))
            if _post(server.url, stream, f"during-{i}", bodies[f"during-{i}"][1], wait=False):
                acknowledged.add(f"during-{i}")
        waiting.join()
        if outcome[0]:
            acknowledged.add(trigger)
        if target == "server":
            assert server.process is not None
            assert server.process.wait(timeout=60) == -signal.SIGKILL
            del server.extra_env["STRATA_FAULT"]
            server.start()
            client = httpx.Client(base_url=server.url, timeout=60)
        # Every acknowledged run commits without a retry; the others are posted again
        # with their run ids (what the server took commits once).
        deadline = time.monotonic() + 180
        statuses: dict[str, str] = {}
        while time.monotonic() < deadline:
            statuses = {
                run_id: (r.json()["status"] if r.status_code == 200 else "unknown")
                for run_id in bodies
                for r in [client.get(f"/runs/{run_id}")]
            }
            if "pending" not in statuses.values():
                break
            time.sleep(0.3)
        assert {statuses[r] for r in acknowledged} == {"committed"}, statuses
        for run_id, (stream, body) in bodies.items():
            assert _post(server.url, stream, run_id, body, wait=True), run_id
        with psycopg.connect(server.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for view, oracle in ORACLES.items():
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
                assert got == want, view
            rows = connection.execute("SELECT count(*) FROM lr").fetchone()
        assert rows is not None and rows[0] > 100
    finally:
        server.close()
