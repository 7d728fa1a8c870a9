"""What the crash tests share: a ledger of every run sent and acknowledged, the set check of
the archives against it, and the proof that a fault fired where the test says, with work in
flight (server/faults.py writes one JSON line per strike to STRATA_FAULT_LOG)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil
import psycopg
from psycopg import sql

from rewriter.naming import CATALOG_SCHEMA, INTERNAL_SCHEMA, RUN_COLUMN, raw_archive_table
from server.faults import LOG_ENV, RUN_PHASES

if TYPE_CHECKING:  # tests/test_e2e.py uses these helpers too
    from tests.test_e2e import Server

NDJSON = {"content-type": "application/x-ndjson"}


@dataclass
class Ledger:
    """Every run a test posted (stream and body), and which of them the server acknowledged
    (202 or 200)."""

    bodies: dict[str, tuple[str, str]] = field(default_factory=dict)
    acknowledged: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, url: str, run_id: str, body: str, *, wait: bool, stream: str = "ev") -> bool:
        """Post a run; True when the server acknowledged it."""
        with self.lock:
            self.bodies[run_id] = (stream, body)
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
        if response.status_code not in (200, 202):
            return False
        assert response.json()["run_id"] == run_id, response.text
        with self.lock:
            self.acknowledged.add(run_id)
        return True

    def rows(self, run_id: str) -> int:
        return self.bodies[run_id][1].count("\n")

    def streams(self) -> set[str]:
        return {stream for stream, _ in self.bodies.values()}


def statuses(client: httpx.Client, run_ids: set[str]) -> dict[str, str]:
    found = {}
    for run_id in run_ids:
        response = client.get(f"/runs/{run_id}")
        found[run_id] = response.json()["status"] if response.status_code == 200 else "unknown"
    return found


def wait_until_settled(client: httpx.Client, run_ids: set[str]) -> dict[str, str]:
    """The runs' statuses once none is pending (at most three minutes)."""
    deadline = time.monotonic() + 180
    while True:
        found = statuses(client, run_ids)
        if "pending" not in found.values():
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def check_ledger(database_url: str, ledger: Ledger) -> dict[str, int]:
    """The set check of the raw archives against the ledger: every run the server knows has
    the rows the test sent, archived completely if committed and not at all otherwise;
    nothing in an archive that no run of the ledger sent. Returns the raw rows per stream."""
    runs = sql.Identifier(CATALOG_SCHEMA, "runs")
    run = sql.Identifier(RUN_COLUMN)
    totals = {}
    with psycopg.connect(database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for stream in sorted(ledger.streams()):
            raw = sql.Identifier(INTERNAL_SCHEMA, raw_archive_table(stream))
            per_run = connection.execute(
                sql.SQL(
                    "SELECT r.run_id, r.status, r.rows, count(e.{run}) FROM {runs} r "
                    "LEFT JOIN {raw} e ON e.{run} = r.seq WHERE r.stream = %s GROUP BY 1, 2, 3"
                ).format(run=run, runs=runs, raw=raw),
                (stream,),
            ).fetchall()
            committed = 0
            for run_id, status, rows, archived in per_run:
                assert run_id in ledger.bodies, f"run {run_id} of {stream}: no client sent it"
                assert rows == ledger.rows(run_id), run_id
                assert archived == (rows if status == "committed" else 0), (run_id, status)
                committed += archived
            ids = [run_id for run_id, status, _, _ in per_run if status == "committed"]
            twice = sorted({run_id for run_id in ids if ids.count(run_id) > 1})
            assert not twice, f"runs of {stream} committed twice: {twice}"
            total = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(raw)).fetchone()
            assert total == (committed,), f"{stream}: rows of no committed run in the archive"
            totals[stream] = committed
    return totals


def committed_at(database_url: str, run_id: str) -> datetime:
    with psycopg.connect(database_url) as connection:
        found = connection.execute(
            sql.SQL("SELECT committed_at FROM {} WHERE run_id = %s AND status = %s").format(
                sql.Identifier(CATALOG_SCHEMA, "runs")
            ),
            (run_id, "committed"),
        ).fetchone()
    assert found is not None, f"run {run_id} is not committed"
    return found[0]  # type: ignore[no-any-return]


def arm(server: Server, spec: str) -> None:
    """Arm the faults of ``spec`` for the server's next start, logging each strike."""
    server.extra_env["STRATA_FAULT"] = spec
    server.extra_env[LOG_ENV] = str(fault_log(server))


def disarm(server: Server) -> None:
    server.extra_env.pop("STRATA_FAULT", None)


def fault_log(server: Server) -> Path:
    return server.data_dir.parent / "faults.jsonl"


def fired(server: Server, phase: str, key: str, *, within: float = 0) -> dict:
    """The strike at ``phase`` of ``key``, as the server logged it before striking: it had
    processes to signal, they are gone now, and it held work in flight. Waits up to
    ``within`` seconds for the strike."""
    deadline = time.monotonic() + within
    while True:
        path = fault_log(server)
        strikes = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        found = [s for s in strikes if s["phase"] == phase and s["key"] == key]
        if found or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert len(found) == 1, f"the fault at {phase} of {key} fired {len(found)} times: {strikes}"
    strike = found[0]
    assert strike["pids"], f"the fault at {phase} of {key} had no process to signal"
    if strike["target"] in ("server", "postgres", "spark"):
        deadline = time.monotonic() + 30
        while alive := [p for p in strike["pids"] if _alive(p)]:
            assert time.monotonic() < deadline, f"{alive} outlived the kill at {phase}"
            time.sleep(0.1)
    in_flight = strike["in_flight"]
    if phase in RUN_PHASES:
        assert key in strike["keys"] and in_flight["rows"] > 0, strike
    elif phase in ("reduce_fold", "backfill_chunk"):
        assert in_flight["rows"] > 0, strike
    elif phase in ("materialize", "repair"):
        assert in_flight["windows"], strike
    elif phase in ("sink_write", "sink_produce", "sink_progress", "sink_delivered"):
        assert in_flight["changes"] > 0, strike
    elif phase == "join_refresh":  # the joined rows written anew, not committed
        assert in_flight["tables"], strike
    elif phase == "feed_table":  # the positions of the table's changes, not committed
        assert in_flight["changes"], strike
    return strike  # type: ignore[no-any-return]


def struck_at(strike: dict) -> datetime:
    return datetime.fromtimestamp(strike["at"], UTC)


def assert_pending_when_struck(server: Server, strike: dict, run_id: str) -> None:
    """``run_id`` was not committed when the fault struck: it commits in a transaction
    that starts afterwards (``committed_at`` is the transaction's start). Except where the
    strike came inside the commit transaction and did not abort it (the JVM killed in the
    PostgreSQL write), and after ``after_commit``: then that transaction began before."""
    committed = committed_at(server.database_url, run_id)
    before = strike["phase"] == "after_commit" or (
        strike["phase"] == "in_pg_write" and strike["target"] == "spark"
    )
    if before:
        assert committed <= struck_at(strike), (committed, strike)
    else:
        assert committed > struck_at(strike), (committed, strike)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def postmaster_pid(server: Server) -> int:
    pidfile = server.data_dir / "postgres" / "pgdata" / "postmaster.pid"
    return int(pidfile.read_text().split()[0])
