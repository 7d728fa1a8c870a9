"""Benchmark of the SQL port: COPY through it against HTTP ingest and against PostgreSQL's
own COPY, and pgbench's select-only script through it against PostgreSQL directly.

    python -m bench.pgwire [--rows 1000000] [--run-rows 50000] [--threads 4]
                           [--pgbench-seconds 10] [--pgbench-scale 10] [--keep]

What it does, in one process tree:

1. generates the ingest benchmark's rows (bench.harness.impressions, seeded): CSV bodies
   of ``--run-rows`` rows, about 20% of the runs carrying late data;
2. starts ``strata up`` (bench.harness.server) and reads ``psql_url``, its SQL port;
3. creates raw streams of the same columns, each with the ingest benchmark's three derived
   streams (1-minute count and revenue, 5-minute average and maximum price, the hourly
   roll-up), one per load and turn;
4. after an untimed warm-up (a run over HTTP and a COPY, into a stream of their own),
   loads, one after the other: the baseline ``COPY impsns_plain FROM STDIN (FORMAT csv)``
   of every body into a plain table (bench.harness.database); then, in two turns into
   fresh streams, the order reversed in the second (a load that comes later meets a warmer
   JVM and PostgreSQL; each load's better turn counts): the bodies over HTTP from
   ``--threads`` clients with ``wait=true``, a ``COPY ... FROM STDIN (FORMAT csv, HEADER,
   RUN_ID ...)`` per body through the port from ``--threads`` sessions, and one such COPY
   of all the rows (one run); a COPY's clock stops at ``COPY n``, which the port answers
   once the run is committed;
5. checks every raw stream against the plain table, and every view against its batch query;
6. pgbench: ``pgbench -i`` into Strata's database (directly), then ``pgbench -S`` (its
   select-only script) with 4 clients for ``--pgbench-seconds``, in the simple and the
   prepared protocol, through the port and directly, taking turns (two rounds, the better
   of each counts): the relay's cost on reads;
7. stops the server (SIGTERM, a clean exit required).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

from bench.harness.api import HTTP_TIMEOUT, post_runs
from bench.harness.data import Dataset
from bench.harness.database import copy_baseline, scalar
from bench.harness.errors import BenchError
from bench.harness.impressions import (
    COLUMNS,
    HEADER,
    PLAIN,
    create_streams,
    generate,
    oracle_problems,
)
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import (
    Server,
    clean_up,
    log_problems,
    start_server,
    start_timings,
    stop_orphaned_postgres,
    stop_problems,
    stop_server,
)
from server.engines.embedded_pg import POSTGRES_BIN_PATH

# The three loads, in ROUNDS turns into fresh streams, the order reversed every other
# turn: a load that comes later meets a warmer JVM and PostgreSQL, so each load's better
# turn counts.
ROUNDS = 2
WAYS = ("http", "copies", "one")


def raw_of(way: str, turn: int) -> str:
    return f"impsns_{way}{turn}"


def raw_streams() -> list[str]:
    return [raw_of(way, turn) for turn in range(ROUNDS) for way in WAYS]


PGBENCH_MODES = ("simple", "prepared")


def one_body(data: Dataset) -> bytes:
    """Every row of ``data`` in one CSV body, under one header."""
    header = HEADER.encode()
    return header + b"".join(body[len(header) :] for body in data.bodies)


def copy_once(psql_url: str, raw: str, body: bytes, run_id: str) -> int:
    """One COPY through the port; the rows it answers (``COPY n``), once committed."""
    statement = f"COPY {raw} FROM STDIN (FORMAT csv, HEADER, RUN_ID '{run_id}')"
    with psycopg.connect(psql_url, autocommit=True) as conn, conn.cursor() as cursor:
        with cursor.copy(statement) as copy:  # type: ignore[arg-type]
            copy.write(body)
        return cursor.rowcount


def copy_all(psql_url: str, data: Dataset, raw: str) -> Timing:
    body = one_body(data)
    started = time.monotonic()
    rows = copy_once(psql_url, raw, body, f"{raw}-all")
    seconds = time.monotonic() - started
    if rows != data.rows:
        raise BenchError(f"the COPY of all rows answered COPY {rows}, not {data.rows}")
    return Timing("SQL port: one COPY", data.rows, seconds, f"1 run, {len(body) / 1e6:.1f} MB")


def copy_runs(psql_url: str, data: Dataset, threads: int, raw: str) -> Timing:
    """A COPY per body from ``threads`` sessions, each its own run."""
    latencies: list[float] = []

    def load(index: int) -> None:
        started = time.monotonic()
        rows = copy_once(psql_url, raw, data.bodies[index], f"{raw}-{index:05d}")
        latencies.append(time.monotonic() - started)
        if rows != data.rows_per_body[index]:
            raise BenchError(f"COPY {index} answered COPY {rows}, not {data.rows_per_body[index]}")

    started = time.monotonic()
    with ThreadPoolExecutor(threads, thread_name_prefix="copy") as pool:
        list(pool.map(load, range(len(data.bodies))))
    seconds = time.monotonic() - started
    extra = {"latency_p50_s": percentile(latencies, 0.5), "latency_max_s": max(latencies)}
    notes = f"{len(data.bodies)} runs, {threads} sessions, p50 {extra['latency_p50_s']:.2f}s"
    return Timing("SQL port: COPY per run", data.rows, seconds, notes, extra)


def take_turns(server: Server, data: Dataset, threads: int) -> dict[str, list[Timing]]:
    """Each load (WAYS) once per turn, into fresh streams, in reversed order every other
    turn: the runs over HTTP, a COPY per run through the port, and one COPY of all rows."""
    taken: dict[str, list[Timing]] = {way: [] for way in WAYS}
    for turn in range(ROUNDS):
        for way in WAYS if turn % 2 == 0 else WAYS[::-1]:
            raw = raw_of(way, turn)
            if way == "http":
                timing = post_runs(server, data, threads, "wait", raw)
            elif way == "copies":
                timing = copy_runs(server.psql_url, data, threads, raw)
            else:
                timing = copy_all(server.psql_url, data, raw)
            timing.name += f" ({turn + 1})"
            taken[way].append(timing)
    return taken


def warm_up(client: httpx.Client, psql_url: str, data: Dataset) -> float:
    """One small run over HTTP and one COPY through the port, into streams of their own, so
    that no timed phase pays for the first Spark job or the first connection."""
    create_streams(client, "warmup", rollup=True)
    body = b"".join(data.bodies[0].splitlines(keepends=True)[:1001])
    started = time.monotonic()
    response = client.post(
        "/streams/warmup/runs",
        params={"wait": "true", "run_id": "warmup"},
        content=body,
        headers={"content-type": "text/csv"},
    )
    if response.status_code != 200:
        raise BenchError(f"warm-up run failed: {response.status_code} {response.text}")
    copy_once(psql_url, "warmup", body, "warmup-copy")
    return time.monotonic() - started


def verify(database_url: str, rows: int) -> list[str]:
    problems: list[str] = []
    cols = "campaign, user_id, price, t"
    with psycopg.connect(database_url, autocommit=True) as conn:
        for raw in raw_streams():
            archived = scalar(conn, f"SELECT count(*) FROM {raw}")
            if archived != rows:
                problems.append(f"count(*) of {raw} is {archived}, expected {rows}")
            differ = scalar(
                conn,
                f"SELECT count(*) FROM ((SELECT {cols} FROM {raw} EXCEPT ALL "
                f"SELECT {cols} FROM {PLAIN}) UNION ALL (SELECT {cols} FROM {PLAIN} "
                f"EXCEPT ALL SELECT {cols} FROM {raw})) d",
            )
            if differ:
                problems.append(f"{raw} and {PLAIN} differ in {differ} rows")
            problems += oracle_problems(conn, raw, rollup=True)
    return problems


# ---- pgbench ---------------------------------------------------------------------------

PGBENCH = POSTGRES_BIN_PATH / "pgbench"
_TPS = re.compile(r"^tps = ([0-9.]+)", re.M)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.M)


def pgbench(url: str, mode: str, seconds: int) -> tuple[float, float]:
    """``pgbench -S`` (select only) with 4 clients on 2 threads: (transactions/s, average
    latency in ms)."""
    result = subprocess.run(
        [str(PGBENCH), "-S", "-n", "-c", "4", "-j", "2", "-T", str(seconds), "-M", mode, url],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    tps, latency = _TPS.search(result.stdout), _LATENCY.search(result.stdout)
    if result.returncode != 0 or tps is None or latency is None:
        raise BenchError(f"pgbench -M {mode} on {url} failed: {result.stderr[-2000:]}")
    return float(tps.group(1)), float(latency.group(1))


def pgbench_rounds(
    database_url: str, psql_url: str, seconds: int, scale: int, rounds: int
) -> dict[str, dict[str, tuple[float, float]]]:
    """The best (transactions/s, latency ms) of each mode through the port and directly."""
    init = subprocess.run(
        [str(PGBENCH), "-i", "-q", "-s", str(scale), database_url],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if init.returncode != 0:
        raise BenchError(f"pgbench -i failed: {init.stderr[-2000:]}")
    best: dict[str, dict[str, tuple[float, float]]] = {}
    for _ in range(rounds):
        for mode in PGBENCH_MODES:
            for target, url in (("direct", database_url), ("port", psql_url)):
                measured = pgbench(url, mode, seconds)
                current = best.setdefault(mode, {}).get(target)
                if current is None or measured[0] > current[0]:
                    best[mode][target] = measured
    return best


# ---- the benchmark ---------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figures."""
    started = time.monotonic()
    data = generate(args.rows, args.run_rows, args.seed)
    timings = [
        Timing(
            "generate CSV",
            0,
            time.monotonic() - started,
            f"{len(data.bodies)} bodies, {data.size / 1e6:.1f} MB",
        )
    ]
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-pgwire-"))
    server: Server | None = None
    exit_code = 0
    results: list[Result] = []
    try:
        server = start_server(data_dir)
        timings += start_timings(server, server.psql_url)
        with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
            for raw in raw_streams():
                create_streams(client, raw, rollup=True)
            if args.warmup:
                timings.append(Timing("warm-up", 0, warm_up(client, server.psql_url, data)))
        load_before = os.getloadavg()[0]
        plain = copy_baseline(server.database_url, data, PLAIN, COLUMNS)
        taken = take_turns(server, data, args.threads)
        load_after = os.getloadavg()[0]
        http, per_run, one = (max(taken[w], key=lambda t: t.rows_per_s) for w in WAYS)
        timings += [plain, *(t for way in WAYS for t in taken[way])]

        checked = time.monotonic()
        problems = verify(server.database_url, data.rows)
        timings.append(Timing("verify", 0, time.monotonic() - checked, "; ".join(problems) or "ok"))

        benched = time.monotonic()
        reads = pgbench_rounds(
            server.database_url,
            server.psql_url,
            args.pgbench_seconds,
            args.pgbench_scale,
            args.pgbench_rounds,
        )
        timings.append(Timing("pgbench -S", 0, time.monotonic() - benched, _reads_note(reads)))
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        if stop_orphaned_postgres(data_dir) is not None:
            problems.append("the embedded PostgreSQL outlived the server; the benchmark stopped it")
        print_table(timings, phase_width=28)
        print(
            f"\n{os.cpu_count()} CPUs; load average (1 min) {load_before:.2f} before, "
            f"{load_after:.2f} after the loads"
        )
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:15]:
                print("  " + line[:300])
        results = _results(args, data, plain, http, one, per_run, reads)
        if problems:
            print("\nWRONG:\n  " + "\n  ".join(problems), file=sys.stderr)
            exit_code = 1
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        exit_code = 1
    finally:
        clean_up(server, data_dir, failed=exit_code != 0, keep=args.keep)
    return exit_code, results


