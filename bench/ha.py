"""Benchmark of high availability: three `strata up` nodes on loopback (tests/cluster.py:
every link through a proxy the benchmark controls), against one node in the same run.

    python -m bench.ha [--scale full|smoke]

Figures (issue goals in brackets):

* client failover after kill -9 of a node: from the kill to the next acknowledgement, by
  another node, of a run a client aimed at the dead one [<= 2 s, bar 5 s]; the baseline is
  what a client waits without a cluster: the dead node's restart until it acknowledges;
* the same under SIGSTOP of a node (a node that hangs: clients time out, 3 s) [<= 10 s];
* replication lag p95 in steady ingest: from a run's commit at the node that took it
  (wait=true answered) to its commit at each other node [<= 2 s], against the wait=true
  latency itself;
* convergence after a partition heals: from the heal to the cut-off node holding every
  run acknowledged meanwhile [<= 60 s], against the partition's length;
* catch-up rate of a node started empty (wiped) against the ingest rate of a single node
  for the same rows [>= 0.5x];
* the cost of replication: rows/s until all three nodes hold every run, each computing
  everything, against one node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

from bench.harness.percentile import percentile
from bench.harness.results import Result, check_scale
from server.client import FailoverClient
from tests.cluster import NAMES, Cluster, committed_runs
from tests.test_e2e import Server

RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
DERIVED = [
    "CREATE STREAM ev_counts AS SELECT k, count(*) AS n, sum(v) AS total, window_start "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start",
    "CREATE STREAM ev_hourly AS SELECT count(*) AS n, max(v) AS top, window_end "
    "FROM TUMBLE(ev, t, INTERVAL '1 hour') GROUP BY window_end",
]
NDJSON = {"content-type": "application/x-ndjson"}
SIZES = {"full": (240, 2_000, 60.0), "smoke": (12, 100, 3.0)}  # runs, rows per run, cut s


def body(i: int, rows: int) -> str:
    lines = []
    for r in range(rows):
        second = (i * 37 + r * 13) % 86_400
        t = f"2026-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"
        lines.append(json.dumps({"k": f"k{(i + r) % 50}", "v": i * rows + r, "t": t}))
    return "\n".join(lines) + "\n"


def _post(url: str, run_id: str, text: str) -> None:
    response = httpx.post(
        f"{url}/streams/ev/runs",
        params={"run_id": run_id, "wait": "true"},
        content=text,
        headers=NDJSON,
        timeout=600,
    )
    response.raise_for_status()


def _ingest(urls: list[str], bodies: dict[str, str], threads: int = 3) -> float:
    """Post every run (wait=true) round-robin over ``urls``; seconds taken."""
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for future in [
            pool.submit(_post, urls[n % len(urls)], run_id, text)
            for n, (run_id, text) in enumerate(bodies.items())
        ]:
            future.result()
    return time.monotonic() - started


def _wait(condition: Callable[[], bool], what: str, timeout: float = 900.0) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _holding(cluster: Cluster, name: str, run_ids: set[str]) -> Callable[[], bool]:
    """Whether node ``name`` has committed every run of ``run_ids``, when called."""
    return lambda: run_ids <= set(committed_runs(cluster.nodes[name].database_url))


def _committed_at(url: str, run_id: str) -> Callable[[], bool]:
    def committed() -> bool:
        response = httpx.get(f"{url}/runs/{run_id}", timeout=10)
        return response.status_code == 200 and response.json()["status"] == "committed"

    return committed


def _create(url: str) -> None:
    for statement in [RAW, *DERIVED]:
        httpx.post(f"{url}/streams", json={"sql": statement}, timeout=120).raise_for_status()


def single_node(base: Path, bodies: dict[str, str]) -> float:
    """Seconds one node takes to commit every run."""
    (base / "single").mkdir(parents=True)
    server = Server(base / "single" / "data")
    server.start()
    try:
        _create(server.url)
        return _ingest([server.url], bodies)
    finally:
        server.stop()
        server.close()


def failover(cluster: Cluster, victim: str, strike: Callable[[], None]) -> float:
    """Seconds from ``strike`` to the next acknowledgement of a run aimed at ``victim``."""
    start = NAMES.index(victim)
    acked: list[float] = []
    stop = threading.Event()

    def client() -> None:
        with FailoverClient(cluster.urls, timeout=3, deadline=120) as failing_over:
            n = 0
            while not stop.is_set():
                failing_over.post_run(
                    "ev", body(n, 10), run_id=f"fo-{victim}-{time.time_ns()}-{n}", start=start
                )
                acked.append(time.monotonic())
                n += 1

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    _wait(lambda: len(acked) >= 5, "acknowledgements before the fault", 60)
    struck = time.monotonic()
    strike()
    _wait(lambda: any(t > struck for t in acked), "an acknowledgement after the fault", 120)
    stop.set()
    thread.join(timeout=60)
    return min(t for t in acked if t > struck) - struck


def benchmark(scale: str) -> list[Result]:
    check_scale(scale)
    runs, rows, cut_seconds = SIZES[scale]
    base = Path(tempfile.mkdtemp(prefix="strata-ha-"))
    bodies = {f"load-{i}": body(i, rows) for i in range(runs)}
    total_rows = runs * rows
    cluster: Cluster | None = None
    try:
        one_node = single_node(base, bodies)
        # The settings' defaults, not the tests' shorter intervals.
        cluster = Cluster(
            base / "cluster",
            env={
                "STRATA_REPLICATE_INTERVAL": "0.5",
                "STRATA_PEER_TIMEOUT": "5",
                "STRATA_REDUCE_INTERVAL": "5",
                "STRATA_SERIAL_INTERVAL": "5",
            },
        )
        cluster.start()
        _create(cluster.nodes["a"].url)

        # The cost of replication: until every node holds every run.
        started = time.monotonic()
        _ingest(cluster.urls, bodies)
        for name in NAMES:
            _wait(_holding(cluster, name, set(bodies)), f"{name} to hold all")
        three_nodes = time.monotonic() - started

        # Replication lag: a run committed at a, then at b and c.
        lags, latencies = [], []
        for i in range(40 if scale == "full" else 5):
            run_id = f"lag-{i}"
            posted = time.monotonic()
            _post(cluster.nodes["a"].url, run_id, body(i, rows))
            committed = time.monotonic()
            latencies.append(committed - posted)
            for name in ("b", "c"):
                _wait(_committed_at(cluster.nodes[name].url, run_id), f"{run_id} at {name}", 120)
                lags.append(time.monotonic() - committed)

        # Failover: kill -9 of b, then its restart (the wait without a cluster).
        killed = failover(cluster, "b", lambda: cluster.kill("b"))
        restart_started = time.monotonic()
        cluster.start(["b"])
        _post(cluster.nodes["b"].url, "after-restart", body(0, 10))
        restart = time.monotonic() - restart_started

        # Failover under SIGSTOP of c's server (its PostgreSQL runs on).
        process = cluster.nodes["c"].process
        assert process is not None
        stopped = failover(cluster, "c", lambda: os.kill(process.pid, signal.SIGSTOP))
        os.kill(process.pid, signal.SIGCONT)

        # A partition of c under ingest, healed: until c holds every run acknowledged.
        cluster.cut("c")
        during = {f"cut-{i}": body(i + runs, rows) for i in range(max(runs // 4, 4))}
        cut_started = time.monotonic()
        _ingest([cluster.nodes["a"].url, cluster.nodes["b"].url], during)
        time.sleep(max(0.0, cut_seconds - (time.monotonic() - cut_started)))
        cluster.heal()
        converge = _wait(_holding(cluster, "c", set(during)), "c to converge")

        # Catch-up of a node started empty: every run the cluster holds.
        held = set(committed_runs(cluster.nodes["a"].database_url))
        held_rows = _rows_held(cluster, "a")
        cluster.wipe("c")
        cluster.start(["c"])
        catch_up = _wait(_holding(cluster, "c", held), "the wiped node to catch up")
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(base, ignore_errors=True)

    single_rate = total_rows / one_node
    context: dict[str, float | int | str] = {"runs": runs, "rows_per_run": rows}
    return [
        Result(
            "HA: client failover after kill -9 of a node (next ack by another node)",
            killed,
            restart,
            "restart of the killed node until it acknowledges (no cluster)",
            "s",
            "lower",
            notes="goal <= 2 s, bar 5 s",
        ),
        Result(
            "HA: client failover while a node is SIGSTOPped (client timeout 3 s)",
            stopped,
            restart,
            "restart of a killed node until it acknowledges (no cluster)",
            "s",
            "lower",
            notes="goal <= 10 s",
        ),
        Result(
            "HA: replication lag p95, commit at the node that took a run to commit at another",
            percentile(lags, 0.95),
            percentile(latencies, 0.95),
            "p95 of the run's own wait=true latency",
            "s",
            "lower",
            notes="goal <= 2 s",
            context=context | {"samples": len(lags), "lag_p50_s": round(percentile(lags, 0.5), 3)},
        ),
        Result(
            f"HA: convergence after a {cut_seconds:g} s partition heals (under ingest)",
            converge,
            cut_seconds,
            "the partition's length",
            "s",
            "lower",
            notes="goal <= 60 s",
            context={"runs_during_cut": len(during)},
        ),
        Result(
            "HA: catch-up of a wiped node started empty (rows/s)",
            held_rows / catch_up,
            single_rate,
            "one node's ingest of the same rows (wait=true, 3 clients)",
            "rows/s",
            "higher",
            notes="goal >= 0.5x; the node recomputes every run with Spark",
            context={"rows": held_rows, "seconds": round(catch_up, 2)},
        ),
        Result(
            "HA: ingest until all three nodes hold every run (each computes everything)",
            total_rows / three_nodes,
            single_rate,
            "one node, same runs, same clients",
            "rows/s",
            "higher",
            context=context | {"seconds": round(three_nodes, 2), "single_s": round(one_node, 2)},
        ),
    ]


def _rows_held(cluster: Cluster, name: str) -> int:
    with psycopg.connect(cluster.nodes[name].database_url) as connection:
        row = connection.execute("SELECT count(*) FROM ev").fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", default="full")
    args = parser.parse_args()
    for result in benchmark(args.scale):
        print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
