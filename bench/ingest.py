"""Benchmark of Strata's ingest path against PostgreSQL's COPY, end to end.

    python -m bench.ingest [--rows 1000000] [--run-rows 50000] [--threads 4,1] [--warm-runs 0]
                           [--keep]

What it does, in one process tree:

1. generates ``--rows`` ad impressions deterministically (seeded): ~100 campaigns, event
   times spread over one day in run order, and about 20% of the runs carrying late data
   (half of their rows from earlier in the day); all CSV bodies are built before any timing;
2. starts ``strata up`` as a real subprocess on a free port and a temporary data dir
   (embedded PostgreSQL, local Spark; bench.harness.server), and reads ``database_url``
   from ``GET /info``;
3. creates the raw stream ``impsns`` and three derived streams over it (1-minute count and
   revenue per campaign; 5-minute average and maximum price per campaign; the hourly
   roll-up of the 1-minute stream), and the same again (``impsns_t1``, ...) for every
   further timed phase; posts the untimed warm-up: a 1,000-row run, then ``--warm-runs``
   full runs one at a time, into a stream of the same shape;
4. baseline: ``COPY impsns_plain FROM STDIN (FORMAT csv)`` of the same bodies, one COPY per
   body, into a plain table of the same columns in the same database;
5. Strata, one timed phase per entry of ``--threads`` (4 client threads, then 1): posts
   every body to ``POST /streams/impsns/runs`` (text/csv; the later phases to their own
   raw streams) from that many client threads, and stops the clock when every run is
   committed, while sampling the peak memory (PSS) of the server, its Spark JVM and its
   PostgreSQL together (bench.harness.memory): with ``--mode wait``
   (default) each request uses ``wait=true`` and returns once its run is committed; with
   ``--mode async`` requests return on acceptance and the runs are polled until committed;
6. checks the results (raw archive == the COPY'd rows; every view == the same query as a
   batch GROUP BY in PostgreSQL) and exits non-zero when anything is wrong;
7. stops the server with SIGTERM and requires a clean exit within 60 s.

Prints a table, where the server's time went (the ingest stages it times: parse, spool,
spark, postgres; from ``GET /metrics``) and the peak memory per phase, and a JSON line per
phase ``{"rows", "threads", "strata_rows_per_s", "copy_rows_per_s", "ratio",
"peak_memory_mb"}``. The server's log is ``<data dir>/server.log`` (kept with ``--keep``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from bench.harness.api import HTTP_TIMEOUT, post_runs
from bench.harness.data import Dataset
from bench.harness.database import copy_baseline, scalar
from bench.harness.errors import BenchError
from bench.harness.impressions import (
    COLUMNS,
    PLAIN,
    RAW,
    create_streams,
    generate,
    oracle_problems,
)
from bench.harness.memory import Peak, PeakMemory
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import (
    Server,
    clean_up,
    log_problems,
    pgdata,
    start_server,
    start_timings,
    stop_orphaned_postgres,
    stop_problems,
    stop_server,
)

# Stages of ingestion the server times (strata_ingest_stage_seconds of GET /metrics).
STAGES = ("parse", "spool", "spark", "postgres")


def warm_up(client: httpx.Client, data: Dataset, runs: int) -> float:
    """One small run into a separate stream of the same shape, so that the timed phase does
    not include the first Spark job's JVM warm-up, then ``runs`` full runs of ``data`` one
    at a time (the JVM compiles Spark's code for a minute or so of ingest); returns the
    time it took."""
    raw = "warmup"
    create_streams(client, raw)
    started = time.monotonic()
    bodies = [b"".join(data.bodies[0].splitlines(keepends=True)[:1001])]
    bodies += [data.bodies[k % len(data.bodies)] for k in range(runs)]
    for number, body in enumerate(bodies):
        response = client.post(
            f"/streams/{raw}/runs",
            params={"wait": "true", "run_id": f"warmup-{number}"},
            content=body,
            headers={"content-type": "text/csv"},
        )
        if response.status_code != 200:
            raise BenchError(f"warm-up run failed: {response.status_code} {response.text}")
    return time.monotonic() - started


def stage_seconds(client: httpx.Client) -> dict[str, float]:
    """The server's strata_ingest_stage_seconds_total by stage, from GET /metrics."""
    response = client.get("/metrics")
    response.raise_for_status()
    found = re.findall(
        r'^strata_ingest_stage_seconds_total\{stage="(\w+)"\} (\S+)$', response.text, re.M
    )
    return {stage: float(value) for stage, value in found}


def verify(database_url: str, rows: int, raw: str) -> list[str]:
    """What is wrong with the archives and views of ``raw`` (empty when all is right)."""
    problems: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        archived = scalar(conn, f"SELECT count(*) FROM {raw}")
        if archived != rows:
            problems.append(f"count(*) of {raw} is {archived}, expected {rows}")
        counted = scalar(conn, f"SELECT sum(c) FROM {raw}_1m")
        if counted != rows:
            problems.append(f"sum(c) of {raw}_1m is {counted}, expected {rows}")
        cols = "campaign, user_id, price, t"
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


@dataclass
class Phase:
    """A timed phase: its client threads, its raw stream, and what was measured."""

    threads: int
    raw: str
    timing: Timing
    profile: dict[str, float]  # seconds per ingest stage
    peak: Peak


def raw_stream(threads: int, first: bool) -> str:
    """The raw stream a phase posts to: each phase has its own, with its own streams."""
    return RAW if first else f"{RAW}_t{threads}"


def figure_name(args: argparse.Namespace, threads: int) -> str:
    clients = f"{threads} client thread{'s' if threads > 1 else ''}"
    mode = "wait=true" if args.mode == "wait" else "accept then poll"
    return f"HTTP ingest (CSV runs of {args.run_rows:,} rows, {clients}, {mode})"


def run(args: argparse.Namespace) -> int:
    return run_benchmark(args)[0]


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    """The benchmark; returns its exit code and its figures (one per --threads entry)."""
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
    phases = [(threads, raw_stream(threads, k == 0)) for k, threads in enumerate(args.threads)]
    try:
        server = start_server(data_dir)
        timings += start_timings(server, server.database_url)
        measured: list[Phase] = []
        with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
            for _threads, raw in phases:
                create_streams(client, raw, rollup=True)
            if args.warmup:
                what = "1000 rows" + (f", then {args.warm_runs} runs" if args.warm_runs else "")
                warm = warm_up(client, data, args.warm_runs)
                timings.append(Timing("warm-up", 0, warm, what))
            load_before = os.getloadavg()[0]
            copy = copy_baseline(server.database_url, data, PLAIN, COLUMNS)
            timings.append(copy)
            for threads, raw in phases:
                before = stage_seconds(client)
                with PeakMemory(server.process.pid, pgdata(data_dir)) as peak:
                    strata = post_runs(server, data, threads, args.mode, raw)
                profile = {k: v - before.get(k, 0.0) for k, v in stage_seconds(client).items()}
                strata.notes += ", p50 {latency_p50_s:.2f}s max {latency_max_s:.2f}s".format(
                    **strata.extra
                )
                if args.mode == "async":
                    strata.notes += f", accepted after {strata.extra['accepted_s']:.2f}s"
                timings.append(strata)
                measured.append(Phase(threads, raw, strata, profile, peak))

        started = time.monotonic()
        problems = [
            p for phase in measured for p in verify(server.database_url, data.rows, phase.raw)
        ]
        timings.append(Timing("verify", 0, time.monotonic() - started, "; ".join(problems) or "ok"))
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
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
        for phase in measured:
            print(
                f"{phase.threads} client thread(s): where Strata's time went (seconds summed "
                "over runs and batches; stages of different runs overlap): "
                + ", ".join(f"{stage} {phase.profile.get(stage, 0.0):.2f}" for stage in STAGES)
                + f"; {phase.peak.describe()}"
            )
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:15]:
                print("  " + line[:300])
        for phase in measured:
            strata, profile, peak = phase.timing, phase.profile, phase.peak
            ratio = round(strata.rows_per_s / copy.rows_per_s, 3)
            print(
                json.dumps(
                    {
                        "rows": data.rows,
                        "threads": phase.threads,
                        "strata_rows_per_s": round(strata.rows_per_s),
                        "copy_rows_per_s": round(copy.rows_per_s),
                        "ratio": ratio,
                        "peak_memory_mb": round(peak.total_mb),
                    }
                )
            )
            results.append(
                Result(
                    figure_name(args, phase.threads),
                    strata.rows_per_s,
                    copy.rows_per_s,
                    "PostgreSQL COPY of the raw rows",
                    "rows/s",
                    "higher",
                    notes=peak.describe(),
                    context={
                        "rows": data.rows,
                        "runs": len(data.bodies),
                        "warm_up_runs": args.warm_runs,
                        "strata_seconds": round(strata.seconds, 3),
                        "copy_seconds": round(copy.seconds, 3),
                        "latency_p50_s": round(strata.extra["latency_p50_s"], 3),
                        "latency_max_s": round(strata.extra["latency_max_s"], 3),
                        **{f"{k}_s": round(profile.get(k, 0.0), 3) for k in STAGES},
                        "peak_memory_mb": round(peak.total_mb),
                        **{
                            f"peak_memory_{name.split()[-1].lower()}_mb": round(mb)
                            for name, mb in peak.parts_mb.items()
                        },
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


SCALES = {
    "smoke": ["--rows", "3000", "--run-rows", "1000", "--threads", "2,1", "--no-warmup"],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))
    if code:
        raise BenchError("the ingest benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.run_rows <= 0 or min(args.threads) <= 0 or args.warm_runs < 0:
        parser.error("--rows, --run-rows and --threads must be positive, --warm-runs not negative")
    if len(set(args.threads)) != len(args.threads):
        parser.error("--threads names each number of client threads once")
    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in all (1000000)")
    parser.add_argument("--run-rows", type=int, default=50_000, help="rows per run (50000)")
    parser.add_argument(
        "--threads",
        type=_counts,
        default=[4, 1],
        help="client threads of each timed phase, in order, each posting every run into its "
        "own raw stream (4,1)",
    )
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
        "--warm-runs",
        type=int,
        default=0,
        help="untimed full runs posted one at a time after the warm-up run (0)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir (server log, embedded PostgreSQL)"
    )
    return parser


def _counts(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None


if __name__ == "__main__":
    sys.exit(main())
