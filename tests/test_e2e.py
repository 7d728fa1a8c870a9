"""`strata up` as a subprocess, used the way a newcomer would: HTTP, then psql."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from server.engines.embedded_pg import POSTGRES_BIN_PATH
from server.net import free_port

pytestmark = pytest.mark.e2e

IMPSNS = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')"
)
LATE_COUNT = (
    "CREATE STREAM late_count AS SELECT count(*) AS c, window_end "
    "FROM TUMBLE(impsns, t, INTERVAL '1 hour') GROUP BY window_end"
)
COUNT = (
    "CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, window_end AS t "
    "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)


def wait_until(condition: Callable[[], object], what: str, timeout: float = 180.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` was awaited if it does not
    within ``timeout`` seconds. Tests wait for what they can observe, never a fixed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class Server:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_env = env or {}
        self.port = free_port()
        self.pg_port = free_port()  # the SQL port keeps its number across restarts
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"strata-{self.port}.log"
        self.database_url = ""
        self.psql_url = ""

    def start(self, *, wait: bool = True) -> None:
        """Start `strata up`; with ``wait``, until it answers /health."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
        # No start-up warm-up (its CPU would slow the tests down); tests/test_warmup.py
        # has its own.
        env["STRATA_SPARK_WARMUP"] = "0"
        env |= self.extra_env
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "server.cli",
                "up",
                "--port",
                str(self.port),
                "--pg-port",
                str(self.pg_port),
                "--data-dir",
                str(self.data_dir),
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        if not wait:
            return
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-4000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    info = httpx.get(f"{self.url}/info").json()
                    self.database_url, self.psql_url = info["database_url"], info["psql_url"]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("strata up did not become healthy:\n" + self.log.read_text()[-4000:])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop the server if it runs, and a PostgreSQL it left running (after kill -9),
        so that nothing outlives the test."""
        if self.process is not None and self.process.poll() is None:
            self.stop()
        subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "pg_ctl"),
                "-D",
                str(self.data_dir / "postgres/pgdata"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            check=False,
            # As PostgreSQL's own user and group: root's group keeps the group bits of a
            # checkout in a 0700 directory (a mktemp -d), where pg_ctl then cannot run.
            user="strata_pg" if os.geteuid() == 0 else None,
            group="strata_pg" if os.geteuid() == 0 else None,
            extra_groups=[] if os.geteuid() == 0 else None,
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if sig == signal.SIGKILL:
            os.killpg(self.process.pid, signal.SIGKILL)
        else:
            self.process.send_signal(sig)
        return self.process.wait(timeout=90)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    instance = Server(tmp_path / "data")
    instance.start()
    yield instance
    instance.close()


def test_a_newcomer_session(server: Server, tmp_path: Path) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    info = client.get("/info").json()
    database_url = info["database_url"]
    assert database_url.startswith("postgresql://")

    assert client.post("/streams", json={"sql": IMPSNS}).status_code == 201
    assert client.post("/streams", json={"sql": COUNT}).status_code == 201
    body = "".join(
        json.dumps({"campaign": c, "user_id": i, "price": "1.25", "t": f"2024-01-01T00:0{m}:00Z"})
        + "\n"
        for i, (c, m) in enumerate([("a", 0), ("a", 0), ("b", 1), ("a", 2)])
    )
    response = client.post(
        "/streams/impsns/runs?wait=true&run_id=first",
        content=body,
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 200
    assert response.json() == {"run_id": "first", "status": "committed", "rows": 4}
    late = "campaign,user_id,price,t\na,9,2.5,2024-01-01T00:00:30Z\n"
    response = client.post(
        "/streams/impsns/runs?wait=true&run_id=late",
        content=late,
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 200
    assert response.json() == {"run_id": "late", "status": "committed", "rows": 1}

    # psql, the client users have, accepts the URL and sees the views by their names.
    psql = subprocess.run(
        [
            str(POSTGRES_BIN_PATH / "psql"),
            database_url,
            "-At",
            "-c",
            "SELECT campaign || '=' || c FROM impsn_count ORDER BY t, campaign",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert psql.stdout.split() == ["a=3", "b=1", "a=1"]

    # A stream over the history back-fills; `strata backfill-status` shows it.
    assert client.post("/streams", json={"sql": LATE_COUNT}).status_code == 201
    wait_until(
        lambda: client.get("/streams/late_count").json()["progress"]["backfill"]["state"] == "done",
        "the back-fill of late_count to be done",
        timeout=60,
    )
    status = subprocess.run(
        [sys.executable, "-m", "server.cli", "backfill-status", "--data-dir", str(server.data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "late_count" in status.stdout and "100.0%" in status.stdout and "done" in status.stdout
    with psycopg.connect(database_url) as connection:
        assert connection.execute("SELECT sum(c) FROM late_count").fetchone() == (5,)

    # `strata info` agrees with GET /info.
    cli = subprocess.run(
        [sys.executable, "-m", "server.cli", "info", "--data-dir", str(server.data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(cli.stdout)["database_url"] == database_url

    # Clean shutdown on SIGTERM, then a restart on the same data dir keeps everything.
    assert server.stop(signal.SIGTERM) == 0
    server.start()
    with psycopg.connect(database_url) as connection:
        assert connection.execute("SELECT sum(c) FROM impsn_count").fetchone() == (5,)
    retry = httpx.post(
        f"{server.url}/streams/impsns/runs?wait=true&run_id=first",
        content=body,
        headers={"content-type": "application/x-ndjson"},
        timeout=60,
    )
    assert retry.json() == {"run_id": "first", "status": "committed", "rows": 4}


def test_restart_after_kill_9_reuses_running_postgres(server: Server) -> None:
    client = httpx.Client(base_url=server.url, timeout=120)
    database_url = client.get("/info").json()["database_url"]
    assert client.post("/streams", json={"sql": IMPSNS}).status_code == 201
    # kill -9 of the server's process group: the embedded PostgreSQL (its own session)
    # keeps running and leaves its pid file; the next `strata up` must attach to it.
    server.stop(signal.SIGKILL)
    server.start()
    assert httpx.get(f"{server.url}/info").json()["database_url"] == database_url
    assert [s["name"] for s in httpx.get(f"{server.url}/streams").json()] == ["impsns"]


PSQL_TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "getting-started" / "psql.md"


def test_the_psql_tutorial_works_as_written(server: Server, tmp_path: Path) -> None:
    """The psql tutorial of the documentation, run by the real psql against `strata up`
    at the URL `strata info` prints: psql answers what the comments say."""
    block = re.search(r"```sql\n(.*?)```", PSQL_TUTORIAL.read_text(), re.S)
    assert block is not None
    script = block.group(1)
    cli = subprocess.run(
        [sys.executable, "-m", "server.cli", "info", "--data-dir", str(server.data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    psql_url = json.loads(cli.stdout)["psql_url"]
    assert psql_url == server.psql_url
    result = subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), psql_url, "-X", "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=300,
    )
    shown = [line[3:].rstrip() for line in script.splitlines() if line.startswith("-- ")]
    errors = [line for line in shown if line.startswith("ERROR:")]
    answers = [line for line in shown if not line.startswith("ERROR:")]
    assert [line.rstrip() for line in result.stdout.splitlines() if line.strip()] == answers
    said = [line[line.index("ERROR:") :] for line in result.stderr.splitlines() if "ERROR:" in line]
    assert said == errors


def test_kill_9_during_a_copy_then_the_same_copy_counts_once(tmp_path: Path) -> None:
    """The server dies inside the commit of a COPY's run (after the spool, before COMMIT):
    the run is whole or absent after the restart, and the same COPY with its RUN_ID
    completes it once."""
    from tests.crash import arm, disarm, fired  # tests/crash.py builds on this module

    server = Server(tmp_path / "data")
    arm(server, "in_pg_write:server:copy-1")
    server.start()
    try:
        psql = [str(POSTGRES_BIN_PATH / "psql"), server.psql_url, "-X", "-v", "ON_ERROR_STOP=1"]
        for statement in (IMPSNS, COUNT):
            subprocess.run([*psql, "-c", statement], check=True, capture_output=True)
        rows = "".join(f"c{i % 3},{i},1.5,2024-01-01T00:0{i % 10}:00Z\n" for i in range(500))
        data = tmp_path / "run.csv"
        data.write_text("campaign,user_id,price,t\n" + rows)
        copy = f"\\copy impsns FROM '{data}' WITH (FORMAT csv, HEADER, RUN_ID 'copy-1')"
        killed = subprocess.run([*psql, "-c", copy], capture_output=True, text=True, timeout=120)
        assert killed.returncode != 0  # the server died under it: no COPY 500
        assert server.process is not None and server.process.wait(timeout=60) == -signal.SIGKILL
        strike = fired(server, "in_pg_write", "copy-1")
        assert strike["in_flight"]["rows"] == 500
        disarm(server)
        server.start()
        with psycopg.connect(server.database_url) as connection:
            archived = connection.execute("SELECT count(*) FROM impsns").fetchone()
        assert archived in ((0,), (500,))  # the whole run or nothing, never a part
        again = subprocess.run([*psql, "-c", copy], capture_output=True, text=True, timeout=300)
        assert again.stdout.strip() == "COPY 500", again.stderr
        with psycopg.connect(server.database_url) as connection:
            assert connection.execute("SELECT count(*) FROM impsns").fetchone() == (500,)
            assert connection.execute("SELECT sum(c) FROM impsn_count").fetchone() == (500,)
            runs = connection.execute("SELECT count(*) FROM strata_catalog.runs").fetchone()
            assert runs == (1,)
    finally:
        server.close()
