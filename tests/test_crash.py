"""Kill -9 at every phase of a run and mid-back-fill; after recovery every view still equals
a batch query over the raw archive, and every acknowledged run counts exactly once.

The crash matrix: the whole `strata up` process group, PostgreSQL alone and the Spark JVM
alone, each killed at each phase of a run (server/faults.py: after spooling, in the Spark
job, in the PostgreSQL write, after the commit but before the client hears of it), plus
PostgreSQL and the JVM killed from outside, between runs and mid-job.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql

from rewriter.naming import (
    CATALOG_SCHEMA,
    INTERNAL_SCHEMA,
    REDUCED_RUN,
    RUN_COLUMN,
    partial_archive_table,
)
from server.engines.spark import driver_jvm
from server.faults import RUN_PHASES, Fault, kill_tree, parse
from tests.crash import (
    NDJSON,
    Ledger,
    arm,
    assert_pending_when_struck,
    check_ledger,
    disarm,
    fired,
    postmaster_pid,
    statuses,
    wait_until_settled,
)
from tests.test_e2e import Server
from tests.test_order_independence import _normalise, _window

pytestmark = pytest.mark.e2e

START = datetime(2024, 9, 1, tzinfo=UTC)
RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
# Each derived stream with its oracle: the same query as a plain GROUP BY over the raw rows.
DERIVED = {
    "per_min": (
        "CREATE STREAM per_min AS SELECT k, count(*) AS c, sum(v) AS s, window_start "
        "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start",
        f"SELECT k, count(*), sum(v), {_window(60)} AS w FROM ev GROUP BY k, w",
    ),
    "per_hour": (
        "CREATE STREAM per_hour AS SELECT k, sum(c) AS c, sum(s) AS s, window_start "
        "FROM TUMBLE(per_min, window_start, INTERVAL '1 hour') GROUP BY k, window_start",
        f"SELECT k, count(*)::numeric, sum(v), {_window(3600)} AS w FROM ev GROUP BY k, w",
    ),
}
SLOW = pytest.mark.slow


def _body(rng: random.Random, rows: int) -> str:
    return "".join(
        json.dumps(
            {
                "k": rng.choice("abcd"),
                "v": rng.randrange(1000),
                "t": (START + timedelta(seconds=rng.randrange(3600))).isoformat(),
            }
        )
        + "\n"
        for _ in range(rows)
    )


def _create(client: httpx.Client, *streams: str) -> None:
    for statement in (RAW, *(DERIVED[s][0] for s in streams)):
        client.post("/streams", json={"sql": statement}).raise_for_status()


def _assert_views_equal_oracles(database_url: str, streams: list[str]) -> None:
    with psycopg.connect(database_url) as connection:
        for name in streams:
            view = connection.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(name)))
            oracle = connection.execute(DERIVED[name][1])  # type: ignore[arg-type]
            assert _normalise(view.fetchall()) == _normalise(oracle.fetchall()), name


def _strike(server: Server, ledger: Ledger, rng: random.Random, trigger: str) -> set[str]:
    """Post the run ``trigger`` that trips the fault, waiting for it, while runs keep
    arriving without waiting: some are acknowledged before the kill, some are not.
    Returns the run ids posted."""
    bodies = [_body(rng, 300) for _ in range(6)]
    waiting = threading.Thread(
        target=ledger.post, args=(server.url, trigger, bodies[0]), kwargs={"wait": True}
    )
    waiting.start()
    posted = {trigger}
    for i, body in enumerate(bodies[1:]):
        time.sleep(0.25)
        posted.add(f"{trigger}-{i}")
        ledger.post(server.url, f"{trigger}-{i}", body, wait=False)
    waiting.join()
    return posted


def _check_archives(
    database_url: str, ledger: Ledger, streams: Sequence[str] = tuple(DERIVED)
) -> int:
    """The set check of the raw archive against the ledger; no partial rows of a run not
    committed; every view equals its oracle. Returns the raw rows."""
    totals = check_ledger(database_url, ledger)
    runs = sql.Identifier(CATALOG_SCHEMA, "runs")
    run = sql.Identifier(RUN_COLUMN)
    partials = [sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(n)) for n in streams]
    with psycopg.connect(database_url) as connection:
        committed = sql.SQL("SELECT seq FROM {} WHERE status = 'committed'").format(runs)
        for table in partials:
            strays = connection.execute(
                sql.SQL("SELECT count(*) FROM {t} WHERE {run} <> %s AND {run} NOT IN ({c})").format(
                    t=table, run=run, c=committed
                ),
                (REDUCED_RUN,),
            ).fetchone()
            assert strays == (0,), f"rows of runs not committed in {table.as_string()}"
    _assert_views_equal_oracles(database_url, list(streams))
    return totals.get("ev", 0)


def _settle(
    server: Server, ledger: Ledger, posted: set[str], streams: Sequence[str] = tuple(DERIVED)
) -> str:
    """After a kill: acknowledged runs commit with no retry, runs the server had taken
    commit too, nothing is half-visible, and retrying every run with its run id changes
    nothing but completes the runs the server never took. Says what happened."""
    client = httpx.Client(base_url=server.url, timeout=120)
    found = wait_until_settled(client, set(ledger.bodies))
    assert {found[r] for r in ledger.acknowledged} <= {"committed"}, found
    assert set(found.values()) <= {"committed", "unknown"}, found
    before = _check_archives(server.database_url, ledger, streams)

    def retry(run_id: str, wait: bool) -> httpx.Response:
        return client.post(
            "/streams/ev/runs",
            params={"run_id": run_id, "wait": "true" if wait else "false"},
            content=ledger.bodies[run_id][1],
            headers=NDJSON,
        )

    for run_id in sorted(posted & ledger.acknowledged):  # retrying changes nothing
        assert retry(run_id, True).json() == {
            "run_id": run_id,
            "status": "committed",
            "rows": ledger.rows(run_id),
        }
    assert _check_archives(server.database_url, ledger, streams) == before
    unknown = {r for r, s in found.items() if s == "unknown"}
    acknowledged = len(posted & ledger.acknowledged)
    for run_id in unknown:  # all at once: one Spark job for them all
        assert retry(run_id, False).status_code == 202
    assert set(wait_until_settled(client, unknown).values()) <= {"committed"}
    ledger.acknowledged |= posted
    total = _check_archives(server.database_url, ledger, streams)
    assert total == sum(ledger.rows(r) for r in ledger.bodies)
    return (
        f"{len(posted)} runs: {acknowledged} acknowledged, all committed without retry; "
        f"{len(posted) - acknowledged - len(unknown)} unacknowledged but committed; "
        f"{len(unknown)} unknown to the server until retried"
    )


def test_fault_spec() -> None:
    assert parse("in_spark:server:a, after_commit:postgres:b:c, backfill_chunk:spark:m@3") == [
        Fault("in_spark", "server", "a"),
        Fault("after_commit", "postgres", "b:c"),
        Fault("backfill_chunk", "spark", "m", 3),
    ]
    for wrong in ("in_spark:server", "later:server:a", "in_spark:jvm:a", "repair:server:m@x"):
        with pytest.raises(ValueError, match="phase:target:key"):
            parse(wrong)


def test_kill_server_at_each_phase(tmp_path: Path) -> None:
    """kill -9 of the whole process group at each phase of a run, then restart: each strike
    is shown to have killed `strata up` and its JVM while the trigger was in flight."""
    rng = random.Random(7)
    ledger = Ledger()
    server = Server(tmp_path / "data", env={"STRATA_REDUCE_INTERVAL": "1"})
    struck: list[tuple[str, dict]] = []
    posted: set[str] = set()
    try:
        for i, phase in enumerate(RUN_PHASES):
            arm(server, f"{phase}:server:{phase}")
            server.start()  # after the first: the restart that settles the previous phase
            if i == 0:
                _create(httpx.Client(base_url=server.url, timeout=60), *DERIVED)
            else:
                print("server", RUN_PHASES[i - 1], _settle(server, ledger, posted))
            posted = _strike(server, ledger, rng, phase)
            assert server.process is not None
            assert server.process.wait(timeout=60) == -signal.SIGKILL
            strike = fired(server, phase, phase)
            assert server.process.pid in strike["pids"]
            struck.append((phase, strike))
        disarm(server)
        server.start()
        print("server", RUN_PHASES[-1], _settle(server, ledger, posted))
        for phase, strike in struck:
            assert_pending_when_struck(server, strike, phase)
    finally:
        server.close()


def _kill_from_outside(server: Server, target: str) -> int:
    """SIGKILL PostgreSQL or the Spark JVM from outside; returns the pid killed."""
    if target == "postgres":
        pid = postmaster_pid(server)
        kill_tree(pid)
        return pid
    assert server.process is not None
    jvm = driver_jvm(server.process.pid)
    assert jvm is not None
    if target == "spark-mid-job":
        deadline = time.monotonic() + 30
        while jvm.cpu_percent(0.2) < 50:  # until the job keeps the JVM busy
            assert time.monotonic() < deadline, "the JVM never got busy with the job"
    kill_tree(jvm.pid)
    return jvm.pid


def _current_pid(server: Server, target: str) -> int:
    if target == "postgres":
        return postmaster_pid(server)
    assert server.process is not None
    jvm = driver_jvm(server.process.pid)
    assert jvm is not None, "no Spark JVM runs"
    return jvm.pid


@pytest.mark.parametrize(
    ("target", "outside"), [("postgres", ["postgres"]), ("spark", ["spark", "spark-mid-job"])]
)
def test_kill_postgres_or_spark_at_each_phase(
    tmp_path: Path, target: str, outside: list[str]
) -> None:
    """kill -9 of PostgreSQL alone or of the Spark JVM alone, at each phase of a run and
    from outside (between runs; mid-job): the server starts again what died and carries on.
    Each kill is shown to have struck: the process the server used is gone, and the one it
    uses afterwards is another."""
    rng = random.Random(8)
    ledger = Ledger()
    server = Server(tmp_path / "data", env={"STRATA_REDUCE_INTERVAL": "1"})
    arm(server, ",".join(f"{phase}:{target}:{target}-{phase}" for phase in RUN_PHASES))
    server.start()
    try:
        _create(httpx.Client(base_url=server.url, timeout=60), *DERIVED)
        for phase in RUN_PHASES:
            trigger = f"{target}-{phase}"
            before = _current_pid(server, target)
            posted = _strike(server, ledger, rng, trigger)
            print(target, phase, _settle(server, ledger, posted))
            strike = fired(server, phase, trigger)
            assert strike["pids"] == [before]
            assert _current_pid(server, target) != before
            assert_pending_when_struck(server, strike, trigger)
        for where in outside:
            if where == "spark-mid-job":  # a large run keeps the JVM busy for a while
                posted = {where}
                assert ledger.post(server.url, where, _body(rng, 200_000), wait=False)
                killed = _kill_from_outside(server, where)
                assert _statuses(server, where) == "pending", "the job ended before the kill"
            else:  # between runs: the next run finds it gone
                killed = _kill_from_outside(server, where)
                posted = _strike(server, ledger, rng, f"{where}-outside")
            print(where, "from outside", _settle(server, ledger, posted))
            assert _current_pid(server, target) != killed
        assert server.process is not None and server.process.poll() is None
    finally:
        server.close()


def _statuses(server: Server, run_id: str) -> str:
    client = httpx.Client(base_url=server.url, timeout=60)
    return statuses(client, {run_id})[run_id]


def _backfill(client: httpx.Client) -> dict:
    return client.get("/streams/per_min").json()["progress"]["backfill"]  # type: ignore[no-any-return]


def test_kill_inside_a_backfill_chunk_and_a_reducer_fold(tmp_path: Path) -> None:
    """kill -9 of the whole server inside the third chunk of a back-fill (two committed,
    ten to go), and, after the restart, inside a fold of the reducer: after each the
    back-fill resumes where it was, and the view equals its oracle, every row once."""
    rng = random.Random(1)
    ledger = Ledger()
    server = Server(
        tmp_path / "data",
        env={
            "STRATA_REDUCE_INTERVAL": "0.2",
            "STRATA_REDUCE_MIN_ROWS": "1",
            # 12 chunks of one run each.
            "STRATA_BACKFILL_CHUNK_ROWS": "2000",
        },
    )
    arm(server, "backfill_chunk:server:per_min@3")
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _create(client)
        for i in range(12):
            assert ledger.post(server.url, f"history-{i}", _body(rng, 2000), wait=True)
        # Back-fill of a new stream over 24,000 rows, runs still arriving.
        client.post("/streams", json={"sql": DERIVED["per_min"][0]}).raise_for_status()
        for i in range(3):
            ledger.post(server.url, f"during-{i}", _body(rng, 500), wait=True)
        assert server.process is not None
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        chunk = fired(server, "backfill_chunk", "per_min")
        assert len(chunk["in_flight"]["runs"]) == 1 and chunk["in_flight"]["rows"] == 2000
        # PostgreSQL outlives the kill (it lingers for a restart): the chunks before it are
        # kept, the third is not.
        with psycopg.connect(server.database_url) as connection:
            done = connection.execute(
                "SELECT done_rows FROM strata_catalog.backfills WHERE stream = 'per_min'"
            ).fetchone()
        assert done == (4000,)

        arm(server, "reduce_fold:server:per_min")
        server.start()
        for i in range(3):
            ledger.post(server.url, f"after-{i}", _body(rng, 500), wait=False)
        assert server.process.wait(timeout=120) == -signal.SIGKILL
        fired(server, "reduce_fold", "per_min")

        disarm(server)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        deadline = time.monotonic() + 120
        while (progress := _backfill(client))["state"] != "done":
            assert time.monotonic() < deadline, progress
            time.sleep(0.2)
        assert progress["rows_total"] == 24000
        print(_settle(server, ledger, set(ledger.bodies), streams=["per_min"]))
    finally:
        server.close()
