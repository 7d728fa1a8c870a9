"""Stopping `strata up` the ways users and operators do: Ctrl-C in a terminal (SIGINT to
the foreground process group) and `systemctl stop` (SIGTERM to every process of Strata:
the process group, the Spark JVM, PostgreSQL's postmaster and backends), at each phase of
a run and while a back-fill and the reducer run; and kill -9 with no restart.

Each time: exit status 0 within STRATA_SHUTDOWN_TIMEOUT, no process left behind, and after
a restart every acknowledged run committed exactly once and every view equal to its batch
GROUP BY (tests/test_crash.py's checks).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from server.engines.spark import driver_jvm
from server.faults import signal_tree
from tests.crash import NDJSON, Ledger, arm, disarm, fired
from tests.test_crash import (
    DERIVED,
    SLOW,
    _assert_views_equal_oracles,
    _body,
    _create,
    _settle,
    _strike,
)
from tests.test_e2e import Server, wait_until

pytestmark = pytest.mark.e2e

TIMEOUT = 8.0  # STRATA_SHUTDOWN_TIMEOUT's default, which these tests keep
# The time from the signal to the process' exit that the tests allow: the timeout, plus
# the moment the log line that starts the measurement takes to be written and seen.
BOUND = TIMEOUT + 1.0
STOPPING = re.compile(r"(SIGINT|SIGTERM): stopping")


def _leftovers(data_dir: Path) -> list[str]:
    """Processes that still belong to the Strata of ``data_dir``: its PostgreSQL (whose
    cwd is in it), its Spark JVM and its watchdog (whose command lines name it)."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = proc.cwd() if proc.info["name"] == "postgres" else ""
            command = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if cwd.startswith(str(data_dir)) or str(data_dir) in command:
            found.append(f"{proc.info['pid']} {proc.info['name']}: {command[:120]}")
    return found


