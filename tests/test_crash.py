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
from dataclasses import dataclass, field
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
    raw_archive_table,
)
from server.engines.spark import driver_jvm
from server.faults import PHASES, Fault, kill_tree, parse
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
NDJSON = {"content-type": "application/x-ndjson"}
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


@dataclass
class Ledger:
    """Every run a test posted, and which of them the server acknowledged (202 or 200)."""

    bodies: dict[str, str] = field(default_factory=dict)
    acknowledged: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, url: str, run_id: str, body: str, *, wait: bool) -> None:
        with self.lock:
            self.bodies[run_id] = body
        try:
            response = httpx.post(
                f"{url}/streams/ev/runs",
                params={"run_id": run_id, "wait": "true" if wait else "false"},
                content=body,
                headers=NDJSON,
                timeout=120,
            )
        except httpx.TransportError:
            return  # the server died under the request
        if response.status_code in (200, 202):
            with self.lock:
                self.acknowledged.add(run_id)

    def rows(self, run_id: str) -> int:
        return self.bodies[run_id].count("\n")


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


def _statuses(client: httpx.Client, run_ids: set[str]) -> dict[str, str]:
    found = {}
    for run_id in run_ids:
        response = client.get(f"/runs/{run_id}")
        found[run_id] = response.json()["status"] if response.status_code == 200 else "unknown"
    return found


def _wait_until_settled(client: httpx.Client, run_ids: set[str]) -> dict[str, str]:
    deadline = time.monotonic() + 180
    while True:
        statuses = _statuses(client, run_ids)
        if "pending" not in statuses.values():
            return statuses
        assert time.monotonic() < deadline, statuses
        time.sleep(0.2)


def _check_archives(database_url: str, ledger: Ledger) -> int:
    """A run is in every archive completely or not at all; returns the raw rows."""
    raw = sql.Identifier(INTERNAL_SCHEMA, raw_archive_table("ev"))
    runs = sql.Identifier(CATALOG_SCHEMA, "runs")
    run = sql.Identifier(RUN_COLUMN)
    partials = [sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(n)) for n in DERIVED]
    with psycopg.connect(database_url) as connection:
        per_run = connection.execute(
            sql.SQL(
                "SELECT r.run_id, r.status, r.rows, count(e.{run}) FROM {runs} r "
                "LEFT JOIN {raw} e ON e.{run} = r.seq GROUP BY 1, 2, 3"
            ).format(run=run, runs=runs, raw=raw)
        ).fetchall()
        for run_id, status, rows, archived in per_run:
            assert rows == ledger.rows(run_id), run_id
            assert archived == (rows if status == "committed" else 0), (run_id, status)
        committed = sql.SQL("SELECT seq FROM {} WHERE status = 'committed'").format(runs)
        for table in [raw, *partials]:
            strays = connection.execute(
                sql.SQL("SELECT count(*) FROM {t} WHERE {run} <> %s AND {run} NOT IN ({c})").format(
                    t=table, run=run, c=committed
                ),
                (REDUCED_RUN,),
            ).fetchone()
            assert strays == (0,), f"rows of runs not committed in {table.as_string()}"
        total = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(raw)).fetchone()
    assert total is not None
    _assert_views_equal_oracles(database_url, list(DERIVED))
    return int(total[0])


def _settle(server: Server, ledger: Ledger, posted: set[str]) -> str:
    """After a kill: acknowledged runs commit with no retry, runs the server had taken
    commit too, nothing is half-visible, and retrying every run with its run id changes
    nothing but completes the runs the server never took. Says what happened."""
    client = httpx.Client(base_url=server.url, timeout=120)
    statuses = _wait_until_settled(client, set(ledger.bodies))
    assert {statuses[r] for r in ledger.acknowledged} <= {"committed"}, statuses
    assert set(statuses.values()) <= {"committed", "unknown"}, statuses
    before = _check_archives(server.database_url, ledger)

    def retry(run_id: str, wait: bool) -> httpx.Response:
        return client.post(
            "/streams/ev/runs",
            params={"run_id": run_id, "wait": "true" if wait else "false"},
            content=ledger.bodies[run_id],
            headers=NDJSON,
        )

    for run_id in sorted(posted & ledger.acknowledged):  # retrying changes nothing
        assert retry(run_id, True).json() == {
            "run_id": run_id,
            "status": "committed",
            "rows": ledger.rows(run_id),
        }
    assert _check_archives(server.database_url, ledger) == before
    unknown = {r for r, s in statuses.items() if s == "unknown"}
    acknowledged = len(posted & ledger.acknowledged)
    for run_id in unknown:  # all at once: one Spark job for them all
        assert retry(run_id, False).status_code == 202
    assert set(_wait_until_settled(client, unknown).values()) <= {"committed"}
    ledger.acknowledged |= posted
    total = _check_archives(server.database_url, ledger)
    assert total == sum(ledger.rows(r) for r in ledger.bodies)
    return (
        f"{len(posted)} runs: {acknowledged} acknowledged, all committed without retry; "
        f"{len(posted) - acknowledged - len(unknown)} unacknowledged but committed; "
        f"{len(unknown)} unknown to the server until retried"
    )


def test_fault_spec() -> None:
    assert parse("in_spark:server:a, after_commit:postgres:b:c") == [
        Fault("in_spark", "server", "a"),
        Fault("after_commit", "postgres", "b:c"),
    ]
    for wrong in ("in_spark:server", "later:server:a", "in_spark:jvm:a"):
        with pytest.raises(ValueError, match="phase:target:run_id"):
            parse(wrong)