def _reads_note(reads: dict[str, dict[str, tuple[float, float]]]) -> str:
    return "; ".join(
        f"{mode}: port {r['port'][0]:,.0f} tps, direct {r['direct'][0]:,.0f} tps"
        for mode, r in reads.items()
    )


def _results(
    args: argparse.Namespace,
    data: Dataset,
    plain: Timing,
    http: Timing,
    one: Timing,
    per_run: Timing,
    reads: dict[str, dict[str, tuple[float, float]]],
) -> list[Result]:
    streams = "3 derived streams"
    context: dict[str, float | int | str] = {
        "rows": data.rows,
        "runs": len(data.bodies),
        "copy_seconds": round(plain.seconds, 3),
    }
    results = [
        Result(
            f"SQL port: one COPY of {data.rows:,} rows (one run, {streams})",
            one.rows_per_s,
            plain.rows_per_s,
            "PostgreSQL COPY of the raw rows",
            "rows/s",
            "higher",
            context=context | {"strata_seconds": round(one.seconds, 3)},
        ),
        Result(
            f"SQL port: a COPY per run of {args.run_rows:,} rows, {args.threads} sessions "
            f"({streams})",
            per_run.rows_per_s,
            plain.rows_per_s,
            "PostgreSQL COPY of the raw rows",
            "rows/s",
            "higher",
            context=context
            | {
                "strata_seconds": round(per_run.seconds, 3),
                "latency_p50_s": round(per_run.extra["latency_p50_s"], 3),
                "latency_max_s": round(per_run.extra["latency_max_s"], 3),
            },
        ),
        Result(
            f"SQL port against HTTP: the same runs as COPYs and as POSTs ({args.threads} "
            "clients, wait=true)",
            per_run.rows_per_s,
            http.rows_per_s,
            "HTTP ingest of the same runs",
            "rows/s",
            "higher",
            context={
                "http_seconds": round(http.seconds, 3),
                "copy_seconds": round(per_run.seconds, 3),
            },
        ),
    ]
    for mode, measured in reads.items():
        port_tps, port_ms = measured["port"]
        direct_tps, direct_ms = measured["direct"]
        results.append(
            Result(
                f"pgbench -S -M {mode}, 4 clients, through the SQL port",
                port_tps,
                direct_tps,
                "pgbench -S directly against PostgreSQL",
                "transactions/s",
                "higher",
                notes="the relay's cost on reads",
                context={"port_latency_ms": port_ms, "direct_latency_ms": direct_ms},
            )
        )
    return results


SCALES = {
    "smoke": [
        *("--rows", "3000", "--run-rows", "1000", "--threads", "2", "--no-warmup"),
        *("--pgbench-seconds", "2", "--pgbench-scale", "1", "--pgbench-rounds", "1"),
    ],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))
    if code:
        raise BenchError("the SQL port benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if min(args.rows, args.run_rows, args.threads, args.pgbench_seconds) <= 0:
        parser.error("--rows, --run-rows, --threads and --pgbench-seconds must be positive")
    return run_benchmark(args)[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in all (1000000)")
    parser.add_argument("--run-rows", type=int, default=50_000, help="rows per run (50000)")
    parser.add_argument("--threads", type=int, default=4, help="client threads (4)")
    parser.add_argument("--seed", type=int, default=2024, help="random seed (2024)")
    parser.add_argument(
        "--pgbench-seconds", type=int, default=10, help="seconds of each pgbench run (10)"
    )
    parser.add_argument(
        "--pgbench-scale", type=int, default=10, help="pgbench -i scale factor (10)"
    )
    parser.add_argument(
        "--pgbench-rounds", type=int, default=2, help="turns of port and direct (2)"
    )
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-ups"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir (server log, embedded PostgreSQL)"
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
