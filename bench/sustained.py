"""Sustained ingest: runs posted without waiting, as a log shipper or a loader posts them,
for ten minutes, against the floor of PostgreSQL's COPY measured in the same run.

    python -m bench.sustained [--minutes 10] [--clients 4] [--run-rows 20000] [--pool 60]
                              [--probe-every 2] [--max-spool-seconds 30] [--keep]

What it does, in one process tree:

1. generates ``--pool`` CSV bodies of ``--run-rows`` ad impressions (bench.harness.
   impressions: about 20% of them late runs carrying rows from earlier in the day), before
   any timing;
2. starts ``strata up`` as a real subprocess (embedded PostgreSQL, local Spark), with
   ``STRATA_MAX_SPOOL_SECONDS`` set to ``--max-spool-seconds`` (30: while the oldest run
   waiting for its commit has waited that long, new runs get 429; 0: the server's default,
   no bound), and creates the raw stream ``impsns`` with the ingest benchmark's derived
   streams (1-minute count and revenue, 5-minute average and maximum, the hourly roll-up);
3. baseline: ``COPY impsns_plain FROM STDIN (FORMAT csv)`` of every pool body, one COPY per
   body, in the same database: the floor cost of archiving the rows;
4. for ``--minutes``, ``--clients`` threads post the pool's bodies round and round as runs
   (each a run id of its own, ``wait=false``); a 429 (spool full) is waited out for its
   ``Retry-After`` and the run posted again, which is the back-pressure a loader meets.
   Meanwhile a probe posts a 1,000-row run with ``wait=true`` every ``--probe-every``
   seconds: its latency is the freshness (POST to visible) a small run gets under load;
5. when the time is up, waits until every acknowledged run is committed;
6. reads every run's ``received_at`` and ``committed_at`` from the catalog and derives,
   every 10 seconds of the run: rows committed per second, rows held (accepted, not yet
   committed), and the runs' response times and slowdowns (response time / the time its
   batch took, from GET /metrics' strata_run_slowdown); draws them in
   ``sustained.png`` beside the results (bench/results, or ``--out`` of bench/run.py);
7. checks that nothing was lost: every acknowledged run committed once (a set check of the
   ledger against the catalog), the raw archive holds the rows acknowledged, and every view
   equals the same query as a batch GROUP BY over the raw archive.

The sustained figure is the rows committed from the end of the first minute (the JVM's and
PostgreSQL's warm-up transient; ``--warm-seconds``) until the last acknowledged run
committed, over that time.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from bench.harness.api import HTTP_TIMEOUT
from bench.harness.data import Dataset, day_timestamp
from bench.harness.database import copy_baseline, scalar
from bench.harness.errors import BenchError
from bench.harness.impressions import (
    COLUMNS,
    HEADER,
    PLAIN,
    RAW,
    create_streams,
    generate,
    impression,
    oracle_problems,
)
from bench.harness.memory import PeakMemory
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, print_table, results_dir
from bench.harness.server import (
    Server,
    clean_up,
    log_problems,
    pgdata,
    start_server,
    start_timings,
    stop_problems,
    stop_server,
)
from rewriter.naming import CATALOG_SCHEMA

RUNS = sql.Identifier(CATALOG_SCHEMA, "runs")  # the catalog's runs, received and committed
BUCKET_S = 10.0  # the curve's resolution
PROBE_ROWS = 1_000


@dataclass
class Ledger:
    """What the clients sent and the server acknowledged: run id -> rows."""

    acknowledged: dict[str, int] = field(default_factory=dict)
    refused_for_room: int = 0  # 429s waited out
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, run_id: str, rows: int) -> None:
        with self.lock:
            if run_id in self.acknowledged:
                raise BenchError(f"run id {run_id} acknowledged twice")
            self.acknowledged[run_id] = rows


def post_run(
    client: httpx.Client, run_id: str, body: bytes, *, wait: bool, ledger: Ledger
) -> httpx.Response:
    """POST one CSV run, waiting out 429s (spool full) for their Retry-After (counted in
    ``ledger``)."""
    while True:
        response = client.post(
            f"/streams/{RAW}/runs",
            params={"run_id": run_id, "wait": "true" if wait else "false"},
            content=body,
            headers={"content-type": "text/csv"},
        )
        if response.status_code != 429:
            return response
        with ledger.lock:
            ledger.refused_for_room += 1
        time.sleep(float(response.headers.get("retry-after", "1")))


def writer(
    url: str,
    number: int,
    clients: int,
    data: Dataset,
    until: float,
    ledger: Ledger,
    errors: list[str],
) -> None:
    """Client ``number`` of ``clients``: posts pool bodies round and round (wait=false) until
    ``until``, the clients together taking the bodies in turn."""
    try:
        with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as client:
            k = 0
            while time.monotonic() < until:
                index = (number + k * clients) % len(data.bodies)
                run_id = f"w{number}-{k:06d}"
                response = post_run(client, run_id, data.bodies[index], wait=False, ledger=ledger)
                if response.status_code != 202:
                    raise BenchError(f"run {run_id}: {response.status_code} {response.text}")
                ledger.add(run_id, data.rows_per_body[index])
                k += 1
    except Exception as err:  # noqa: BLE001 - re-raised by the main thread
        errors.append(f"writer {number}: {err!r}")


def prober(
    url: str, every: float, until: float, ledger: Ledger, latencies: list[float], errors: list[str]
) -> None:
    """A 1,000-row run with wait=true every ``every`` seconds: freshness under load."""
    rng = random.Random(7)
    try:
        with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as client:
            k = 0
            while time.monotonic() < until:
                lines = [HEADER]
                lines += [
                    impression(rng, day_timestamp(rng.randrange(86_400_000)))
                    for _ in range(PROBE_ROWS)
                ]
                run_id = f"probe-{k:05d}"
                started = time.monotonic()
                response = post_run(
                    client, run_id, "".join(lines).encode(), wait=True, ledger=ledger
                )
                if response.status_code != 200 or response.json().get("rows") != PROBE_ROWS:
                    raise BenchError(f"probe {run_id}: {response.status_code} {response.text}")
                latencies.append(time.monotonic() - started)
                ledger.add(run_id, PROBE_ROWS)
                k += 1
                time.sleep(max(0.0, every - (time.monotonic() - started)))
    except Exception as err:  # noqa: BLE001 - re-raised by the main thread
        errors.append(f"probe: {err!r}")


def wait_committed(database_url: str, ledger: Ledger, timeout: float) -> None:
    """Until no acknowledged run is pending."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE stream = %s AND status = 'pending'").format(
                    RUNS
                ),
                (RAW,),
            ).fetchone()
            pending = row[0] if row else None
            if pending == 0:
                return
            time.sleep(0.5)
    raise BenchError(f"runs still pending {timeout:.0f}s after the clients stopped")


