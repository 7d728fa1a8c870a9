"""Benchmark of scale-out: the partial-computation stage on one Spark worker against two.

    python -m bench.scaleout [--rows 2000000] [--run-rows 50000] [--batch-rows 500000]
                               [--rounds 2] [--no-local] [--json-out PATH]

The stage: Spark computing the partial rows of a batch of runs for three derived streams
(per campaign and minute: count, revenue, average price; per user bucket and hour: count,
revenue, top price; per campaign over sliding 5-minute windows: count), exactly as the
server's worker does it (``SparkBackend.partials`` over the runs' spooled Parquet files,
several runs per job, the run id among the grouping keys, partial rows collected to the
driver through Arrow). Everything else of the server (HTTP, PostgreSQL) is left out.

What it does, in one process (``benchmark()`` runs it as a child process, so that its
Spark driver JVM never meets another benchmark's):

1. writes ``--rows`` ad-impression rows (100 campaigns, one day of event time, 10% up to
   an hour late) as runs of ``--run-rows`` rows, one Parquet file each, the way the spool
   holds them; groups consecutive runs into batches of up to ``--batch-rows`` rows;
2. starts a Spark standalone cluster on 127.0.0.1 (server/engines/cluster.py): a Master and two
   Workers of one core and 1 GiB each;
3. per round, three Spark applications in turn, each with a driver in this process and the
   same data: **1 worker** (``spark.cores.max=1``: one executor, on one worker), **2
   workers** (two executors, one per worker) and, for context, ``local[2]`` (in-process,
   no cluster). Each first computes one batch untimed (executors start, code warms up),
   then every batch, timed. Interleaving the configurations in rounds spreads the
   machine's load over all of them; each one's best round is its figure;
4. checks that every configuration computed exactly the same partial rows;
5. stops the applications and the cluster.

The figure: rows/s of the stage on 2 workers against 1 worker (ratio = scale-out).
Prints a table and one JSON line. On a machine with too few cores for its two workers, it
also prints how to measure scale-out where they have cores of their own: ``--master``
names a running standalone master (its workers on other machines) instead of a cluster of
its own, and ``--work`` a directory on storage every worker reads.

With ``--takeover`` (``--takeover-only``: nothing else), a second figure, of several
servers over one PostgreSQL (STRATA_SHARED_DATABASE): two `strata up` share a scratch
PostgreSQL; the first, which holds every background job's lease, is killed with kill -9
right after it acknowledged a run of ``--takeover-rows`` rows (still pending: its Spark
job takes longer); the figure is the seconds from the kill until the second holds every
lease and has claimed the dead server's pending runs, against the lease duration
(``--lease``). The run's commit by the second server is timed too (context).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import httpx
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness.errors import BenchError
from bench.harness.results import Result, check_scale
from rewriter import ParallelAggregatePlan, RawStreamPlan, rewrite
from rewriter.naming import RUN_COLUMN
from server.ingest.parse import arrow_schema

RAW = "impsns"
RAW_SQL = (
    f"CREATE STREAM {RAW} (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')"
)
DERIVED_SQL = [
    f"CREATE STREAM per_minute AS SELECT campaign, count(*) AS n, sum(price) AS revenue, "
    f"avg(price) AS mean, window_end AS t FROM TUMBLE({RAW}, t, INTERVAL '1 minute') "
    "GROUP BY campaign, window_end",
    f"CREATE STREAM per_bucket AS SELECT user_id % 16 AS bucket, count(*) AS n, "
    f"sum(price) AS revenue, max(price) AS top, window_start "
    f"FROM TUMBLE({RAW}, t, INTERVAL '1 hour') GROUP BY user_id % 16, window_start",
    f"CREATE STREAM sliding AS SELECT campaign, count(*) AS n, window_start "
    f"FROM HOP({RAW}, t, INTERVAL '1 minute', INTERVAL '5 minutes') "
    "GROUP BY campaign, window_start",
]
DAY_START_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
DAY_US = 86_400_000_000
CLUSTER_WORKERS = 2
ROOT = Path(__file__).resolve().parent.parent  # where ``python -m bench.scaleout`` runs


@dataclass
class Batch:
    files: list[str]
    rows: pa.Table


@dataclass
class Measured:
    config: str
    rows: int
    rounds: list[float] = field(default_factory=list)  # seconds of each timed round
    partial_rows: int = 0
    digest: str = ""

    @property
    def best(self) -> float:
        return min(self.rounds)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.best


def generate(rows: int, run_rows: int, directory: Path, seed: int = 7) -> list[pa.Table]:
    """The runs, written as ``directory``/run-<seq>.parquet like the spool's files."""
    raw = rewrite(RAW_SQL, {})
    assert isinstance(raw, RawStreamPlan)
    schema = arrow_schema(raw.columns).append(pa.field(RUN_COLUMN, pa.int64()))
    rng = np.random.default_rng(seed)
    campaigns = np.array([f"c{i:03d}" for i in range(100)])
    runs = []
    directory.mkdir(parents=True, exist_ok=True)
    for seq, start in enumerate(range(0, rows, run_rows), 1):
        n = min(run_rows, rows - start)
        t = DAY_START_US + (np.arange(start, start + n, dtype=np.int64) * (DAY_US // rows))
        late = rng.random(n) < 0.1
        t = t - late * rng.integers(0, 3_600_000_000, n)
        prices = rng.integers(1, 100_000_000, n)  # up to 9999.9999, 4 decimals
        table = pa.table(
            [
                pa.array(campaigns[rng.integers(0, len(campaigns), n)]),
                pa.array(rng.integers(0, 1_000_000, n), pa.int64()),
                pa.array([Decimal(int(p)).scaleb(-4) for p in prices], pa.decimal128(12, 4)),
                pa.array(np.maximum(t, DAY_START_US), pa.timestamp("us", tz="UTC")),
                pa.array(np.full(n, seq, dtype=np.int64)),
            ],
            schema=schema,
        )
        pq.write_table(table, directory / f"run-{seq}.parquet", compression="none")
        runs.append(table)
    return runs


def batches(runs: list[pa.Table], directory: Path, batch_rows: int) -> list[Batch]:
    """Consecutive runs up to ``batch_rows`` rows a batch (at least one run), as the worker
    batches pending runs."""
    out: list[Batch] = []
    current: list[int] = []
    for index, run in enumerate(runs):
        if current and sum(runs[i].num_rows for i in current) + run.num_rows > batch_rows:
            out.append(_batch(runs, current, directory))
            current = []
        current.append(index)
    if current:
        out.append(_batch(runs, current, directory))
    return out


def _batch(runs: list[pa.Table], indices: list[int], directory: Path) -> Batch:
    files = [str(directory / f"run-{i + 1}.parquet") for i in indices]
    return Batch(files, pa.concat_tables([runs[i] for i in indices]))


def plans() -> list[ParallelAggregatePlan]:
    raw = rewrite(RAW_SQL, {})
    out = []
    for statement in DERIVED_SQL:
        plan = rewrite(statement, {RAW: raw})
        assert isinstance(plan, ParallelAggregatePlan)
        out.append(plan)
    return out


def _digest(results: list[dict[str, pa.Table]]) -> tuple[int, str]:
    """Partial rows and a digest of them, independent of their order."""
    digest = hashlib.sha256()
    count = 0
    for name in sorted({n for result in results for n in result}):
        rows = [repr(r) for result in results for r in result[name].to_pylist()]
        count += len(rows)
        digest.update(name.encode())
        for row in sorted(rows):
            digest.update(row.encode())
    return count, digest.hexdigest()


def measure(
    master: str, config: str, work: Path, data: list[Batch], cores: int | None
) -> tuple[float, int, str]:
    """One Spark application on ``master`` (``cores``: spark.cores.max), timed over every
    batch after one untimed warm-up batch: (seconds, partial rows, digest)."""
    from server.engines.backend import SparkBackend
    from server.engines.spark import create_spark_session, stop_spark_session

    conf = {"spark.driver.memory": "1g"}
    if cores is not None:
        conf |= {"spark.cores.max": str(cores), "spark.executor.cores": "1"}
        conf |= {"spark.executor.memory": "1g"}
    spark = create_spark_session(
        master, app_name=f"scaleout {config}", local_dir=work / "spark", extra_conf=conf
    )
    try:
        if cores is not None:
            _wait_for_executors(spark, cores)
        backend = SparkBackend(spark)
        if not backend.reads_files:
            raise BenchError(f"{master}: executors would not read the runs' files")
        stream_plans = list(plans())
        backend.partials(data[0].rows, list(stream_plans), source=RAW, files=data[0].files)
        started = time.perf_counter()
        results = [
            backend.partials(b.rows, list(stream_plans), source=RAW, files=b.files) for b in data
        ]
        seconds = time.perf_counter() - started
    finally:
        stop_spark_session(spark)
    count, digest = _digest(results)
    return seconds, count, digest


def _wait_for_executors(spark: object, executors: int, timeout: float = 180) -> None:
    context = spark.sparkContext  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The driver is among the block managers in cluster mode.
        if context._jsc.sc().getExecutorMemoryStatus().size() - 1 >= executors:
            return
        time.sleep(0.5)
    raise BenchError(f"{executors} executors did not start in {timeout:.0f}s")


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result], dict[str, object]]:
    work = Path(tempfile.mkdtemp(prefix="strata-scaleout-", dir=args.work))
    try:
        code, results, summary = (0, [], {}) if args.takeover_only else _run(args, work)
        if args.takeover or args.takeover_only:
            took = measure_takeover(work / "takeover", args.lease, args.takeover_rows)
            results.append(took)
            summary["takeover"] = took.context
        return code, results, summary
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_takeover(work: Path, lease: float, rows: int) -> Result:
    """Two servers over one PostgreSQL; kill -9 of the first, holding every lease and a
    pending run; seconds until the second has taken its leases and runs."""
    from bench.harness.database import scratch_database
    from bench.harness.server import Server, start_server, stop_server

    env = {
        "STRATA_SHARED_DATABASE": "true",
        "STRATA_LEASE_DURATION": str(lease),
        "STRATA_SPARK_WARMUP": "0",
    }
    started: list[Server] = []
    with scratch_database("strata-takeover-") as database:
        try:
            for name in ("first", "second"):
                (work / name).mkdir(parents=True)
                server = start_server(work / name, env | {"STRATA_DATABASE_URL": database.url})
                started.append(server)
            first, second = started
            ids = [httpx.get(f"{s.url}/info", timeout=10).json()["server_id"] for s in started]
            httpx.post(f"{first.url}/streams", json={"sql": RAW_SQL}, timeout=60).raise_for_status()
            body = "campaign,user_id,price,t\n" + "".join(
                f"c{i % 100},{i},1.5,2024-01-01T00:{i % 60:02d}:00Z\n" for i in range(rows)
            )
            answer = httpx.post(
                f"{first.url}/streams/{RAW}/runs?run_id=doomed",
                content=body,
                headers={"content-type": "text/csv"},
                timeout=120,
            )
            answer.raise_for_status()
            killed = time.monotonic()
            for process in psutil.Process(first.process.pid).children(recursive=True):
                process.kill()  # its Spark JVM too, as a dead machine would
            first.process.kill()
            first.process.wait()
            pending, leases = _shared_state(database.url, ids[0])
            if "doomed" not in pending or set(leases.values()) != {ids[0]}:
                raise BenchError(f"the first server held {pending} and {leases} when killed")
            while _shared_state(database.url, ids[0]) != ([], dict.fromkeys(leases, ids[1])):
                if time.monotonic() - killed > 60:
                    raise BenchError("the second server did not take over within 60 s")
                time.sleep(0.05)
            took = time.monotonic() - killed
            while httpx.get(f"{second.url}/runs/doomed", timeout=10).json()["status"] != (
                "committed"
            ):
                if time.monotonic() - killed > 120:
                    raise BenchError("the dead server's run was not committed within 120 s")
                time.sleep(0.05)
            committed = time.monotonic() - killed
        finally:
            for server in started:
                stop_server(server)
    print(
        f"takeover of a dead server's runs and leases: {took:.2f}s (lease {lease:g}s); "
        f"its run committed {committed:.2f}s after the kill",
        flush=True,
    )
    return Result(
        figure="takeover of a dead server's pending runs and leases (2 servers over one "
        "PostgreSQL, kill -9)",
        value=took,
        baseline=lease,
        baseline_name="the lease duration (STRATA_LEASE_DURATION)",
        unit="s",
        better="lower",
        notes=f"a run of {rows:,} rows acknowledged and pending at the kill",
        context={
            "takeover_s": round(took, 2),
            "run_committed_s": round(committed, 2),
            "lease_s": lease,
            "jobs": len(leases),
        },
    )