# CI kills at a subset of the phases; `pytest -m slow` covers the rest of the matrix.
@pytest.mark.parametrize(
    "phases",
    [("after_commit",), pytest.param(("after_spool", "in_spark", "in_pg_write"), marks=SLOW)],
)
def test_kill_server_at_each_phase(tmp_path: Path, phases: tuple[str, ...]) -> None:
    """kill -9 of the whole process group at each phase, then restart."""
    rng = random.Random(7)
    ledger = Ledger()
    server = Server(tmp_path / "data", env={"STRATA_REDUCE_INTERVAL": "1"})
    posted: set[str] = set()
    try:
        for i, phase in enumerate(phases):
            server.extra_env["STRATA_FAULT"] = f"{phase}:server:{phase}"
            server.start()  # after the first: the restart that settles the previous phase
            if i == 0:
                _create(httpx.Client(base_url=server.url, timeout=60), *DERIVED)
            else:
                print("server", phases[i - 1], _settle(server, ledger, posted))
            posted = _strike(server, ledger, rng, phase)
            assert server.process is not None
            assert server.process.wait(timeout=60) == -signal.SIGKILL
        del server.extra_env["STRATA_FAULT"]
        server.start()
        print("server", phases[-1], _settle(server, ledger, posted))
    finally:
        server.close()


def _kill_from_outside(server: Server, target: str) -> None:
    if target == "postgres":
        postmaster = server.data_dir / "postgres" / "pgdata" / "postmaster.pid"
        kill_tree(int(postmaster.read_text().split()[0]))
        return
    assert server.process is not None
    jvm = driver_jvm(server.process.pid)
    assert jvm is not None
    if target == "spark-mid-job":
        deadline = time.monotonic() + 30
        while jvm.cpu_percent(0.2) < 50 and time.monotonic() < deadline:
            pass  # until the job keeps the JVM busy
    kill_tree(jvm.pid)


@pytest.mark.parametrize(
    ("faults", "outside"),
    [
        (
            [("postgres", "in_pg_write"), ("postgres", "after_commit"), ("spark", "in_spark")],
            ["postgres"],
        ),
        pytest.param(
            [("postgres", "after_spool"), ("postgres", "in_spark")]
            + [("spark", p) for p in PHASES if p != "in_spark"],
            ["spark", "spark-mid-job"],
            marks=SLOW,
        ),
    ],
)
def test_kill_postgres_or_spark_at_each_phase(
    tmp_path: Path, faults: list[tuple[str, str]], outside: list[str]
) -> None:
    """kill -9 of PostgreSQL alone or of the Spark JVM alone, at phases of a run and from
    outside (between runs; mid-job): the server starts again what died and carries on."""
    rng = random.Random(8)
    ledger = Ledger()
    spec = ",".join(f"{phase}:{target}:{target}-{phase}" for target, phase in faults)
    server = Server(tmp_path / "data", env={"STRATA_FAULT": spec, "STRATA_REDUCE_INTERVAL": "1"})
    server.start()
    try:
        _create(httpx.Client(base_url=server.url, timeout=60), *DERIVED)
        for target, phase in faults:
            posted = _strike(server, ledger, rng, f"{target}-{phase}")
            print(target, phase, _settle(server, ledger, posted))
        for target in outside:
            if target == "spark-mid-job":  # a large run keeps the JVM busy for a while
                posted = {target}
                ledger.post(server.url, target, _body(rng, 200_000), wait=False)
                assert target in ledger.acknowledged
                _kill_from_outside(server, target)
            else:  # between runs: the next run finds it gone
                _kill_from_outside(server, target)
                posted = _strike(server, ledger, rng, f"{target}-outside")
            print(target, "from outside", _settle(server, ledger, posted))
        assert server.process is not None and server.process.poll() is None
    finally:
        server.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_during_backfill_and_reduction(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    server = Server(
        tmp_path / "data",
        env={
            "STRATA_REDUCE_INTERVAL": "0.2",
            "STRATA_REDUCE_MIN_ROWS": "1",
            # 12 chunks of one run: the kill lands mid-back-fill more often than not.
            "STRATA_BACKFILL_CHUNK_ROWS": "2000",
        },
    )
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120)
        _create(client)
        for _ in range(12):
            client.post(
                "/streams/ev/runs?wait=true", content=_body(rng, 2000), headers=NDJSON
            ).raise_for_status()
        # Back-fill of a new stream over 24,000 rows, runs still arriving, reducer folding.
        client.post("/streams", json={"sql": DERIVED["per_min"][0]}).raise_for_status()
        for _ in range(3):
            client.post(
                "/streams/ev/runs?wait=true", content=_body(rng, 500), headers=NDJSON
            ).raise_for_status()
        time.sleep(rng.uniform(0.0, 1.5))
        before = client.get("/streams/per_min").json()["progress"]["backfill"]
        server.stop(signal.SIGKILL)

        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = client.get("/streams/per_min").json()["progress"]["backfill"]
            if progress["state"] == "done":
                break
            time.sleep(0.2)
        assert progress["state"] == "done"
        assert progress["rows_total"] == 24000
        print("killed with back-fill at", before["rows_done"], "of 24000 rows")
        time.sleep(0.5)  # let the reducer run after the restart, too
        with psycopg.connect(server.database_url) as connection:
            raw = connection.execute("SELECT count(*) FROM ev").fetchone()
        assert raw == (25500,)
        _assert_views_equal_oracles(server.database_url, ["per_min"])
    finally:
        server.close()
