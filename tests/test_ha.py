"""High availability, tried the way Jepsen would: three real `strata up` nodes, each link
through a proxy the test controls, clients that fail over between nodes with the same run
id; after each fault, on every node, the set check of every acknowledged run (none lost,
none twice, nothing no client sent, every run's rows exact) and every view equal to the
batch query over that node's own raw rows.

The cluster runs with STRATA_MIN_COPIES=2: a run is acknowledged only once two nodes hold
it, so a node killed, cut off or wiped loses nothing acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from tests.cluster import NAMES, Clients, Cluster, converged, same_runs
from tests.oracle import canonical

pytestmark = pytest.mark.e2e

RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
COUNTS = (
    "CREATE STREAM ev_counts AS SELECT k, count(*) AS n, sum(v) AS total, window_start "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start"
)
ORACLE = (
    "SELECT k, count(*) AS n, sum(v) AS total, "
    "to_timestamp(floor(extract(epoch FROM t) / 60) * 60) AS window_start FROM ev GROUP BY 1, 4"
)


def body(i: int, rows: int = 20) -> str:
    """Run i: rows spread over an hour, run i late behind run i - 1 half the time."""
    minute = (i * 7) % 60
    return "".join(
        json.dumps(
            {
                "k": f"k{(i + r) % 5}",
                "v": i * 100 + r,
                "t": f"2026-01-01T00:{(minute + r) % 60:02d}:{r % 60:02d}Z",
            }
        )
        + "\n"
        for r in range(rows)
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    instance = Cluster(tmp_path_factory.mktemp("cluster"), env={"STRATA_MIN_COPIES": "2"})
    try:
        instance.start()
        yield instance
    finally:
        instance.close()


def views_exact(cluster: Cluster, names=NAMES) -> None:
    """On every node, the view equals the batch query over the node's own raw rows, and
    every node's view is the same."""
    seen = []
    for name in names:
        with psycopg.connect(cluster.nodes[name].database_url) as connection:
            view = canonical(
                connection.execute("SELECT k, n, total, window_start FROM ev_counts").fetchall()
            )
            batch = canonical(connection.execute(ORACLE).fetchall())
        assert view == batch, f"node {name}: the view differs from the batch query"
        seen.append(view)
    assert all(v == seen[0] for v in seen), "nodes disagree"


def test_ddl_anywhere_runs_anywhere_every_node_exact(cluster: Cluster) -> None:
    # DDL at a node that does not own it is forwarded, and visible there at once.
    response = cluster.ddl("b", RAW)
    assert response.status_code == 201, response.text
    response = cluster.ddl("c", COUNTS)
    assert response.status_code == 201, response.text
    # Read-your-DDL: the next node the client goes to takes runs at once.
    clients = Clients(cluster)
    for i in range(12):
        clients.post(f"r{i}", body(i), stream="ev", start=i % 3)
    converged(cluster, clients.ledger)
    same_runs(cluster)
    views_exact(cluster)
    status = cluster.status("c")
    assert status["node"] == "c" and status["ddl_owner"] == "a"
    assert {p["name"] for p in status["peers"]} == {"a", "b"}
    assert all(p["reachable"] for p in status["peers"])
