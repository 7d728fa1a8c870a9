"""Elastic compute: Spark workers join and leave a standalone cluster while runs flow into
`strata up`, and nothing is lost or counted twice.

A cluster of one worker (one core) on loopback, started by the test with
server/engines/cluster.py; a `strata up` whose Spark driver is an application of it;
clients post runs all along. Meanwhile, three times, a worker joins (it gets an executor,
which runs tasks of the next batches) and the worker before it is killed with SIGKILL while
its executor runs a task, at a moment hypothesis draws (Spark runs the task again
elsewhere: a retry, never a lost run); then every worker is gone for 30 s, so runs wait
acknowledged and pending with no executor at all, until a worker comes back. After it all,
the set check: every acknowledged run committed once, the raw archive holds exactly the
rows sent, and the view equals the batch query.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.elastic import ran_tasks, running_tasks
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


def exact_so_far(server: e2e.Server, client: httpx.Client, poster: Poster) -> None:
    """Once the runs acknowledged so far are committed: each once, the raw archive holding
    every committed run's rows, and the view equal to the batch query, in one snapshot
    (runs go on meanwhile)."""
    sent = sorted(poster.acknowledged, key=lambda r: int(r[1:]))
    wait_until(
        lambda: all(client.get(f"/runs/{r}").json()["status"] == "committed" for r in sent),
        "the runs acknowledged so far to commit",
        timeout=300,
    )
    counts = committed_runs(server.database_url)
    assert set(sent) <= set(counts) and set(counts.values()) == {1}, counts
    with psycopg.connect(server.database_url) as connection:
        connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        committed = connection.execute(
            "SELECT count(*) FROM strata_catalog.runs WHERE status = 'committed'"
        ).fetchone()
        rows = connection.execute("SELECT count(*) FROM ev").fetchone()
        assert committed is not None and rows == (committed[0] * ROWS,)
        view = canonical(
            connection.execute("SELECT k, n, total, window_start FROM ev_counts").fetchall()
        )
        assert view == canonical(connection.execute(ORACLE).fetchall())


def kill_while_running(cluster: LocalCluster, index: int, after: float) -> None:
    """Kill worker ``index`` with SIGKILL ``after`` seconds past the moment its executor
    runs a task, at the first moment after that when it runs one (a task its log shows
    started and not finished): so the kill lands in the middle of a batch."""
    wait_until(lambda: running_tasks(cluster.directory, index), f"worker {index}'s task", 120)
    time.sleep(after)
    wait_until(lambda: running_tasks(cluster.directory, index), f"worker {index}'s task", 120)
    cluster.kill_worker(index)


# Hypothesis draws when each worker dies: seconds after its executor first runs a task.
KILLS = st.lists(st.floats(0.0, 3.0), min_size=3, max_size=3)


@pytest.mark.timeout(1800)
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(kills=KILLS)
def test_workers_join_and_die_while_runs_flow(
    kills: list[float], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Three times a worker joins during ingest and the one before it is killed mid-batch,
    at a moment hypothesis draws; then no worker at all for 30 s (runs wait, acknowledged
    and pending), and one comes back."""
    tmp_path = tmp_path_factory.mktemp("elastic")
    cluster = LocalCluster(1, directory=tmp_path / "cluster").start()
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
            alive = 0  # the worker whose executor takes the batches now
            for after in kills:
                # A worker joins: the running application gets an executor on it, which
                # runs tasks of the batches that follow.
                joined = time.monotonic()
                newest = cluster.add_worker()
                wait_until(
                    lambda: ran_tasks(cluster.directory, newest),  # noqa: B023
                    "the new worker's executor to run a task",
                    timeout=120,
                )
                took = time.monotonic() - joined
                print(f"worker {newest} ran a task {took:.1f} s after it started")
                assert len(client.get("/info").json()["spark_executors"]) == 2
                assert "strata_spark_executors 2.0" in client.get("/metrics").text
                # The older worker dies with its executor in the middle of a batch.
                kill_while_running(cluster, alive, after)
                alive = newest
                poster.runs_past(2)
                exact_so_far(server, client, poster)
            # Every worker dies: runs are still acknowledged, and wait with no executor.
            cluster.kill_worker(alive)
            before = len(poster.acknowledged)
            poster.runs_past(2)
            waiting = sorted(poster.acknowledged, key=lambda r: int(r[1:]))[before:]
            time.sleep(30)
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
        log = server.log.read_text(errors="replace").lower()
        # Each killed worker took an executor running a task: the driver says it lost them.
        assert log.count("lost executor") >= len(kills), "an executor was not lost mid-task"
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
        cluster.stop()
