"""Benchmark of Strata's ingest path against PostgreSQL's COPY, end to end.

    python bench/ingest.py [--rows 1000000] [--run-rows 50000] [--threads 4] [--keep]

What it does, in one process tree:

1. generates ``--rows`` ad impressions deterministically (seeded): ~100 campaigns, event
   times spread over one day in run order, and about 20% of the runs carrying late data
   (half of their rows from earlier in the day); all CSV bodies are built before any timing;
2. starts ``strata up`` as a real subprocess on a free port and a temporary data dir
   (embedded PostgreSQL, local Spark), and reads ``database_url`` from ``GET /info``;
3. creates the raw stream ``impsns`` and three derived streams over it (1-minute count and
   revenue per campaign; 5-minute average and maximum price per campaign; the hourly
   roll-up of the 1-minute stream);
4. baseline: ``COPY impsns_plain FROM STDIN (FORMAT csv)`` of the same bodies, one COPY per
   body, into a plain table of the same columns in the same database;
5. Strata: posts every body to ``POST /streams/impsns/runs`` (text/csv) from ``--threads``
   client threads, and stops the clock when every run is committed: with ``--mode wait``
   (default) each request uses ``wait=true`` and returns once its run is committed; with
   ``--mode async`` requests return on acceptance and the runs are polled until committed;
6. checks the results (raw archive == the COPY'd rows; every view == the same query as a
   batch GROUP BY in PostgreSQL) and exits non-zero when anything is wrong;
7. stops the server with SIGTERM and requires a clean exit within 60 s.

Prints a table, where the server's time went (the ingest stages it times: parse, spool,
spark, postgres; from ``GET /metrics``), and one JSON line ``{"rows", "strata_rows_per_s",
"copy_rows_per_s", "ratio"}``. The server's log is ``<data dir>/server.log`` (kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from figures import Result, check_scale  # bench/figures.py, next to this script

RAW = "impsns"
PLAIN = "impsns_plain"
COLUMNS = "campaign text, user_id bigint, price numeric(12,4), t timestamptz"
STREAMS = [
    f"CREATE STREAM {{raw}} ({COLUMNS}) WITH (event_time = 't'{{options}})",
    "CREATE STREAM {raw}_1m AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "CREATE STREAM {raw}_5m AS SELECT campaign, avg(price) AS avg_price, "
    "max(price) AS max_price, window_end AS t "
    "FROM TUMBLE({raw}, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
]
# This benchmark's third derived stream: an hourly roll-up of the 1-minute stream (its
# partial rows come from the 1-minute stream's, in the same Spark batch).
ROLLUP = (
    "CREATE STREAM {raw}_1h AS SELECT campaign, sum(c) AS c, sum(revenue) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}_1m, t, INTERVAL '1 hour') GROUP BY campaign, window_end"
)
# Each view's columns, and the same aggregates as a batch query over the raw archive (the
# oracle of DESIGN.md's invariant 1).
ORACLES = {
    "_1m": (
        "campaign, c, revenue, t",
        "SELECT campaign, count(*), sum(price), "
        "date_bin('1 minute', t, '1970-01-01 00:00:00+00') + interval '1 minute' "
        "FROM {source} GROUP BY 1, 4",
    ),
    "_5m": (
        "campaign, avg_price, max_price, t",
        "SELECT campaign, avg(price), max(price), "
        "date_bin('5 minutes', t, '1970-01-01 00:00:00+00') + interval '5 minutes' "
        "FROM {source} GROUP BY 1, 4",
    ),
}
# The roll-up's oracle: a roll-up places each lower window by its start (README, "Streams
# over derived streams"), so every row counts in the hour it falls in.
ROLLUP_ORACLE = {
    "_1h": (
        "campaign, c, revenue, t",
        "SELECT campaign, count(*), sum(price), "
        "date_bin('1 hour', t, '1970-01-01 00:00:00+00') + interval '1 hour' "
        "FROM {source} GROUP BY 1, 4",
    ),
}
# Stages of ingestion the server times (strata_ingest_stage_seconds of GET /metrics).
STAGES = ("parse", "spool", "spark", "postgres")
HEADER = "campaign,user_id,price,t\n"
DAY = "2024-01-01"
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
CAMPAIGNS = 100
LATE_RUN_FRACTION = 0.2
LATE_ROW_FRACTION = 0.5
STARTUP_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0
HTTP_TIMEOUT = 900.0


class BenchError(Exception):
    """The benchmark cannot go on, or its results are wrong."""


# ---- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lateness:
    """How the runs of a generated workload arrive late (a lateness profile).

    A fraction ``runs`` of the runs are late. With ``delay_ms`` unset, a late run mixes a
    fraction ``rows`` of rows from anywhere earlier in the span into its own slice (this
    benchmark's profile). With ``delay_ms = (low, high)``, a late run holds only the rows of
    its own slice but arrives ``low`` to ``high`` later, after the runs of that much later
    event time, as a log file held back for hours does. ``jitter_ms`` delays each run's
    arrival by up to that much, shuffling neighbouring runs; 0 keeps event-time order.
    """

    runs: float = LATE_RUN_FRACTION
    rows: float = LATE_ROW_FRACTION
    delay_ms: tuple[int, int] | None = None
    jitter_ms: int = 0


MIXED = Lateness()
# 20% of the rows arrive in runs 1-6 hours late; every run's arrival is jittered by up to
# 30 minutes, which shuffles neighbouring runs when they are shorter than that.
HOURS_LATE = Lateness(runs=0.2, rows=0.0, delay_ms=(HOUR_MS, 6 * HOUR_MS), jitter_ms=HOUR_MS // 2)
ON_TIME = Lateness(runs=0.0, rows=0.0)


@dataclass
class Dataset:
    bodies: list[bytes]
    rows_per_body: list[int]
    late_runs: list[int]

    @property
    def rows(self) -> int:
        return sum(self.rows_per_body)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.bodies)


def _timestamp(ms_of_day: int) -> str:
    seconds, ms = divmod(ms_of_day, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{DAY}T{hour:02d}:{minute:02d}:{second:02d}.{ms:03d}Z"


def generate(
    rows: int,
    run_rows: int,
    seed: int,
    lateness: Lateness = MIXED,
    span_ms: int = DAY_MS,
) -> Dataset:
    """CSV bodies of at most ``run_rows`` rows each, in arrival order. Run i covers the i-th
    slice of the first ``span_ms`` of the day; ``lateness`` says which runs are late and how
    (by default the late runs also carry rows from anywhere before their slice)."""
    if not 0 < span_ms <= DAY_MS:
        raise ValueError(f"span_ms must be within one day, not {span_ms}")
    rng = random.Random(seed)
    runs = math.ceil(rows / run_rows)
    slice_ms = span_ms // runs
    late = sorted(rng.sample(range(1, runs), round(lateness.runs * runs))) if runs > 1 else []
    late_set = set(late)
    mixed = lateness.delay_ms is None
    campaigns = [f"campaign_{i:03d}" for i in range(CAMPAIGNS)]
    bodies: list[bytes] = []
    counts: list[int] = []
    for run in range(runs):
        n = min(run_rows, rows - run * run_rows)
        start = run * slice_ms
        lines = [HEADER]
        for _ in range(n):
            if mixed and run in late_set and rng.random() < lateness.rows:
                ms = rng.randrange(start)
            else:
                ms = start + rng.randrange(slice_ms)
            cents = rng.randrange(1, 50_000)  # price in 1/10000: 0.0001 .. 4.9999
            lines.append(
                f"{rng.choice(campaigns)},{rng.randrange(1, 10_000_000)},"
                f"{cents // 10_000}.{cents % 10_000:04d},{_timestamp(ms)}\n"
            )
        bodies.append("".join(lines).encode())
        counts.append(n)
    if mixed and not lateness.jitter_ms:
        return Dataset(bodies, counts, late)
    # Arrival order: a run arrives when its slice ends, plus its delay if it is late, plus
    # its jitter.
    arrives = []
    for run in range(runs):
        at = (run + 1) * slice_ms
        if lateness.delay_ms is not None and run in late_set:
            at += rng.randint(*lateness.delay_ms)
        if lateness.jitter_ms:
            at += rng.randrange(lateness.jitter_ms + 1)
        arrives.append((at, run))
    order = [run for _, run in sorted(arrives)]
    return Dataset(
        [bodies[run] for run in order],
        [counts[run] for run in order],
        [index for index, run in enumerate(order) if run in late_set],
    )


# ---- the server ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    database_url: str = ""
    started_in: float = 0.0

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start_server(data_dir: Path) -> Server:
    """`strata up` on a free port; returns once GET /health answers."""
    port = free_port()
    log_path = data_dir / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_PORT", "STRATA_HOST")}
    command = [
        sys.executable,
        "-m",
        "server.cli",
        "up",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir / "strata"),
    ]
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    deadline = started + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(
                f"strata up exited with {process.returncode} while starting:\n{server.log_tail()}"
            )
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    else:
        stop_server(server)
        raise BenchError(
            f"strata up not healthy after {STARTUP_TIMEOUT:.0f}s:\n{server.log_tail()}"
        )
    server.started_in = time.monotonic() - started
    server.database_url = httpx.get(f"{server.url}/info", timeout=10).json()["database_url"]
    return server


def stop_server(server: Server) -> tuple[int | None, float]:
    """SIGTERM, then wait; returns (exit code or None if it had to be killed, seconds)."""
    started = time.monotonic()
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        code: int | None = server.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
        code = None
    return code, time.monotonic() - started


def stop_orphaned_postgres(data_dir: Path) -> int | None:
    """Fast-shutdown the embedded PostgreSQL if it outlived `strata up`; returns its pid."""
    pid_file = data_dir / "strata" / "postgres" / "pgdata" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None  # no pid file, or no such process: it stopped
    os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
    deadline = time.monotonic() + STOP_TIMEOUT
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def log_problems(server: Server) -> list[str]:
    """Lines of the server log that report trouble (errors, tracebacks, warnings)."""
    markers = (" ERROR ", " WARNING ", "Traceback", "Exception", " WARN ")
    text = server.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if any(m in line for m in markers)]


# ---- phases ----------------------------------------------------------------------------


@dataclass
class Timing:
    name: str
    rows: int
    seconds: float
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def create_streams(
    client: httpx.Client, raw: str, delay: str | None = None, *, rollup: bool = False
) -> None:
    """The raw stream ``raw`` (with the watermark delay ``delay``, e.g. '10 minutes') and its
    two derived streams, and with ``rollup`` the hourly roll-up of the first."""
    options = f", delay = '{delay}'" if delay else ""
    for template in [*STREAMS, ROLLUP] if rollup else STREAMS:
        response = client.post("/streams", json={"sql": template.format(raw=raw, options=options)})
        if response.status_code != 201:
            raise BenchError(f"creating stream failed: {response.status_code} {response.text}")


def warm_up(client: httpx.Client, data: Dataset) -> float:
    """One small run into a separate stream of the same shape, so that the timed phase does
    not include the first Spark job's JVM warm-up; returns its latency."""
    raw = "warmup"
    create_streams(client, raw)
    body = b"".join(data.bodies[0].splitlines(keepends=True)[:1001])
    started = time.monotonic()
    response = client.post(
        f"/streams/{raw}/runs",
        params={"wait": "true", "run_id": "warmup"},
        content=body,
        headers={"content-type": "text/csv"},
    )
    if response.status_code != 200:
        raise BenchError(f"warm-up run failed: {response.status_code} {response.text}")
    return time.monotonic() - started


def copy_baseline(
    database_url: str, data: Dataset, table: str = PLAIN, columns: str = COLUMNS
) -> Timing:
    """COPY every body (one COPY, one transaction per body) into a plain table ``table`` of
    ``columns``, made anew."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} ({columns})")
        started = time.monotonic()
        with conn.cursor() as cursor:
            for body in data.bodies:
                with cursor.copy(f"COPY {table} FROM STDIN (FORMAT csv, HEADER true)") as copy:
                    copy.write(body)
        seconds = time.monotonic() - started
    return Timing("PostgreSQL COPY", data.rows, seconds, f"{len(data.bodies)} COPYs, 1 conn")


@contextmanager
def http_clients(base_url: str) -> Iterator[Callable[[], httpx.Client]]:
    """One httpx.Client per thread (a client's connection pool is not shared)."""
    local = threading.local()
    made: list[httpx.Client] = []
    lock = threading.Lock()

    def get() -> httpx.Client:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base_url, timeout=HTTP_TIMEOUT)
            with lock:
                made.append(client)
        return client

    try:
        yield get
    finally:
        for client in made:
            client.close()


def post_runs(server: Server, data: Dataset, threads: int, mode: str, raw: str = RAW) -> Timing:
    """Post every body as a run of ``raw``; the clock stops when every run is committed."""
    wait = mode == "wait"
    latencies: list[float] = []

    with http_clients(server.url) as client:

        def post(index: int) -> str:
            run_id = f"{raw}-{index:05d}"
            started = time.monotonic()
            response = client().post(
                f"/streams/{raw}/runs",
                params={"wait": "true" if wait else "false", "run_id": run_id},
                content=data.bodies[index],
                headers={"content-type": "text/csv"},
            )
            latencies.append(time.monotonic() - started)
            expected = 200 if wait else 202
            if response.status_code != expected:
                raise BenchError(f"run {run_id}: {response.status_code} {response.text}")
            result = response.json()
            if wait and result.get("rows") != data.rows_per_body[index]:
                raise BenchError(
                    f"run {run_id}: {result} (expected {data.rows_per_body[index]} rows)"
                )
            return run_id

        started = time.monotonic()
        with ThreadPoolExecutor(threads, thread_name_prefix="client") as pool:
            run_ids = list(pool.map(post, range(len(data.bodies))))
        accepted = time.monotonic() - started
        if not wait:
            poll_committed(client(), run_ids, data)
        seconds = time.monotonic() - started

    latencies.sort()
    extra = {
        "accepted_s": accepted,
        "latency_p50_s": latencies[len(latencies) // 2],
        "latency_max_s": latencies[-1],
    }
    notes = f"{len(data.bodies)} runs, {threads} threads, wait={'true' if wait else 'false'}"
    return Timing("Strata HTTP ingest", data.rows, seconds, notes, extra)


def stage_seconds(client: httpx.Client) -> dict[str, float]:
    """The server's strata_ingest_stage_seconds_total by stage, from GET /metrics."""
    response = client.get("/metrics")
    response.raise_for_status()
    found = re.findall(
        r'^strata_ingest_stage_seconds_total\{stage="(\w+)"\} (\S+)$', response.text, re.M
    )
    return {stage: float(value) for stage, value in found}


def poll_committed(client: httpx.Client, run_ids: list[str], data: Dataset) -> None:
    pending = dict(zip(run_ids, data.rows_per_body, strict=True))
    deadline = time.monotonic() + HTTP_TIMEOUT
    while pending:
        if time.monotonic() > deadline:
            raise BenchError(f"{len(pending)} runs still not committed after {HTTP_TIMEOUT}s")
        for run_id, rows in list(pending.items()):
            status = client.get(f"/runs/{run_id}").json()
            if status["status"] == "committed":
                if status["rows"] != rows:
                    raise BenchError(f"run {run_id}: {status} (expected {rows} rows)")
                del pending[run_id]
            elif status["status"] != "pending":
                raise BenchError(f"run {run_id}: {status}")
        if pending:
            time.sleep(0.05)


def verify(database_url: str, rows: int) -> list[str]:
    """What is wrong with the archives and views (empty when all is right)."""
    problems: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:

        def scalar(statement: str) -> object:
            row = conn.execute(statement).fetchone()  # type: ignore[arg-type]
            assert row is not None
            return row[0]

        archived = scalar(f"SELECT count(*) FROM {RAW}")
        if archived != rows:
            problems.append(f"count(*) of {RAW} is {archived}, expected {rows}")
        counted = scalar(f"SELECT sum(c) FROM {RAW}_1m")
        if counted != rows:
            problems.append(f"sum(c) of {RAW}_1m is {counted}, expected {rows}")
        cols = "campaign, user_id, price, t"
        differ = scalar(
            f"SELECT count(*) FROM ((SELECT {cols} FROM {RAW} EXCEPT ALL "
            f"SELECT {cols} FROM {PLAIN}) UNION ALL (SELECT {cols} FROM {PLAIN} "
            f"EXCEPT ALL SELECT {cols} FROM {RAW})) d"
        )
        if differ:
            problems.append(f"{RAW} and {PLAIN} differ in {differ} rows")
        problems += oracle_problems(conn, RAW, rollup=True)
    return problems


def oracle_problems(conn: psycopg.Connection, raw: str, *, rollup: bool = False) -> list[str]:
    """Views of ``raw`` (streams made by create_streams) that differ from the same query as a
    batch GROUP BY over the raw archive."""
    problems = []
    for suffix, (names, oracle) in (ORACLES | ROLLUP_ORACLE if rollup else ORACLES).items():
        view = f"{raw}{suffix}"
        batch = oracle.format(source=raw)
        row = conn.execute(
            f"SELECT count(*) FROM ((SELECT {names} FROM {view} EXCEPT ALL {batch}) "  # type: ignore[arg-type]
            f"UNION ALL ({batch} EXCEPT ALL SELECT {names} FROM {view})) d"
        ).fetchone()
        differ = row[0] if row else None
        if differ != 0:
            problems.append(f"view {view} differs from its batch GROUP BY in {differ} rows")
    return problems


# ---- report ----------------------------------------------------------------------------


def print_table(timings: list[Timing], *, phase_width: int = 22, rows_width: int = 10) -> None:
    print(f"{'phase':<{phase_width}} {'rows':>{rows_width}} {'seconds':>9} {'rows/s':>11}  notes")
    for t in timings:
        rate = f"{t.rows_per_s:,.0f}" if t.rows else ""
        rows = f"{t.rows:,}" if t.rows else ""
        print(
            f"{t.name:<{phase_width}} {rows:>{rows_width}} {t.seconds:>9.2f} {rate:>11}  {t.notes}"
        )


def run(args: argparse.Namespace) -> int:
    return run_benchmark(args)[0]


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figure."""
    started = time.monotonic()
    data = generate(args.rows, args.run_rows, args.seed)
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            f"{len(data.bodies)} bodies, {data.size / 1e6:.1f} MB, late runs {data.late_runs}",
        )
    ]
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-"))
    server: Server | None = None
    exit_code = 0
    results: list[Result] = []
    try:
        server = start_server(data_dir)
        timings.append(Timing("strata up", 0, server.started_in, server.database_url))
        with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
            create_streams(client, RAW, rollup=True)
            if args.warmup:
                timings.append(Timing("warm-up run", 0, warm_up(client, data), "1000 rows"))
            load_before = os.getloadavg()[0]
            copy = copy_baseline(server.database_url, data)
            before = stage_seconds(client)
            strata = post_runs(server, data, args.threads, args.mode)
            profile = {k: v - before.get(k, 0.0) for k, v in stage_seconds(client).items()}
        strata.notes += ", p50 {latency_p50_s:.2f}s max {latency_max_s:.2f}s".format(**strata.extra)
        if args.mode == "async":
            strata.notes += f", accepted after {strata.extra['accepted_s']:.2f}s"
        timings += [copy, strata]

        started = time.monotonic()
        problems = verify(server.database_url, data.rows)
        timings.append(Timing("verify", 0, time.monotonic() - started, "; ".join(problems) or "ok"))
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        if code is None:
            problems.append(f"server still running {STOP_TIMEOUT:.0f}s after SIGTERM; killed")
        elif code < 0:
            problems.append(
                f"server died of signal {-code} after SIGTERM instead of shutting "
                "down gracefully (exit code 0)"
            )
        elif code != 0:
            problems.append(f"server exit code {code} after SIGTERM")
        orphan = stop_orphaned_postgres(data_dir)
        if orphan is not None:
            problems.append(
                f"the embedded PostgreSQL (pid {orphan}) outlived the server; "
                "the benchmark stopped it"
            )
        print_table(timings)
        print(
            f"\n{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after the timed phases"
        )
        print(
            "where Strata's time went (seconds summed over runs and batches; stages of "
            "different runs overlap): "
            + ", ".join(f"{stage} {profile.get(stage, 0.0):.2f}" for stage in STAGES)
        )
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:15]:
                print("  " + line[:300])
        print(
            json.dumps(
                {
                    "rows": data.rows,
                    "strata_rows_per_s": round(strata.rows_per_s),
                    "copy_rows_per_s": round(copy.rows_per_s),
                    "ratio": round(strata.rows_per_s / copy.rows_per_s, 3),
                }
            )
        )
        results.append(
            Result(
                f"HTTP ingest (CSV runs of {args.run_rows:,} rows, {args.threads} client "
                f"threads, {'wait=true' if args.mode == 'wait' else 'accept then poll'})",
                strata.rows_per_s,
                copy.rows_per_s,
                "PostgreSQL COPY of the raw rows",
                "rows/s",
                "higher",
                context={
                    "rows": data.rows,
                    "runs": len(data.bodies),
                    "strata_seconds": round(strata.seconds, 3),
                    "copy_seconds": round(copy.seconds, 3),
                    "latency_p50_s": round(strata.extra["latency_p50_s"], 3),
                    "latency_max_s": round(strata.extra["latency_max_s"], 3),
                    **{f"{k}_s": round(profile.get(k, 0.0), 3) for k in STAGES},
                },
            )
        )
        if problems:
            print("\nWRONG:\n  " + "\n  ".join(problems), file=sys.stderr)
            exit_code = 1
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        exit_code = 1
    finally:
        clean_up(server, data_dir, failed=exit_code != 0, keep=args.keep)
    return exit_code, results


def clean_up(server: Server | None, data_dir: Path, *, failed: bool, keep: bool) -> None:
    """Stop the server (and a PostgreSQL it left), show its log if the run failed, and remove
    the data dir unless it is to be kept."""
    if server is not None and server.process.poll() is None:
        stop_server(server)
    stop_orphaned_postgres(data_dir)
    if failed and server is not None:
        print(f"\nserver log tail ({server.log_path}):\n{server.log_tail()}", file=sys.stderr)
    if keep or failed:
        print(f"kept {data_dir}", file=sys.stderr)
    else:
        shutil.rmtree(data_dir, ignore_errors=True)


# The arguments of each scale of bench/run.py (full: the defaults, the README's figure).
SCALES = {
    "smoke": ["--rows", "3000", "--run-rows", "1000", "--threads", "2", "--no-warmup"],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench/figures.py)."""
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))
    if code:
        raise BenchError("the ingest benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.run_rows <= 0 or args.threads <= 0:
        parser.error("--rows, --run-rows and --threads must be positive")
    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in all (1000000)")
    parser.add_argument("--run-rows", type=int, default=50_000, help="rows per run (50000)")
    parser.add_argument("--threads", type=int, default=4, help="client threads (4)")
    parser.add_argument(
        "--mode",
        choices=("wait", "async"),
        default="wait",
        help="wait: wait=true per request; async: post all, poll (wait)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="random seed (2024)")
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-up run"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir (server log, embedded PostgreSQL)"
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
