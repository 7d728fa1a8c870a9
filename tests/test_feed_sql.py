"""The change feed over the SQL port: DECLARE ... CURSOR FOR SUBSCRIBE with a FETCH that
waits for changes, and COPY (SUBSCRIBE ...) TO STDOUT, whose rows psql prints as they come
and which a cancel request (psql's Ctrl-C, psycopg's cancel()) ends with SQLSTATE 57014."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors

from tests.conftest import Strata
from tests.test_feed import RAW, run_body
from tests.test_pgwire import PSQL

PER_MINUTE = (
    "CREATE STREAM agg AS SELECT k, count(*) AS c, sum(v) AS s, window_end AS w "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_end"
)
README = Path(__file__).resolve().parents[1] / "README.md"
COLUMNS = ["position", "op", "key", "old", "new", "late", "lateness_seconds", "revision", "cause"]


@pytest.fixture
def streams(strata: Strata) -> Strata:
    strata.create(RAW.format(ev="ev"))
    strata.create(PER_MINUTE)
    return strata


def test_cursor_fetch_waits_and_resumes(streams: Strata) -> None:
    strata = streams
    strata.ingest("ev", run_body([("a", 1, 30)]), run_id="first")
    with psycopg.connect(strata.psql_url) as connection:  # a transaction, as psycopg opens
        cursor = connection.cursor()
        cursor.execute("DECLARE c CURSOR FOR SUBSCRIBE agg")
        cursor.execute("FETCH ALL c WITH (timeout = '1s')")
        assert [d.name for d in cursor.description or []] == COLUMNS
        snapshot = cursor.fetchall()
        assert [(r[0], r[1], r[4]["c"], r[8]) for r in snapshot] == [(0, "insert", 1, "snapshot")]
        started = time.monotonic()
        cursor.execute("FETCH 10 c WITH (timeout = '300ms')")
        assert cursor.fetchall() == [] and time.monotonic() - started >= 0.3
        fetched: dict[str, list] = {}

        def fetch() -> None:  # waits for the run below
            cursor.execute("FETCH ALL FROM c WITH (timeout = '60s')")
            fetched["rows"] = cursor.fetchall()

        waiting = threading.Thread(target=fetch)
        waiting.start()
        time.sleep(1.0)
        assert waiting.is_alive(), "FETCH returned before any change"
        strata.ingest("ev", run_body([("a", 2, 7200), ("a", 3, 40)]), run_id="second")
        waiting.join(timeout=60)
        changes = fetched["rows"]
        by_op = {(r[1], r[2]["k"]): r for r in changes}
        update = by_op[("update", "a")]
        assert sorted(r[0] for r in changes) == [1, 2]  # the run's two changes, once each
        assert by_op[("insert", "a")][2]["w"] != update[2]["w"]  # the window 2 hours on
        assert update[3]["c"] == 1 and update[4]["c"] == 2 and update[4]["s"] == 4
        # The first minute had not ended at the watermark (30 s): a change, not a late one.
        assert update[5] is False and update[8] == "run"
        cursor.execute("CLOSE c")
        connection.commit()
        # A PostgreSQL cursor of the same session is still PostgreSQL's.
        cursor.execute("DECLARE p CURSOR FOR SELECT 1 AS one")
        cursor.execute("FETCH ALL p")
        assert cursor.fetchall() == [(1,)]
    with psycopg.connect(strata.psql_url, autocommit=True) as connection:
        cursor = connection.cursor()
        cursor.execute("DECLARE r CURSOR FOR SUBSCRIBE agg SINCE 1")
        cursor.execute("FETCH ALL r WITH (timeout = '1s')")
        resumed = cursor.fetchall()
        assert [r[0] for r in resumed] == [2]
        with pytest.raises(psycopg.Error) as gone:
            cursor.execute("DECLARE g CURSOR FOR SUBSCRIBE agg SINCE 50")
        assert gone.value.sqlstate == "55000"
        with pytest.raises(psycopg.Error) as raw:
            cursor.execute("DECLARE x CURSOR FOR SUBSCRIBE ev")
        assert raw.value.sqlstate == "0A000"


def test_copy_subscribe_streams_until_canceled(streams: Strata) -> None:
    strata = streams
    strata.ingest("ev", run_body([("a", 1, 30)]), run_id="first")
    received: list[tuple[str, ...]] = []
    failure: list[BaseException] = []
    connection = psycopg.connect(strata.psql_url, autocommit=True)

    def follow() -> None:
        try:
            with connection.cursor().copy("COPY (SUBSCRIBE agg) TO STDOUT") as copy:
                for row in copy.rows():
                    received.append(row)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            failure.append(error)

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        _wait(lambda: len(received) >= 1)
        strata.ingest("ev", run_body([("b", 5, 35)]), run_id="second")
        _wait(lambda: len(received) >= 2)
        assert received[0][1] == "insert" and received[0][8] == "snapshot"
        assert received[1][:2] == ("1", "insert") and received[1][8] == "run"
        connection.cancel_safe(timeout=30)  # cancel() holds the GIL: the port is in-process
        reader.join(timeout=30)
        assert not reader.is_alive()
        assert failure and isinstance(failure[0], pg_errors.QueryCanceled), failure
        # The session is usable after the cancel.
        assert connection.execute("SELECT 2").fetchone() == (2,)
    finally:
        connection.close()


def test_psql_prints_rows_as_they_come(streams: Strata) -> None:
    strata = streams
    strata.ingest("ev", run_body([("z", 1, 30)]), run_id="zero")  # the snapshot's row
    # psql's output on a terminal, as a user sees it (a pipe would be block-buffered).
    terminal, psql_side = pty.openpty()
    process = subprocess.Popen(
        [str(PSQL), strata.psql_url, "-X", "-c", "COPY (SUBSCRIBE agg) TO STDOUT"],
        stdin=subprocess.DEVNULL,
        stdout=psql_side,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(psql_side)
    shown = os.fdopen(terminal, "r", errors="replace")
    try:
        snapshot = shown.readline().rstrip("\r\n").split("\t")
        assert snapshot[1] == "insert" and snapshot[-1] == "snapshot", snapshot
        strata.ingest("ev", run_body([("a", 1, 30)]), run_id="one")
        line = shown.readline()  # printed while the COPY still runs
        fields = line.rstrip("\r\n").split("\t")
        assert fields[0] == "1" and fields[1] == "insert" and fields[-1] == "run", line
        strata.ingest("ev", run_body([("a", 1, 31)]), run_id="two")
        assert shown.readline().split("\t")[1] == "update"
        process.send_signal(signal.SIGINT)  # Ctrl-C: psql sends a cancel request
        _, errors = process.communicate(timeout=30)
        assert "canceling statement due to user request" in errors
    finally:
        if process.poll() is None:
            process.kill()
        shown.close()


def test_the_readmes_python_client_prints_changes_as_they_come(strata: Strata) -> None:
    """The README's Change feed example, run as written against its own stream: it prints
    the snapshot, then each run's changes while its FETCH loop goes on."""
    section = README.read_text().split("## Change feed", 1)[1].split("\n## ", 1)[0]
    (client,) = re.findall(r"```python\n(.*?)```", section, re.S)
    strata.create(
        "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), "
        "t timestamptz) WITH (event_time = 't')"
    )
    strata.create(
        "CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
        "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') "
        "GROUP BY campaign, window_end"
    )
    row = '{{"campaign": "shoes", "user_id": {u}, "price": 0.25, "t": "2026-11-21T10:00:05Z"}}\n'
    strata.ingest("impsns", row.format(u=1), run_id="first")
    process = subprocess.Popen(
        [sys.executable, "-u", "-c", client],
        env={**os.environ, "PSQL_URL": strata.psql_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        snapshot = process.stdout.readline()
        assert snapshot.startswith("(0, 'insert', {'t': ") and "'snapshot')" in snapshot, (
            snapshot + (process.stderr.read() if process.poll() is not None else "")
        )
        strata.ingest("impsns", row.format(u=2), run_id="second")
        update = process.stdout.readline()  # printed while the loop still runs
        assert update.startswith("(1, 'update', ") and "'c': 2" in update, update
        assert "'run')" in update and process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=30)


def _wait(condition, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