@dataclass
class RunTimes:
    run_id: str
    rows: int
    received: float  # seconds since the clients started
    committed: float


def run_times(database_url: str, origin: datetime) -> list[RunTimes]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT run_id, rows, status, received_at, committed_at FROM {} WHERE stream = %s"
            ).format(RUNS),
            (RAW,),
        ).fetchall()
    bad = [r for r in rows if r[2] != "committed"]
    if bad:
        raise BenchError(f"{len(bad)} runs not committed, e.g. {bad[:3]}")
    return [
        RunTimes(
            run_id,
            count,
            (received - origin).total_seconds(),
            (committed - origin).total_seconds(),
        )
        for run_id, count, _status, received, committed in rows
    ]


def set_check(ledger: Ledger, times: list[RunTimes], database_url: str) -> list[str]:
    """Every acknowledged run committed once with its rows; the archive holds them all."""
    problems = []
    committed = Counter(t.run_id for t in times)
    rows_of = {t.run_id: t.rows for t in times}
    missing = [r for r in ledger.acknowledged if r not in committed]
    twice = [r for r, n in committed.items() if n > 1]
    wrong = [r for r, n in ledger.acknowledged.items() if r in rows_of and rows_of[r] != n]
    unknown = [r for r in committed if r not in ledger.acknowledged]
    for what, ids in (
        ("acknowledged and not committed", missing),
        ("committed twice", twice),
        ("committed with other rows than sent", wrong),
        ("committed and never acknowledged", unknown),
    ):
        if ids:
            problems.append(f"{len(ids)} runs {what}, e.g. {ids[:3]}")
    with psycopg.connect(database_url, autocommit=True) as conn:
        archived = scalar(conn, f"SELECT count(*) FROM {RAW}")
        sent = sum(ledger.acknowledged.values())
        if archived != sent:
            problems.append(f"the raw archive holds {archived} rows, {sent} acknowledged")
        problems += oracle_problems(conn, RAW, rollup=True)
    return problems