def _shared_state(url: str, server_id: str) -> tuple[list[str], dict[str, str | None]]:
    """The run ids of pending runs ``server_id`` owns, and each lease's holder."""
    import psycopg
    from psycopg import sql

    from rewriter.naming import CATALOG_SCHEMA

    with psycopg.connect(url) as connection:
        pending = connection.execute(
            sql.SQL("SELECT run_id FROM {} WHERE status = 'pending' AND owner = %s").format(
                sql.Identifier(CATALOG_SCHEMA, "runs")
            ),
            (server_id,),
        ).fetchall()
        leases = connection.execute(
            sql.SQL("SELECT job, holder FROM {}").format(sql.Identifier(CATALOG_SCHEMA, "leases"))
        ).fetchall()
    return sorted(r for (r,) in pending), dict(leases)


def _run(args: argparse.Namespace, work: Path) -> tuple[int, list[Result], dict[str, object]]:
    from server.engines.cluster import LocalCluster

    print(f"data: {args.rows:,} rows in runs of {args.run_rows:,}; work dir {work}", flush=True)
    started = time.monotonic()
    runs = generate(args.rows, args.run_rows, work / "spool")
    data = batches(runs, work / "spool", args.batch_rows)
    print(f"generated {len(runs)} runs, {len(data)} batches in {time.monotonic() - started:.1f}s")
    configs: list[tuple[str, int | None]] = [("1 worker", 1), ("2 workers", 2)]
    if args.local:
        configs.append(("local[2]", None))
    measured = {name: Measured(name, args.rows) for name, _ in configs}
    # Without --master, a cluster of its own on this machine.
    cluster = None
    if args.master is None:
        cluster = LocalCluster(CLUSTER_WORKERS, cores=1, memory="1g", directory=work / "cluster")
    started = time.monotonic()
    try:
        if cluster is not None:
            cluster.start()
        master_url = cluster.master_url if cluster is not None else args.master
        cluster_start = time.monotonic() - started
        print(f"cluster {master_url} up in {cluster_start:.1f}s", flush=True)
        for round_ in range(args.rounds):
            for name, cores in configs:
                master = "local[2]" if cores is None else master_url
                seconds, count, digest = measure(master, name, work, data, cores)
                entry = measured[name]
                entry.rounds.append(seconds)
                if entry.digest and (entry.digest, entry.partial_rows) != (digest, count):
                    raise BenchError(f"{name}: round {round_ + 1} computed other partials")
                entry.partial_rows, entry.digest = count, digest
                print(
                    f"round {round_ + 1} {name:<10} {seconds:8.2f}s "
                    f"{args.rows / seconds:>12,.0f} rows/s  {count:,} partial rows",
                    flush=True,
                )
    finally:
        if cluster is not None:
            cluster.stop()
    digests = {m.digest for m in measured.values()}
    if len(digests) != 1:
        raise BenchError(f"the configurations computed different partials: {measured}")

    one, two = measured["1 worker"], measured["2 workers"]
    print(f"\n{'configuration':<14} {'best s':>8} {'rows/s':>12}  rounds (s)")
    for m in measured.values():
        rounds = ", ".join(f"{s:.2f}" for s in m.rounds)
        print(f"{m.config:<14} {m.best:>8.2f} {m.rows_per_s:>12,.0f}  {rounds}")
    print(f"scale-out (2 workers / 1 worker): {two.rows_per_s / one.rows_per_s:.2f}")
    cpus = os.cpu_count() or 0
    if args.master is None and cpus < CLUSTER_WORKERS + 2:
        print(
            f"This machine has {cpus} cores for two 1-core workers, the driver and the rest: "
            "the ratio says the path works, not how much a worker adds. Where workers have "
            "cores of their own: start a master with Spark's own `spark-class "
            "org.apache.spark.deploy.master.Master --host HOST` and, on two other machines, "
            "`spark-class org.apache.spark.deploy.worker.Worker spark://HOST:7077`, then "
            "here `python -m bench.scaleout --master spark://HOST:7077 --work DIR` with DIR "
            "on storage every worker reads (its executors read the runs' files)."
        )
    context: dict[str, float | int | str] = {
        "rows": args.rows,
        "runs": len(runs),
        "batches": len(data),
        "partial_rows": one.partial_rows,
        "rounds": args.rounds,
        "cluster_start_s": round(cluster_start, 1),
        "one_worker_rows_per_s": round(one.rows_per_s),
        "two_workers_rows_per_s": round(two.rows_per_s),
        "cpus": os.cpu_count() or 0,
        "load_average": round(os.getloadavg()[0], 1),
    }
    if "local[2]" in measured:
        context["local2_rows_per_s"] = round(measured["local[2]"].rows_per_s)
    results = [
        Result(
            figure=(
                "partial computation of 3 derived streams on a Spark standalone cluster, "
                "2 workers (1 core each)"
            ),
            value=two.rows_per_s,
            baseline=one.rows_per_s,
            baseline_name="the same on 1 worker",
            unit="rows/s",
            better="higher",
            notes=f"{args.rows:,} rows in batches of up to {args.batch_rows:,}; best of "
            f"{args.rounds} interleaved rounds",
            context=context,
        )
    ]
    summary = {
        m.config: {"rounds_s": m.rounds, "rows_per_s": m.rows_per_s} for m in measured.values()
    }
    return 0, results, {"configs": summary, **context}


