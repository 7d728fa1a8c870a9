"""Elastic compute: Spark workers join and leave a standalone cluster while runs flow into
`strata up`, and nothing is lost or counted twice.

A cluster of one worker (one core) on loopback, started by the test with
server/engines/cluster.py; a `strata up` whose Spark driver is an application of it;
clients post runs all along. Meanwhile a second worker joins (it gets an executor, which
runs tasks of the next batches), a worker is killed with SIGKILL while its executor runs
tasks (Spark runs them again elsewhere: a retry, never a lost run), and every worker is
killed, so runs wait acknowledged and pending with no executor at all, until a worker
comes back. After it all, the set check: every acknowledged run committed once, the raw
archive holds exactly the rows sent, and the view equals the batch query.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from server.engines.cluster import LocalCluster
from tests import test_e2e as e2e
from tests.cluster import committed_runs
from tests.oracle import canonical
from tests.test_e2e import wait_until

# A cluster, a server and three faults take minutes: with the slow tests (dev.py test --slow),
# so that CI stays under 30 minutes.
pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
COUNTS = (
    "CREATE STREAM ev_counts AS SELECT k, count(*) AS n, sum(v) AS total, window_start "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start"
)
ORACLE = (
    "SELECT k, count(*), sum(v), to_timestamp(floor(extract(epoch FROM t) / 60) * 60) "
    "FROM ev GROUP BY 1, 4"
)
ROWS = 2_000  # per run: enough for a batch to keep an executor busy for a moment


def body(i: int) -> str:
    return "".join(
        json.dumps(
            {"k": f"k{r % 7}", "v": i * ROWS + r, "t": f"2026-01-01T0{i % 6}:{r % 60:02d}:00Z"}
        )
        + "\n"
        for r in range(ROWS)
    )


class Poster:
    """A client posting runs without waiting, one after another, keeping the ledger of
    what the server acknowledged (a run refused or unanswered is posted again, same id)."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=60)
        self.acknowledged: set[str] = set()
        self.posted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._post, daemon=True)
        self.error: BaseException | None = None

    def _post(self) -> None:
        try:
            while not self._stop.is_set():
                run_id = f"r{self.posted}"
                response = self.client.post(
                    f"/streams/ev/runs?run_id={run_id}",
                    content=body(self.posted),
                    headers={"content-type": "application/x-ndjson"},
                )
                if response.status_code in (200, 202):
                    self.acknowledged.add(run_id)
                    self.posted += 1
                else:
                    assert response.status_code in (429, 503), response.text
                    time.sleep(0.2)
                time.sleep(0.05)
        except BaseException as error:  # noqa: BLE001 - re-raised by stop
            self.error = error

    def __enter__(self) -> Poster:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(120)
        if self.error is not None:
            raise self.error

    def runs_past(self, count: int, timeout: float = 180) -> None:
        """Wait until ``count`` more runs are acknowledged."""
        target = len(self.acknowledged) + count
        wait_until(
            lambda: len(self.acknowledged) >= target or self.error is not None, "runs", timeout
        )


def executor_log_lines(cluster: LocalCluster, index: int, text: str) -> int:
    """Lines holding ``text`` in the logs of the executors worker ``index`` ran."""
    found = 0
    for log in (cluster.directory / f"worker-{index}").glob("app-*/*/stderr"):
        found += log.read_text(errors="replace").count(text)
    return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    instance = LocalCluster(1, directory=tmp_path / "cluster").start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.mark.timeout(1200)
def test_workers_join_and_die_while_runs_flow(cluster: LocalCluster, tmp_path: Path) -> None:
    server = e2e.Server(tmp_path / "data", env={"STRATA_SPARK_MASTER": cluster.master_url})
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=60)
        for statement in (RAW, COUNTS):
            assert client.post("/streams", json={"sql": statement}).status_code == 201
        wait_until(
            lambda: len(client.get("/info").json()["spark_executors"]) == 1,
            "the worker's executor",
        )
        with Poster(server.url) as poster:
            poster.runs_past(3)
            # A worker joins: the running application gets an executor on it, which runs
            # tasks of the batches that follow.
            joined = time.monotonic()
            second = cluster.add_worker()
            wait_until(
                lambda: executor_log_lines(cluster, second, "Running task") > 0,
                "the new worker's executor to run a task",
                timeout=120,
            )
            print(f"a new worker ran a task {time.monotonic() - joined:.1f} s after it started")
            assert len(client.get("/info").json()["spark_executors"]) == 2
            metrics = client.get("/metrics").text
            assert "strata_spark_executors 2.0" in metrics
            # The first worker dies with its executor while that executor runs tasks.
            wait_until(
                lambda: any(
                    e["running_tasks"] for e in client.get("/info").json()["spark_executors"]
                ),
                "an executor running tasks",
                timeout=120,
            )
            cluster.kill_worker(0)
            poster.runs_past(3)
            # Every worker dies: runs are still acknowledged, and wait with no executor.
            cluster.kill_worker(second)
            before = len(poster.acknowledged)
            poster.runs_past(2)
            waiting = sorted(poster.acknowledged, key=lambda r: int(r[1:]))[before:]
            time.sleep(10)
            statuses = {r: client.get(f"/runs/{r}").json()["status"] for r in waiting}
            assert set(statuses.values()) == {"pending"}, statuses
            cluster.add_worker()
            poster.runs_past(2)
        sent = sorted(poster.acknowledged, key=lambda r: int(r[1:]))
        wait_until(
            lambda: all(client.get(f"/runs/{r}").json()["status"] == "committed" for r in sent),
            "every acknowledged run to commit",
            timeout=300,
        )
        log = server.log.read_text(errors="replace")
        assert "Lost task" in log or "lost executor" in log.lower(), "no task was lost"
        counts = committed_runs(server.database_url)
        assert set(counts) == set(sent) and set(counts.values()) == {1}
        with psycopg.connect(server.database_url) as connection:
            rows = connection.execute("SELECT count(*) FROM ev").fetchone()
            assert rows == (len(sent) * ROWS,)
            view = canonical(
                connection.execute("SELECT k, n, total, window_start FROM ev_counts").fetchall()
            )
            assert view == canonical(connection.execute(ORACLE).fetchall())
    finally:
        server.close()