def curve(times: list[RunTimes], end: float) -> list[tuple[float, float, int]]:
    """Per BUCKET_S seconds: (bucket start, rows committed per second, rows held at its end)."""
    buckets = int(end // BUCKET_S) + 1
    committed = [0] * buckets
    for t in times:
        committed[min(int(t.committed // BUCKET_S), buckets - 1)] += t.rows
    points = []
    for b in range(buckets):
        at = (b + 1) * BUCKET_S
        held = sum(t.rows for t in times if t.received <= at < t.committed)
        points.append((b * BUCKET_S, committed[b] / BUCKET_S, held))
    return points


def slowdowns(client: httpx.Client) -> dict[str, float]:
    """p50 and p99 of strata_run_slowdown for the raw stream, from its histogram buckets."""
    text = client.get("/metrics").text
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        if family.name == "strata_run_slowdown":
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels.get("stream") == RAW:
                    buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    found = {}
    for q in (0.5, 0.99):
        bound = next((le for le, n in buckets if total and n >= q * total), float("nan"))
        found[f"p{round(q * 100)}"] = bound
    return found


def draw(
    points: list[tuple[float, float, int]],
    probes: list[float],
    copy_rate: float,
    warm: float,
    path: Path,
) -> None:
    """Rows/s and rows held over time, against the COPY floor and 0.3× of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p[0] / 60 for p in points]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(xs, [p[1] for p in points], label="Strata: rows committed per second")
    top.axhline(copy_rate * 0.3, color="tab:red", linestyle="--", label="0.3 × COPY floor (goal)")
    top.axvline(warm / 60, color="grey", linestyle=":", label="end of the warm-up left out")
    top.set_ylabel("rows/s")
    top.legend(loc="lower right", fontsize=8)
    top.set_title(
        f"Sustained ingest; COPY floor {copy_rate:,.0f} rows/s; freshness p99 of 1,000-row "
        f"runs {percentile(probes, 0.99):.2f} s"
        if probes
        else "Sustained ingest"
    )
    bottom.plot(xs, [p[2] for p in points], color="tab:orange")
    bottom.set_ylabel("rows held (accepted, not committed)")
    bottom.set_xlabel("minutes")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# What a minute of posting may leave on disk, at most (raw and partial archives, WAL, the
# spool): the full run's ten minutes wrote over 10 GB on the 2-core machine, and a disk
# that fills stops PostgreSQL half-way, which the benchmark then reports only as a closed
# connection.
DISK_PER_MINUTE = 2.5e9


def check_disk(directory: Path, minutes: float, free: float | None = None) -> None:
    """Refuse to start when ``directory`` has less free space than ``minutes`` of posting
    may take (``free``: bytes free, measured when None)."""
    wanted = minutes * DISK_PER_MINUTE
    free = shutil.disk_usage(directory).free if free is None else free
    if free < wanted:
        raise BenchError(
            f"the sustained benchmark may write {wanted / 1e9:.1f} GB ({minutes:g} minutes of "
            f"posting) under {directory}, which has {free / 1e9:.1f} GB free: free some space "
            "or post for fewer --minutes"
        )


def run_benchmark(args: argparse.Namespace, picture: Path | None) -> tuple[int, list[Result]]:
    check_disk(Path(tempfile.gettempdir()), args.minutes)
    started = time.monotonic()
    data = generate(args.pool * args.run_rows, args.run_rows, args.seed)
    timings = [Timing("generate CSV", 0, time.monotonic() - started, f"{len(data.bodies)} bodies")]
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-"))
    server: Server | None = None
    exit_code = 0
    results: list[Result] = []
    try:
        server = start_server(
            data_dir, {"STRATA_MAX_SPOOL_SECONDS": format(args.max_spool_seconds, "g")}
        )
        timings += start_timings(server, server.database_url)
        with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT) as client:
            create_streams(client, RAW, rollup=True)
            copy = copy_baseline(server.database_url, data, PLAIN, COLUMNS)
            timings.append(copy)
            with psycopg.connect(server.database_url, autocommit=True) as conn:
                origin = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            ledger, errors, probes = Ledger(), [], []  # type: ignore[var-annotated]
            began = time.monotonic()
            until = began + args.minutes * 60
            threads = [
                threading.Thread(
                    target=writer,
                    args=(server.url, n, args.clients, data, until, ledger, errors),
                    daemon=True,
                )
                for n in range(args.clients)
            ]
            threads.append(
                threading.Thread(
                    target=prober,
                    args=(server.url, args.probe_every, until, ledger, probes, errors),
                    daemon=True,
                )
            )
            with PeakMemory(server.process.pid, pgdata(data_dir)) as peak:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                if errors:
                    raise BenchError("; ".join(errors))
                posted = time.monotonic() - began
                wait_committed(server.database_url, ledger, HTTP_TIMEOUT)
            drained = time.monotonic() - began
            slow = slowdowns(client)
        times = run_times(server.database_url, origin)
        end = max(t.committed for t in times)
        warm = args.warm_seconds
        steady_rows = sum(t.rows for t in times if t.committed > warm)
        steady_rate = steady_rows / (end - warm) if end > warm else 0.0
        total_rows = sum(t.rows for t in times)
        timings.append(
            Timing(
                "Strata, sustained",
                total_rows,
                drained,
                f"{len(times)} runs, {args.clients} clients posting {posted:.0f}s, "
                f"429s waited {ledger.refused_for_room}",
            )
        )
        points = curve(times, end)
        response = [t.committed - t.received for t in times if not t.run_id.startswith("probe")]
        checked = time.monotonic()
        problems = set_check(ledger, times, server.database_url)
        timings.append(Timing("verify", 0, time.monotonic() - checked, "; ".join(problems) or "ok"))
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        problems += stop_problems(code)
        print_table(timings)
        print(f"\n{'minute':>7} {'rows/s':>10} {'rows held':>10}")
        for at, rate, held in points:
            print(f"{at / 60:>7.2f} {rate:>10,.0f} {held:>10,}")
        held_max = max((p[2] for p in points), default=0)
        summary = {
            "rows": total_rows,
            "runs": len(times),
            "sustained_rows_per_s": round(steady_rate),
            "copy_rows_per_s": round(copy.rows_per_s),
            "ratio": round(steady_rate / copy.rows_per_s, 3),
            "freshness_p50_s": round(percentile(probes, 0.5), 3),
            "freshness_p99_s": round(percentile(probes, 0.99), 3),
            "response_p50_s": round(percentile(response, 0.5), 3),
            "response_p99_s": round(percentile(response, 0.99), 3),
            "slowdown_p50": slow["p50"],
            "slowdown_p99": slow["p99"],
            "rows_held_max": held_max,
            "max_spool_seconds": args.max_spool_seconds,
            "refused_429": ledger.refused_for_room,
            "peak_memory_mb": round(peak.total_mb),
        }
        print(json.dumps(summary))
        if picture is not None:
            draw(points, probes, copy.rows_per_s, warm, picture)
        minutes = f"{args.minutes:g} minute{'s' if args.minutes != 1 else ''}"
        context: dict[str, float | int | str] = {
            k: v for k, v in summary.items() if isinstance(v, int | float | str)
        }
        results = [
            Result(
                f"sustained ingest, {minutes} of runs of {args.run_rows:,} rows posted without "
                f"waiting by {args.clients} clients (rows/s after the first {warm:g} s)",
                steady_rate,
                copy.rows_per_s,
                "PostgreSQL COPY of the raw rows",
                "rows/s",
                "higher",
                notes=f"{peak.describe()}; curve in sustained.png",
                context=context,
            ),
            Result(
                f"freshness under sustained ingest: p99 of a 1,000-row run's POST to visible "
                f"({len(probes)} probes)",
                percentile(probes, 0.99),
                percentile(response, 0.99),
                "p99 response time of the loaded runs themselves",
                "s",
                "lower",
                context={"p50_s": round(percentile(probes, 0.5), 3)},
            ),
        ]
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:10]:
                print("  " + line[:300])
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
    "smoke": ["--minutes", "0.25", "--run-rows", "2000", "--pool", "6", "--clients", "2"]
    + ["--warm-seconds", "0"],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    picture = results_dir(scale) / "sustained.png"
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]), picture)
    if code:
        raise BenchError("the sustained ingest benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.clients <= 0 or args.run_rows <= 0 or args.pool <= 0:
        parser.error("--minutes, --clients, --run-rows and --pool must be positive")
    if args.max_spool_seconds < 0:
        parser.error("--max-spool-seconds must be 0 or more")
    picture = None if args.no_picture else Path(args.picture)
    return run_benchmark(args, picture)[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="posting time (10)")
    parser.add_argument("--clients", type=int, default=4, help="posting clients (4)")
    parser.add_argument("--run-rows", type=int, default=20_000, help="rows per run (20000)")
    parser.add_argument("--pool", type=int, default=60, help="distinct bodies posted in turn (60)")
    parser.add_argument(
        "--probe-every", type=float, default=2.0, help="seconds between freshness probes (2)"
    )
    parser.add_argument(
        "--warm-seconds",
        type=float,
        default=60.0,
        help="seconds from the start left out of the sustained figure: the warm-up transient (60)",
    )
    parser.add_argument(
        "--max-spool-seconds",
        type=float,
        default=30.0,
        help="the server's STRATA_MAX_SPOOL_SECONDS, a bound on the backlog's age (30; 0: none)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="random seed (2024)")
    parser.add_argument(
        "--picture",
        default=str(Path(tempfile.gettempdir()) / "sustained.png"),
        help="where to draw the curve when run alone (a temporary file)",
    )
    parser.add_argument("--no-picture", action="store_true", help="draw nothing")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    return parser


if __name__ == "__main__":
    sys.exit(main())
