"""Benchmark of elastic compute: rows/s into one `strata up` whose Spark is a standalone
cluster, over time, while a worker joins and another is killed in the middle of a batch.

    python -m bench.elastic [--seconds 90] [--join-at 25] [--kill-at 55] [--run-rows 5000]
                            [--clients 2] [--picture PATH] [--json-out PATH]

What it does (as tests/test_elastic.py proves it, measured here):

1. starts a Spark standalone cluster of one worker (one core, server/engines/cluster.py)
   and a `strata up` whose Spark driver is an application of it (STRATA_SPARK_MASTER);
2. creates a raw stream and a per-minute count over it; ``--clients`` clients post runs
   of ``--run-rows`` rows without waiting (``wait=false``) for ``--seconds`` seconds,
   ``--rate`` rows/s in all, keeping the ledger of what the server acknowledged;
3. at ``--join-at`` seconds a second worker starts: the figure is the seconds from its
   start until its executor runs a task (a line "Running task" in that executor's log),
   against the seconds the worker itself took to register with the Master;
4. at ``--kill-at`` seconds, once the first worker's executor runs a task (its log shows
   one started and not finished), that worker is killed with SIGKILL (Spark runs the
   task again on the second, and its driver logs the executor lost): the figure is rows/s
   committed in the window after the kill against the window before it (same length);
5. waits until every acknowledged run is committed, checks that each was committed once,
   that the raw archive holds exactly the rows sent and that the view's counts add up to
   them; draws rows committed per second over time with the join and the kill marked
   (``--picture``, ``elastic.png`` beside the results from bench/run.py).

On a 2-core machine a second worker shares the cores of the first, so the curve shows
that the work goes on through the join and the kill, not a speed-up: where workers have
cores of their own, run `strata cluster --join spark://MASTER:7077` on each new machine
during a run of this benchmark against that master to measure it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

from bench.harness.errors import BenchError
from bench.harness.results import Result, check_scale, results_dir
from rewriter.naming import CATALOG_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
RAW = "CREATE STREAM ev (k text, v bigint, t timestamptz) WITH (event_time = 't')"
COUNTS = (
    "CREATE STREAM ev_counts AS SELECT k, count(*) AS n, window_start "
    "FROM TUMBLE(ev, t, INTERVAL '1 minute') GROUP BY k, window_start"
)
BUCKET = 2.0  # seconds per point of the curve


def body(index: int, rows: int) -> bytes:
    """Run ``index``: ``rows`` rows of 50 keys over one hour of event time (CSV)."""
    hour = index % 24
    lines = [
        f"k{r % 50},{index * rows + r},2026-01-01T{hour:02d}:{r % 60:02d}:{(r // 60) % 60:02d}Z"
        for r in range(rows)
    ]
    return ("k,v,t\n" + "\n".join(lines) + "\n").encode()


class Clients:
    """``count`` clients posting runs without waiting until stopped, ``rate`` rows/s in
    all (as a log shipper sends what arrives); the runs the server acknowledged (a run
    refused with 429 or 503 is posted again, same id)."""

    def __init__(self, url: str, count: int, rows: int, rate: float) -> None:
        self.url, self.rows = url, rows
        self.interval = count * rows / rate  # seconds between one client's runs
        self.acknowledged: list[str] = []
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._post, daemon=True) for _ in range(count)]
        self.errors: list[BaseException] = []

    def _post(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=120) as client:
                due = time.monotonic()
                while not self._stop.is_set():
                    self._stop.wait(max(0.0, due - time.monotonic()))
                    due += self.interval
                    with self._lock:
                        index, self._next = self._next, self._next + 1
                    run_id = f"r{index}"
                    payload = body(index, self.rows)
                    while not self._stop.is_set():
                        response = client.post(
                            f"/streams/ev/runs?run_id={run_id}&wait=false",
                            content=payload,
                            headers={"content-type": "text/csv"},
                        )
                        if response.status_code in (200, 202):
                            with self._lock:
                                self.acknowledged.append(run_id)
                            break
                        if response.status_code not in (429, 503):
                            raise BenchError(
                                f"run {run_id}: {response.status_code} {response.text}"
                            )
                        time.sleep(0.2)
        except BaseException as error:  # noqa: BLE001 - raised by stop
            self.errors.append(error)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(180)
        if self.errors:
            raise self.errors[0]


RUNNING = re.compile(r"Running task .*\(TID (\d+)\)")
FINISHED = re.compile(r"Finished task .*\(TID (\d+)\)")


def _executor_logs(directory: Path, index: int) -> str:
    logs = (directory / f"worker-{index}").glob("app-*/*/stderr")
    return "".join(log.read_text(errors="replace") for log in logs)


def ran_tasks(directory: Path, index: int) -> bool:
    """Whether an executor of worker ``index`` has run a task (its log says so)."""
    return "Running task" in _executor_logs(directory, index)


def running_tasks(directory: Path, index: int) -> bool:
    """Whether an executor of worker ``index`` is running a task now: one its log shows
    started and not finished."""
    text = _executor_logs(directory, index)
    return bool(set(RUNNING.findall(text)) - set(FINISHED.findall(text)))


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def _commits(url: str) -> list[tuple[float, int]]:
    """(epoch seconds, rows) of every committed run."""
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            sql.SQL(
                "SELECT extract(epoch FROM committed_at)::float8, rows FROM {} "
                "WHERE status = 'committed' ORDER BY committed_at"
            ).format(sql.Identifier(CATALOG_SCHEMA, "runs"))
        ).fetchall()
    return [(float(t), int(n)) for t, n in rows]


def _rate(commits: list[tuple[float, int]], start: float, end: float) -> float:
    rows = sum(n for t, n in commits if start <= t < end)
    return rows / (end - start)


def draw(commits: list[tuple[float, int]], t0: float, events: dict[str, float], path: Path) -> None:
    """Rows committed per second over time, with the join and the kill marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = max((t for t, _ in commits), default=t0) - t0
    buckets = [0.0] * (int(last // BUCKET) + 1)
    for t, n in commits:
        buckets[int((t - t0) // BUCKET)] += n / BUCKET
    figure, axes = plt.subplots(figsize=(9, 4))
    axes.step([i * BUCKET for i in range(len(buckets))], buckets, where="post")
    for (label, at), color in zip(events.items(), ("tab:green", "tab:red"), strict=False):
        axes.axvline(at - t0, color=color, linestyle="--", label=label)
    axes.set_xlabel("seconds")
    axes.set_ylabel("rows committed per second")
    axes.set_title("Strata on a Spark standalone cluster while workers join and die")
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run_benchmark(args: argparse.Namespace) -> list[Result]:
    from bench.harness.server import start_server, stop_server
    from server.engines.cluster import LocalCluster

    work = Path(tempfile.mkdtemp(prefix="strata-elastic-"))
    cluster = LocalCluster(1, cores=1, memory="1g", directory=work / "cluster")
    cluster.start()
    server = None
    try:
        server = start_server(
            work, {"STRATA_SPARK_MASTER": cluster.master_url, "STRATA_SPARK_WARMUP": "0"}
        )
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for statement in (RAW, COUNTS):
                client.post("/streams", json={"sql": statement}).raise_for_status()
            clients = Clients(server.url, args.clients, args.run_rows, args.rate)
            t0 = time.time()
            clients.start()
            time.sleep(args.join_at)
            joined = time.time()
            second = cluster.add_worker()
            registered = time.time() - joined
            _wait(lambda: ran_tasks(cluster.directory, second), "the new worker's task", 180)
            took = time.time() - joined
            print(
                f"a worker joined: registered in {registered:.1f}s, ran a task {took:.1f}s "
                "after its start",
                flush=True,
            )
            time.sleep(max(0.0, t0 + args.kill_at - time.time()))
            _wait(lambda: running_tasks(cluster.directory, 0), "worker 0 running a task", 120)
            killed = time.time()
            cluster.kill_worker(0)
            print(f"worker 0 killed at {killed - t0:.1f}s", flush=True)
            time.sleep(max(0.0, t0 + args.seconds - time.time()))
            clients.stop()
            sent = list(clients.acknowledged)
            _wait(
                lambda: all(client.get(f"/runs/{r}").json()["status"] == "committed" for r in sent),
                "every acknowledged run to commit",
                600,
            )
        url = server.database_url
        commits = _commits(url)
        with psycopg.connect(url) as connection:
            once = connection.execute(
                sql.SQL(
                    "SELECT count(*), count(DISTINCT run_id) FROM {} WHERE status = 'committed'"
                ).format(sql.Identifier(CATALOG_SCHEMA, "runs"))
            ).fetchone()
            archived = connection.execute("SELECT count(*) FROM ev").fetchone()
            counted = connection.execute("SELECT sum(n) FROM ev_counts").fetchone()
        expected = len(sent) * args.run_rows
        if once != (len(sent), len(sent)) or archived != (expected,) or counted != (expected,):
            raise BenchError(
                f"{len(sent)} runs acknowledged ({expected} rows): committed {once}, "
                f"archived {archived}, counted {counted}"
            )
        lost = server.log_path.read_text(errors="replace").count("Lost executor")
    finally:
        if server is not None:
            stop_server(server)
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)  # kept when the benchmark failed, for its logs
    # Windows of equal length on both sides of the kill, the one before after the join.
    window = max(min(killed - joined - took, t0 + args.seconds - killed) * 0.8, BUCKET)
    before = _rate(commits, killed - window, killed)
    after = _rate(commits, killed, killed + window)
    print(
        f"rows/s in the {window:.0f}s before the kill {before:,.0f}, after {after:,.0f}; "
        f"executors lost: {lost}"
    )
    if args.picture:
        draw(commits, t0, {"worker joins": joined, "worker 0 killed": killed}, Path(args.picture))
    context = {
        "runs": len(sent),
        "rows": expected,
        "run_rows": args.run_rows,
        "clients": args.clients,
        "offered_rows_per_s": args.rate,
        "worker_registered_s": round(registered, 2),
        "new_worker_first_task_s": round(took, 2),
        "rows_per_s_before_kill": round(before),
        "rows_per_s_after_kill": round(after),
        "window_s": round(window, 1),
        "executors_lost": lost,
        "cpus": os.cpu_count() or 0,
        "load_average": round(os.getloadavg()[0], 1),
    }
    return [
        Result(
            figure="a Spark worker added during ingest: seconds from its start to its first task",
            value=took,
            baseline=registered,
            baseline_name="the worker's own registration with the Master",
            unit="s",
            better="lower",
            notes=f"{args.clients} clients posting runs of {args.run_rows:,} rows meanwhile, "
            f"{args.rate:,.0f} rows/s in all",
            context=context,
        ),
        Result(
            figure="rows/s committed after a worker is killed with SIGKILL mid-batch "
            f"({window:.0f} s after, 0 runs lost)",
            value=after,
            baseline=before,
            baseline_name=f"rows/s in the {window:.0f} s before, on 2 workers",
            unit="rows/s",
            better="higher",
            notes="2 workers of 1 core on a 2-core machine: the curve in elastic.png",
            context=context,
        ),
    ]


SCALES = {
    "smoke": [
        *("--seconds", "40", "--join-at", "8", "--kill-at", "24"),
        *("--run-rows", "1000", "--rate", "4000"),
    ],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry: runs this module as a child process (its Spark driver and the
    environment Spark sets up stay out of the runner's)."""
    arguments = SCALES[check_scale(scale)]
    picture = results_dir(scale) / "elastic.png"
    with tempfile.TemporaryDirectory(prefix="strata-elastic-") as directory:
        out = Path(directory) / "results.json"
        command = [sys.executable, "-m", "bench.elastic", *arguments, "--json-out", str(out)]
        done = subprocess.run([*command, "--picture", str(picture)], cwd=ROOT, check=False)
        if done.returncode != 0 or not out.exists():
            raise BenchError("the elastic benchmark failed (see above)")
        figures = json.loads(out.read_text())
        return [Result(**{k: v for k, v in f.items() if k != "ratio"}) for f in figures]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=90, help="seconds of ingest (90)")
    parser.add_argument("--join-at", type=float, default=25, help="a worker joins then (25)")
    parser.add_argument("--kill-at", type=float, default=55, help="worker 0 is killed then (55)")
    parser.add_argument("--run-rows", type=int, default=5000, help="rows per run (5000)")
    parser.add_argument("--clients", type=int, default=2, help="clients posting runs (2)")
    parser.add_argument(
        "--rate", type=float, default=20_000, help="rows/s the clients send in all (20000)"
    )
    parser.add_argument("--picture", help="draw the curve here (PNG)")
    parser.add_argument("--json-out", help="write the figures here as JSON (for bench/run.py)")
    args = parser.parse_args(argv)
    if not 0 < args.join_at < args.kill_at < args.seconds or args.run_rows <= 0:
        parser.error("expected 0 < --join-at < --kill-at < --seconds and --run-rows > 0")
    results = run_benchmark(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([r.to_dict() for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