SCALES = {
    "smoke": [
        *("--rows", "20000", "--run-rows", "5000", "--batch-rows", "10000"),
        *("--rounds", "1", "--no-local"),
    ],
    "full": ["--takeover"],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results): runs this module as a child
    process, so that its Spark driver (and the environment Spark sets up) stays out of the
    runner's."""
    arguments = SCALES[check_scale(scale)]
    with tempfile.TemporaryDirectory(prefix="strata-scaleout-") as directory:
        out = Path(directory) / "results.json"
        done = subprocess.run(
            [sys.executable, "-m", "bench.scaleout", *arguments, "--json-out", str(out)],
            cwd=ROOT,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise BenchError("the scale-out benchmark failed (see above)")
        figures = json.loads(out.read_text())
        return [Result(**{k: v for k, v in f.items() if k != "ratio"}) for f in figures]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if min(args.rows, args.run_rows, args.batch_rows, args.rounds) <= 0:
        parser.error("--rows, --run-rows, --batch-rows and --rounds must be positive")
    code, results, summary = run_benchmark(args)
    print(json.dumps(summary))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([r.to_dict() for r in results]))
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows (2000000)")
    parser.add_argument("--run-rows", type=int, default=50_000, help="rows per run (50000)")
    parser.add_argument(
        "--batch-rows", type=int, default=500_000, help="most rows per Spark job (500000)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every config (2)")
    parser.add_argument(
        "--no-local", dest="local", action="store_false", help="skip the local[2] context run"
    )
    parser.add_argument(
        "--takeover",
        action="store_true",
        help="also time the takeover of a dead server's runs and leases (servers over one "
        "PostgreSQL)",
    )
    parser.add_argument(
        "--takeover-only", action="store_true", help="time the takeover, nothing else"
    )
    parser.add_argument(
        "--lease", type=float, default=10.0, help="STRATA_LEASE_DURATION of the takeover (10)"
    )
    parser.add_argument(
        "--takeover-rows", type=int, default=200_000, help="rows of the run pending (200000)"
    )
    parser.add_argument(
        "--master",
        help="a running Spark standalone master (spark://host:port) with two or more workers "
        "of their own machines, instead of a cluster on this one",
    )
    parser.add_argument(
        "--work", help="where the runs' files go: with --master, storage every worker reads"
    )
    parser.add_argument("--json-out", help="write the figures here as JSON (for bench/run.py)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