def _assert_nothing_left(data_dir: Path, within: float = 3.0) -> None:
    # The watchdog notices within its poll interval that PostgreSQL is stopped and unused.
    deadline = time.monotonic() + within
    while (left := _leftovers(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def _wait_for_stop(server: Server) -> float:
    """Wait for `strata up` to exit after a stop signal; return the seconds from the log
    line the signal causes to the exit, having checked the exit status is 0."""
    assert server.process is not None
    deadline = time.monotonic() + 120
    while not STOPPING.search(server.log.read_text(errors="replace")):
        exited = server.process.poll() is not None
        assert not exited or STOPPING.search(server.log.read_text()), "exited, no signal"
        assert time.monotonic() < deadline, "no stop signal came"
        time.sleep(0.02)
    seen = time.monotonic()
    code = server.process.wait(timeout=60)
    took = time.monotonic() - seen
    assert code == 0, server.log.read_text()[-4000:]
    assert "Traceback" not in _stop_log(server), _stop_log(server)
    return took


def _stop_log(server: Server) -> str:
    """The log from the (last) stop signal on."""
    log = server.log.read_text(errors="replace")
    return log[[m.start() for m in STOPPING.finditer(log)][-1] :]


def _signal_from_outside(server: Server, target: str) -> None:
    """What a terminal (sigint) or systemd (sigterm) sends to a running Strata."""
    assert server.process is not None
    if target == "sigint":
        os.killpg(server.process.pid, signal.SIGINT)
        return
    jvm = driver_jvm(server.process.pid)
    postmaster = (server.data_dir / "postgres" / "pgdata" / "postmaster.pid").read_text()
    os.killpg(server.process.pid, signal.SIGTERM)
    signal_tree(jvm.pid if jvm else 0, signal.SIGTERM)
    signal_tree(int(postmaster.split()[0]), signal.SIGTERM)


# CI signals once at every phase of a run, one signal or the other; `pytest -m slow`
# covers the rest of the matrix.
@pytest.mark.parametrize(
    ("target", "phases"),
    [
        ("sigterm", ("in_spark", "after_spool")),
        ("sigint", ("in_pg_write", "after_commit")),
        pytest.param("sigterm", ("in_pg_write", "after_commit"), marks=SLOW),
        pytest.param("sigint", ("after_spool", "in_spark"), marks=SLOW),
    ],
)
def test_stop_signal_at_each_phase(tmp_path: Path, target: str, phases: tuple[str, ...]) -> None:
    rng = random.Random(11)
    ledger = Ledger()
    server = Server(tmp_path / "data", env={"STRATA_REDUCE_INTERVAL": "1"})
    posted: set[str] = set()
    try:
        for i, phase in enumerate(phases):
            arm(server, f"{phase}:{target}:{phase}")
            server.start()  # after the first: the restart that settles the previous phase
            if i == 0:
                _create(httpx.Client(base_url=server.url, timeout=60), *DERIVED)
            else:
                print(target, phases[i - 1], _settle(server, ledger, posted))
            posted = _strike(server, ledger, rng, phase)
            took = _wait_for_stop(server)
            fired(server, phase, phase)  # the signal came at the phase, the run in flight
            print(f"{target} at {phase}: stopped in {took:.1f}s")
            assert took <= BOUND
            _assert_nothing_left(server.data_dir)
        disarm(server)
        server.start()
        print(target, phases[-1], _settle(server, ledger, posted))
    finally:
        server.close()


@pytest.mark.parametrize("target", ["sigterm", pytest.param("sigint", marks=SLOW)])
def test_stop_signal_during_backfill_and_reduction(tmp_path: Path, target: str) -> None:
    rng = random.Random(5)
    server = Server(
        tmp_path / "data",
        env={
            "STRATA_REDUCE_INTERVAL": "0.2",
            "STRATA_REDUCE_MIN_ROWS": "1",
            "STRATA_BACKFILL_CHUNK_ROWS": "2000",
        },
    )
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        _create(client)
        for _ in range(12):
            client.post(
                "/streams/ev/runs?wait=true", content=_body(rng, 2000), headers=NDJSON
            ).raise_for_status()
        # A back-fill over 24,000 rows, runs still arriving, the reducer folding.
        client.post("/streams", json={"sql": DERIVED["per_min"][0]}).raise_for_status()
        acknowledged = [
            client.post("/streams/ev/runs", content=_body(rng, 500), headers=NDJSON)
            for _ in range(3)
        ]
        for response in acknowledged:
            assert response.status_code == 202, response.text
            assert response.json()["status"] in ("pending", "committed"), response.text

        def backfill() -> dict[str, object]:
            return client.get("/streams/per_min").json()["progress"]["backfill"]  # type: ignore[no-any-return]

        wait_until(lambda: backfill()["rows_done"], "the back-fill to be under way", timeout=60)
        before = backfill()
        _signal_from_outside(server, target)
        took = _wait_for_stop(server)
        print(f"{target} with back-fill at {before['rows_done']} of 24000 rows: {took:.1f}s")
        assert took <= BOUND
        _assert_nothing_left(server.data_dir)

        server.start()
        client = httpx.Client(base_url=server.url, timeout=120)
        wait_until(
            lambda: backfill()["state"] == "done", "the back-fill to finish after the restart"
        )
        for response in acknowledged:
            run_id = response.json()["run_id"]
            wait_until(
                lambda run_id=run_id: client.get(f"/runs/{run_id}").json()["status"] != "pending",
                f"run {run_id} to be committed after the restart",
            )
            assert client.get(f"/runs/{run_id}").json()["status"] == "committed"
        with psycopg.connect(server.database_url) as connection:
            assert connection.execute("SELECT count(*) FROM ev").fetchone() == (25500,)
        _assert_views_equal_oracles(server.database_url, ["per_min"])
    finally:
        server.close()


def test_stop_signal_during_start_up(tmp_path: Path) -> None:
    """Ctrl-C while Spark starts: the start-up ends there, and what had started stops."""
    server = Server(tmp_path / "data")
    try:
        server.start(wait=False)
        process = server.process
        assert process is not None
        # Spark's JVM launched, the session not yet made.
        wait_until(
            lambda: driver_jvm(process.pid) is not None or process.poll() is not None,
            "strata up to launch Spark's JVM",
            timeout=120,
        )
        assert process.poll() is None, server.log.read_text()[-4000:]
        os.killpg(process.pid, signal.SIGINT)
        took = _wait_for_stop(server)
        assert took <= BOUND
        _assert_nothing_left(server.data_dir)
        # The start-up ended there: the server never served.
        assert "SQL port listening" not in server.log.read_text(errors="replace")
    finally:
        server.close()


def test_a_failed_postgresql_start_ends_sparks_start_too(tmp_path: Path) -> None:
    """Spark starts beside PostgreSQL (server/runtime.py): when PostgreSQL cannot start,
    `strata up` exits with PostgreSQL's error and leaves no JVM behind."""
    server = Server(tmp_path / "data")
    try:
        server.start()
        server.stop()
        with (server.data_dir / "postgres/pgdata/postgresql.conf").open("a") as conf:
            conf.write("shared_buffers = 'lots'\n")
        server.start(wait=False)
        assert server.process is not None
        assert server.process.wait(timeout=120) != 0
        log = server.log.read_text(errors="replace")
        started = log.rindex("starting Spark")
        assert "shared_buffers" in log[started:], log[started:]
        assert "SQL port listening" not in log[started:]
        _assert_nothing_left(server.data_dir)
    finally:
        server.close()


def test_kill_9_and_no_restart_stops_postgres_after_the_linger(tmp_path: Path) -> None:
    linger = 2.0
    server = Server(tmp_path / "data", env={"STRATA_POSTGRES_LINGER": str(linger)})
    try:
        server.start()
        pgdata = server.data_dir / "postgres" / "pgdata"
        postmaster = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        server.stop(signal.SIGKILL)
        killed = time.monotonic()
        assert postmaster.is_running()  # kept for a restart, for now
        postmaster.wait(timeout=linger + 10)
        print(f"PostgreSQL stopped {time.monotonic() - killed:.1f}s after the kill")
        assert time.monotonic() - killed >= linger
        assert not (pgdata / "postmaster.pid").exists()  # a clean stop, not a crash
        _assert_nothing_left(server.data_dir)
        log = (server.data_dir / "postgres" / "watchdog.log").read_text()
        assert f"unused for {linger:g}s: stopping it" in log
    finally:
        server.close()


def _copy_in_flight(database_url: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as connection:
        found = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            """AND query LIKE 'COPY "strata_internal"."ev__raw"%'"""
        ).fetchone()
    return found is not None and found[0] > 0


@pytest.mark.parametrize(
    ("target", "moment", "rows"),
    [
        # CI: each moment once, at a tenth of the load.
        ("sigterm", "spark", 100_000),
        ("sigint", "copy", 100_000),
        *(
            pytest.param(target, moment, 1_000_000, marks=SLOW)
            for target in ("sigterm", "sigint")
            for moment in ("spark", "copy")
        ),
    ],
)
def test_stop_under_load(tmp_path: Path, target: str, moment: str, rows: int) -> None:
    """The stop while a run of ``rows`` rows is computed by Spark (``spark``) or copied
    into PostgreSQL (``copy``), a back-fill over 0.3 ``rows`` rows runs and the reducer
    folds; prints the time it took (docs/operations/stopping.md, from the 1,000,000-row runs)."""
    rng = random.Random(3)
    ledger = Ledger()
    server = Server(
        tmp_path / "data",
        env={"STRATA_REDUCE_INTERVAL": "0.5", "STRATA_BACKFILL_CHUNK_ROWS": str(rows // 50)},
    )
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=300)
        _create(client, "per_min")
        for i in range(3):
            ledger.post(server.url, f"history-{i}", _body(rng, rows // 10), wait=True)
        ledger.post(server.url, "big", _body(rng, rows), wait=False)
        # The back-fill of a new stream over the history, beside the big run's Spark job.
        client.post("/streams", json={"sql": DERIVED["per_hour"][0]}).raise_for_status()
        assert {"history-0", "history-1", "history-2", "big"} <= ledger.acknowledged
        deadline = time.monotonic() + 300
        if moment == "spark":
            jvm = driver_jvm(server.process.pid)  # type: ignore[union-attr]
            assert jvm is not None
            # Once the back-fill is under way, as soon as Spark is busy.
            while (
                client.get("/streams/per_hour").json()["progress"]["backfill"]["rows_done"] == 0
                or jvm.cpu_percent(0.2) < 50
            ):
                assert time.monotonic() < deadline
        else:
            while not _copy_in_flight(server.database_url):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        backfill = client.get("/streams/per_hour").json()["progress"]["backfill"]
        _signal_from_outside(server, target)
        took = _wait_for_stop(server)
        print(
            f"{target} while {moment} busy, back-fill at {backfill['rows_done']:,} of "
            f"{backfill['rows_total']:,} rows: stopped in {took:.1f}s"
        )
        assert took <= BOUND
        _assert_nothing_left(server.data_dir)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=300)
        while client.get("/streams/per_hour").json()["progress"]["backfill"]["state"] != "done":
            assert time.monotonic() < deadline + 300
            time.sleep(0.5)
        print(_settle(server, ledger, set(ledger.bodies)))
    finally:
        server.close()
