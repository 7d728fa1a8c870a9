"""kill -9 of `strata up` while a subscriber follows a stream's changes: inside a commit
after the feed's own writes, and after a commit before its client heard of it. The
subscriber keeps resuming from its last position; it ends with every position exactly
once, in order, and with the view's rows."""

from __future__ import annotations

import random
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import arm, disarm, fired
from tests.test_e2e import Server
from tests.test_feed import RAW, START, Subscriber, assert_positions, run_body, view_rows

pytestmark = pytest.mark.e2e

PER_MINUTE = (
    "CREATE STREAM agg AS SELECT k, count(*) AS c, sum(v) AS s, window_end AS w "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_end"
)
# Joins the user's table dim on read: its feed follows dim's changes too.
BY_OWNER = (
    "CREATE STREAM tagg AS SELECT d.owner, sum(e.v) AS s, window_end AS w "
    "FROM TUMBLE(ev, t, INTERVAL '10 minutes') e JOIN dim d ON d.k = e.k "
    "GROUP BY d.owner, window_end"
)


def _post(server: Server, run_id: str, body: str) -> bool:
    """Post a run and wait for its commit; False when the server died under it."""
    try:
        response = httpx.post(
            f"{server.url}/streams/ev/runs",
            params={"run_id": run_id, "wait": "true"},
            content=body,
            headers={"content-type": "application/x-ndjson"},
            timeout=120,
        )
    except httpx.TransportError:
        return False
    assert response.status_code == 200, response.text
    return True


def test_kill_server_mid_stream_then_resume(tmp_path: Path) -> None:
    rng = random.Random(30)
    bodies = {
        f"r{i}": run_body(
            [(rng.choice("abcd"), rng.randrange(10), rng.randrange(6 * 3600)) for _ in range(5)]
        )
        for i in range(12)
    }
    server = Server(tmp_path / "data")
    subscriber: Subscriber | None = None
    try:
        arm(server, "in_pg_write:server:r5")  # dies inside r5's commit, feed rows written
        server.start()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for statement in (RAW.format(ev="ev"), PER_MINUTE):
                assert client.post("/streams", json={"sql": statement}).status_code == 201
        subscriber = Subscriber(server.url, "agg")
        for i in range(5):
            assert _post(server, f"r{i}", bodies[f"r{i}"])
        assert not _post(server, "r5", bodies["r5"])
        assert server.process is not None and server.process.wait(60) == -signal.SIGKILL
        fired(server, "in_pg_write", "r5")
        arm(server, "after_commit:server:r8")  # dies after r8's commit, before its answer
        server.start()  # r5 was pending: it commits now
        for i in (6, 7):
            assert _post(server, f"r{i}", bodies[f"r{i}"])
        assert not _post(server, "r8", bodies["r8"])
        assert server.process.wait(60) == -signal.SIGKILL
        fired(server, "after_commit", "r8")
        assert subscriber.errors, "the subscriber saw the server go away"
        # This one goes away with the server, and comes back after runs committed without
        # it: Last-Event-ID resumes it exactly where it was.
        subscriber.close()
        seen = list(subscriber.changes)
        disarm(server)
        server.start()
        for i in range(5, 12):  # again: r5 and r8 are committed once, whatever was said
            assert _post(server, f"r{i}", bodies[f"r{i}"])
        subscriber = Subscriber(server.url, "agg", since=subscriber.position, rows=subscriber.rows)
        subscriber.changes[:0] = seen
        last = assert_positions(server.database_url, subscriber)
        assert subscriber.rows == view_rows(server.database_url, "agg", ("w", "k"))
        assert last == len(subscriber.changes) and last >= 12
    finally:
        if subscriber is not None:
            subscriber.close()
        server.close()


def test_kill_server_while_a_table_change_is_announced(tmp_path: Path) -> None:
    """kill -9 inside the transaction that announces a change of a joined table (cause
    ``table``): after the restart, a subscriber resuming from its position gets the
    table's changes once, and its rows are the view's and a Python model's of the runs
    sent and the table's rows."""
    sent = {"r0": [("a", 1, 60), ("b", 2, 60)], "r1": [("a", 3, 700), ("c", 4, 3600)]}
    owners = {"a": "o1", "b": "o2", "c": "o1"}
    server = Server(tmp_path / "data")
    subscriber: Subscriber | None = None
    try:
        arm(server, "feed_table:server:tagg")
        server.start()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            assert client.post("/streams", json={"sql": RAW.format(ev="ev")}).status_code == 201
            with psycopg.connect(server.database_url, autocommit=True) as connection:
                connection.execute("CREATE TABLE dim (k text PRIMARY KEY, owner text)")
                for k, owner in owners.items():
                    connection.execute("INSERT INTO dim VALUES (%s, %s)", (k, owner))
            assert client.post("/streams", json={"sql": BY_OWNER}).status_code == 201
        for run_id, rows in sent.items():
            assert _post(server, run_id, run_body(rows))
        subscriber = Subscriber(server.url, "tagg")
        subscriber.wait_for(0)
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            connection.execute("UPDATE dim SET owner = 'o3' WHERE k = 'a'")  # the ledger's
        owners["a"] = "o3"
        # The subscriber's next poll announces the change, and the server dies inside it.
        assert server.process is not None and server.process.wait(60) == -signal.SIGKILL
        strike = fired(server, "feed_table", "tagg")
        assert subscriber.position < min(strike["in_flight"]["changes"])
        subscriber.close()
        disarm(server)
        server.start()
        subscriber = Subscriber(server.url, "tagg", since=subscriber.position, rows=subscriber.rows)
        deadline = time.monotonic() + 30
        while len(subscriber.changes) < len(strike["in_flight"]["changes"]):
            assert time.monotonic() < deadline, subscriber.changes
            time.sleep(0.1)
        last = assert_positions(server.database_url, subscriber)
        assert {c["cause"] for c in subscriber.changes} == {"table"}
        assert last == len(strike["in_flight"]["changes"])
        assert subscriber.rows == view_rows(server.database_url, "tagg", ("w", "owner"))
        model: dict[tuple[str, str], int] = {}
        for rows in sent.values():
            for k, v, s in rows:
                end = (START + timedelta(seconds=s - s % 600 + 600)).isoformat()
                model[owners[k], end] = model.get((owners[k], end), 0) + v
        assert {
            (r["owner"], datetime.fromisoformat(r["w"]).isoformat()): int(r["s"])
            for r in subscriber.rows.values()
        } == model
    finally:
        if subscriber is not None:
            subscriber.close()
        server.close()
