"""Scale-out: Strata on a Spark standalone cluster (a Master and two Workers of one core on
127.0.0.1, started by these tests with server/engines/cluster.py from the pyspark package).

The tests marked ``cluster`` (about 100 s on two cores) are part of the default run;
``python3 dev.py test --cluster`` (or ``pytest -m cluster``) runs them alone. Against the cluster:
the end-to-end session of `strata up` (tests/test_e2e.py), the order-independence property
test (tests/test_order_independence.py, in a pytest of its own whose ``spark`` fixture
connects to the cluster through STRATA_TEST_SPARK_MASTER), and runs whose rows the driver
ships to the executors instead of the executors reading the spool (STRATA_SHARED_SPOOL=false).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from server.engines.cluster import LocalCluster, executors_share_disk, master_hosts, on_this_machine
from tests import test_e2e as e2e

ROOT = Path(__file__).resolve().parent.parent


def test_which_executors_read_the_spool_files() -> None:
    assert on_this_machine("local[2]") and on_this_machine("spark://127.0.0.1:7077")
    assert on_this_machine("spark://localhost:7077,127.0.0.1:7078")
    assert not on_this_machine("spark://spark-master:7077")
    assert not on_this_machine("spark://127.0.0.1:7077,spark-master:7077")
    assert not on_this_machine("yarn") and not on_this_machine("k8s://https://10.0.0.1:443")
    assert master_hosts("spark://a:1,b:2") == ["a", "b"]
    # STRATA_SHARED_SPOOL decides when set; unset, only executors on this machine read files.
    assert executors_share_disk("spark://spark-master:7077", True)
    assert not executors_share_disk("local[*]", False)
    assert not executors_share_disk("spark://spark-master:7077")
    assert executors_share_disk("spark://127.0.0.1:7077")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two workers of one core and 1 GiB each; their logs stay in the test's temp dir."""
    instance = LocalCluster(2, directory=tmp_path_factory.mktemp("cluster")).start()
    daemons = [instance.master, *instance.workers]
    try:
        yield instance
    finally:
        instance.stop()
        # Every daemon (and so every executor, in a daemon's process group) is gone.
        assert all(d is not None and not d.running() for d in daemons)


def _apps(cluster: LocalCluster) -> list[dict[str, object]]:
    state = cluster.state()
    return [*state["activeapps"], *state["completedapps"]]


@pytest.mark.cluster
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_strata_up_on_the_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
    assert cluster.alive_workers() == 2
    server = e2e.Server(tmp_path / "data", env={"STRATA_SPARK_MASTER": cluster.master_url})
    try:
        server.start()
        info = httpx.get(f"{server.url}/info").json()
        assert info["spark_master"] == cluster.master_url
        assert info["shared_spool"] is True  # executors on loopback read the spool's files
        # The driver runs as an application of the cluster, with an executor on each worker.
        active = cluster.state()["activeapps"]
        assert [(a["name"], a["cores"]) for a in active] == [("strata", 2)]
        e2e.test_a_newcomer_session(server, tmp_path)
    finally:
        server.close()


@pytest.mark.cluster
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_rows_shipped_from_the_driver(cluster: LocalCluster, tmp_path: Path) -> None:
    """Executors that do not share the data dir get the rows from the driver: runs, then a
    back-fill over them, give the same views."""
    env = {"STRATA_SPARK_MASTER": cluster.master_url, "STRATA_SHARED_SPOOL": "false"}
    server = e2e.Server(tmp_path / "data", env=env)
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=300)
        assert client.get("/info").json()["shared_spool"] is False
        for statement in (e2e.IMPSNS, e2e.COUNT):
            assert client.post("/streams", json={"sql": statement}).status_code == 201
        for run in range(3):
            body = "campaign,user_id,price,t\n" + "".join(
                f"c{i % 3},{i},1.5,2024-01-01T00:0{(i + run) % 4}:00Z\n" for i in range(50)
            )
            response = client.post(
                "/streams/impsns/runs?wait=true",
                content=body,
                headers={"content-type": "text/csv"},
            )
            assert response.status_code == 200, response.text
        assert client.post("/streams", json={"sql": e2e.LATE_COUNT}).status_code == 201
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            for _ in range(300):
                progress = client.get("/streams/late_count").json()["progress"]
                if progress["backfill"]["state"] == "done":
                    break
                time.sleep(0.5)
            assert connection.execute("SELECT sum(c) FROM late_count").fetchone() == (150,)
            view = connection.execute(
                "SELECT campaign, c, t FROM impsn_count ORDER BY t, campaign"
            ).fetchall()
            oracle = connection.execute(
                "SELECT campaign, count(*), date_trunc('minute', t) + interval '1 minute' AS t "
                "FROM impsns GROUP BY 1, 3 ORDER BY 3, 1"
            ).fetchall()
            assert view == oracle and sum(row[1] for row in view) == 150
    finally:
        server.close()


@pytest.mark.cluster
@pytest.mark.slow  # a second pytest over the cluster: with the slow tests, for CI's time
@pytest.mark.timeout(1800)
def test_order_independence_on_the_cluster(cluster: LocalCluster) -> None:
    before = {app["id"] for app in _apps(cluster)}
    env = os.environ | {"STRATA_TEST_SPARK_MASTER": cluster.master_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_order_independence.py",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
    # It ran as an application of the cluster, on both workers.
    new = [app for app in _apps(cluster) if app["id"] not in before]
    assert [app["cores"] for app in new] == [2], new
