"""Soak: a sustained ingest of on-time and late runs while clients query the views.

    python -m bench.soak [--minutes 10] [--writers 4] [--readers 10] [--run-rows 5000]
                         [--late 0.3] [--sample 30] [--keep]

What it does, in one process tree:

1. starts ``strata up`` as a real subprocess on a free port and a temporary data dir
   (embedded PostgreSQL, local Spark; bench.harness.server) and creates the raw stream
   ``impsns`` and the derived streams of the ad-impression workload (bench.harness.
   impressions: 1-minute count and revenue per campaign; 5-minute average and maximum
   price per campaign); one untimed run into
   streams of the same shape warms the Spark JVM up;
2. for ``--minutes``, ``--writers`` client threads post CSV runs of ``--run-rows`` rows back
   to back with ``wait=true`` (a request's latency is the time until its run is committed).
   Event time runs 60 times faster than the wall clock; a run is on time (rows from the
   last 10 event-time seconds) or, with probability ``--late``, late (rows from anywhere in
   the 6 event-time hours before). Meanwhile ``--readers`` clients query the views in
   PostgreSQL the way dashboards do (the last 5 minutes per campaign; one campaign's last
   hour; the top 10 campaigns by revenue over the last hour), ``--think`` seconds apart;
3. every ``--sample`` seconds it records the runs and rows committed, the request
   latencies, the queries answered, and the resident memory (RSS) of the server process
   and of its Spark driver JVM;
4. at the end it checks that nothing was lost: every acknowledged run committed, raw rows
   archived == rows acknowledged, and every view equals the same query as a batch
   GROUP BY over the raw archive; it exits non-zero otherwise.

Prints a table over time and one JSON line with the figures. tests/test_soak.py runs the
same loop for under a minute against a server of its own.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psutil
import psycopg

from bench.harness.errors import BenchError
from bench.harness.impressions import (
    CAMPAIGNS,
    HEADER,
    RAW,
    create_streams,
    impression,
    oracle_problems,
)
from bench.harness.percentile import percentile
from bench.harness.server import (
    Server,
    clean_up,
    log_problems,
    start_server,
    stop_problems,
    stop_server,
)
from server.engines.spark import driver_jvm

WARM_UP = "warmup"
EVENT_START = datetime(2024, 6, 1, 6, tzinfo=UTC)
EVENT_SPEED = 60  # event-time seconds per wall-clock second
LATE_SPAN = timedelta(hours=6)
ON_TIME_SPAN = timedelta(seconds=10)
QUERIES = {
    "last 5 minutes": (
        f"SELECT campaign, sum(c), sum(revenue) FROM {RAW}_1m "
        "WHERE t > %(now)s - interval '5 minutes' GROUP BY campaign"
    ),
    "one campaign, last hour": (
        f"SELECT t, c, revenue FROM {RAW}_1m "
        "WHERE campaign = %(campaign)s AND t > %(now)s - interval '1 hour' ORDER BY t"
    ),
    "top 10 campaigns, last hour": (
        f"SELECT campaign, max(max_price), avg(avg_price) FROM {RAW}_5m "
        "WHERE t > %(now)s - interval '1 hour' GROUP BY campaign ORDER BY 2 DESC LIMIT 10"
    ),
}


@dataclass(frozen=True)
class SoakConfig:
    seconds: float = 600.0
    writers: int = 4
    readers: int = 10
    run_rows: int = 5000
    late: float = 0.3
    sample: float = 30.0
    think: float = 0.2
    seed: int = 2024


@dataclass
class Sample:
    at_s: float
    runs: int  # committed so far
    rows: int
    runs_per_s: float  # over the interval since the previous sample
    rows_per_s: float
    latency_p50_s: float | None
    latency_p99_s: float | None
    queries_per_s: float
    server_rss_mb: float
    jvm_rss_mb: float | None


@dataclass
class SoakReport:
    config: SoakConfig
    seconds: float
    runs: int
    rows: int
    late_runs: int
    runs_per_s: float
    rows_per_s: float
    latency_p50_s: float
    latency_p99_s: float
    queries: int
    query_p50_ms: float
    query_p99_ms: float
    failed_requests: int
    failed_queries: int
    rows_lost: int
    problems: list[str]
    samples: list[Sample] = field(default_factory=list)

    def to_json(self) -> str:
        figures = asdict(self)
        figures["samples"] = [asdict(s) for s in self.samples]
        return json.dumps(figures)


class _Clock:
    """Event time: EVENT_SPEED times the wall clock since the soak began."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def now(self) -> datetime:
        return EVENT_START + timedelta(seconds=(time.monotonic() - self.started) * EVENT_SPEED)


@dataclass
class _Tally:
    """What the threads did, guarded by one lock; the sampler takes the new entries."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: int = 0
    rows: int = 0
    late_runs: int = 0
    failed_requests: int = 0
    failed_queries: int = 0
    latencies: list[float] = field(default_factory=list)
    query_ms: list[float] = field(default_factory=list)


def _body(rng: random.Random, rows: int, now: datetime, late: bool) -> bytes:
    span = LATE_SPAN if late else ON_TIME_SPAN
    lines = [HEADER]
    for _ in range(rows):
        t = now - span * rng.random()
        lines.append(impression(rng, t.isoformat()))
    return "".join(lines).encode()


def _write(
    url: str, index: int, config: SoakConfig, clock: _Clock, tally: _Tally, stop: threading.Event
) -> None:
    rng = random.Random(config.seed * 1000 + index)
    with httpx.Client(base_url=url, timeout=600) as client:
        sequence = 0
        while not stop.is_set():
            late = rng.random() < config.late
            body = _body(rng, config.run_rows, clock.now(), late)
            run_id = f"soak-{index}-{sequence}"
            sequence += 1
            while True:  # a client retries a run until it is acknowledged, same run id
                started = time.monotonic()
                try:
                    response = client.post(
                        f"/streams/{RAW}/runs",
                        params={"run_id": run_id, "wait": "true"},
                        content=body,
                        headers={"content-type": "text/csv"},
                    )
                    if response.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                with tally.lock:
                    tally.failed_requests += 1
                time.sleep(1)
            with tally.lock:
                tally.runs += 1
                tally.rows += config.run_rows
                tally.late_runs += late
                tally.latencies.append(time.monotonic() - started)


def _read(
    database_url: str,
    index: int,
    config: SoakConfig,
    clock: _Clock,
    tally: _Tally,
    stop: threading.Event,
) -> None:
    rng = random.Random(-config.seed * 1000 - index)
    queries = list(QUERIES.values())
    with psycopg.connect(database_url, autocommit=True) as conn:
        while not stop.wait(config.think):
            started = time.monotonic()
            try:
                params = {"now": clock.now(), "campaign": rng.choice(CAMPAIGNS)}
                conn.execute(rng.choice(queries), params).fetchall()  # type: ignore[arg-type]
            except psycopg.Error:
                with tally.lock:
                    tally.failed_queries += 1
                continue
            with tally.lock:
                tally.query_ms.append((time.monotonic() - started) * 1000)


def _rss_mb(process: psutil.Process | None) -> float | None:
    try:
        return process.memory_info().rss / 2**20 if process is not None else None
    except psutil.NoSuchProcess:
        return None


def _quantile(values: list[float], q: float) -> float | None:
    """The percentile (bench.harness.percentile) of ``values``; None when there are none."""
    return percentile(values, q) if values else None


def soak(url: str, database_url: str, server_pid: int, config: SoakConfig) -> SoakReport:
    """Run the soak against a running server with no streams yet; returns the figures."""
    with httpx.Client(base_url=url, timeout=600) as client:
        create_streams(client, RAW)
        # One run into streams of the same shape first, so that the soak does not start
        # with the first Spark jobs' JVM warm-up.
        create_streams(client, WARM_UP)
        client.post(
            f"/streams/{WARM_UP}/runs",
            params={"wait": "true"},
            content=_body(random.Random(config.seed), 1000, EVENT_START, late=True),
            headers={"content-type": "text/csv"},
        ).raise_for_status()
    server = psutil.Process(server_pid)
    clock = _Clock()
    tally = _Tally()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_write, args=(url, i, config, clock, tally, stop))
        for i in range(config.writers)
    ] + [
        threading.Thread(target=_read, args=(database_url, i, config, clock, tally, stop))
        for i in range(config.readers)
    ]
    for thread in threads:
        thread.start()
    samples: list[Sample] = []
    latencies: list[float] = []
    query_ms: list[float] = []
    last_at, last_runs, last_rows = 0.0, 0, 0
    try:
        while last_at < config.seconds - 1e-6:
            next_at = min(last_at + config.sample, config.seconds)
            time.sleep(max(0.0, clock.started + next_at - time.monotonic()))
            at = time.monotonic() - clock.started
            with tally.lock:
                runs, rows = tally.runs, tally.rows
                new_latencies, tally.latencies = tally.latencies, []
                new_queries, tally.query_ms = tally.query_ms, []
            latencies += new_latencies
            query_ms += new_queries
            interval = at - last_at
            samples.append(
                Sample(
                    at_s=round(at, 1),
                    runs=runs,
                    rows=rows,
                    runs_per_s=round((runs - last_runs) / interval, 2),
                    rows_per_s=round((rows - last_rows) / interval),
                    latency_p50_s=_quantile(new_latencies, 0.5),
                    latency_p99_s=_quantile(new_latencies, 0.99),
                    queries_per_s=round(len(new_queries) / interval, 1),
                    server_rss_mb=round(_rss_mb(server) or 0.0),
                    jvm_rss_mb=_rss_mb(driver_jvm(server_pid)),
                )
            )
            last_at, last_runs, last_rows = at, runs, rows
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    seconds = time.monotonic() - clock.started
    with tally.lock:  # runs committed after the last sample count too
        latencies += tally.latencies
        query_ms += tally.query_ms
        runs, rows, late_runs = tally.runs, tally.rows, tally.late_runs
        failed_requests, failed_queries = tally.failed_requests, tally.failed_queries
    archived, problems = _verify(database_url, runs, rows)
    return SoakReport(
        config=config,
        seconds=round(seconds, 1),
        runs=runs,
        rows=rows,
        late_runs=late_runs,
        runs_per_s=round(runs / seconds, 2),
        rows_per_s=round(rows / seconds),
        latency_p50_s=_quantile(latencies, 0.5) or 0.0,
        latency_p99_s=_quantile(latencies, 0.99) or 0.0,
        queries=len(query_ms),
        query_p50_ms=round(_quantile(query_ms, 0.5) or 0.0, 2),
        query_p99_ms=round(_quantile(query_ms, 0.99) or 0.0, 2),
        failed_requests=failed_requests,
        failed_queries=failed_queries,
        rows_lost=rows - archived,
        problems=problems,
        samples=samples,
    )


def _verify(database_url: str, runs: int, rows: int) -> tuple[int, list[str]]:
    """Raw rows archived, and what is wrong (empty when nothing was lost)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        counted = conn.execute(
            "SELECT count(*) FROM strata_catalog.runs WHERE stream = %s AND status = 'committed'",
            (RAW,),
        ).fetchone()
        archived_row = conn.execute(f"SELECT count(*) FROM {RAW}").fetchone()  # type: ignore[arg-type]
        assert counted is not None and archived_row is not None
        archived = int(archived_row[0])
        problems = oracle_problems(conn, RAW)
    if counted[0] != runs:
        problems.append(f"{counted[0]} runs committed, {runs} acknowledged")
    if archived != rows:
        problems.append(f"{archived} raw rows archived, {rows} acknowledged")
    return archived, problems


def print_report(report: SoakReport) -> None:
    print(
        f"{'at s':>7} {'runs':>7} {'runs/s':>7} {'rows/s':>8} {'p50 s':>6} {'p99 s':>6} "
        f"{'q/s':>6} {'server MB':>9} {'JVM MB':>7}"
    )
    for s in report.samples:

        def seconds(value: float | None) -> str:
            return f"{value:6.2f}" if value is not None else f"{'-':>6}"

        jvm = f"{s.jvm_rss_mb:7.0f}" if s.jvm_rss_mb is not None else f"{'-':>7}"
        print(
            f"{s.at_s:7.0f} {s.runs:7d} {s.runs_per_s:7.2f} {s.rows_per_s:8,.0f} "
            f"{seconds(s.latency_p50_s)} {seconds(s.latency_p99_s)} {s.queries_per_s:6.1f} "
            f"{s.server_rss_mb:9.0f} {jvm}"
        )
    rates = [s.rows_per_s for s in report.samples[1:]] or [0]
    print(
        f"\n{report.runs:,} runs ({report.late_runs:,} late), {report.rows:,} rows in "
        f"{report.seconds:.0f} s: {report.runs_per_s:.2f} runs/s, {report.rows_per_s:,.0f} "
        f"rows/s (per interval after the first: min {min(rates):,.0f}, median "
        f"{percentile(rates, 0.5):,.0f}, max {max(rates):,.0f}); ingest latency p50 "
        f"{report.latency_p50_s:.2f} s, p99 {report.latency_p99_s:.2f} s; {report.queries:,} "
        f"view queries, p50 {report.query_p50_ms:.1f} ms, p99 {report.query_p99_ms:.1f} ms; "
        f"failed requests {report.failed_requests}, failed queries {report.failed_queries}; "
        f"rows lost {report.rows_lost}"
    )


def run(args: argparse.Namespace) -> int:
    config = SoakConfig(
        seconds=args.minutes * 60,
        writers=args.writers,
        readers=args.readers,
        run_rows=args.run_rows,
        late=args.late,
        sample=args.sample,
        think=args.think,
        seed=args.seed,
    )
    data_dir = Path(tempfile.mkdtemp(prefix="strata-soak-"))
    server: Server | None = None
    failed = True
    try:
        server = start_server(data_dir)
        report = soak(server.url, server.database_url, server.process.pid, config)
        print_report(report)
        code, _seconds = stop_server(server)
        report.problems += stop_problems(code)
        trouble = log_problems(server)
        if trouble:
            print(f"\nserver log: {len(trouble)} warning/error lines, e.g.:")
            for line in trouble[:10]:
                print("  " + line[:300])
        print(report.to_json())
        if report.problems:
            print("\nWRONG:\n  " + "\n  ".join(report.problems), file=sys.stderr)
        failed = bool(report.problems)
    except BenchError as err:
        print(f"soak failed: {err}", file=sys.stderr)
    finally:
        clean_up(server, data_dir, failed=failed, keep=args.keep)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="duration (10)")
    parser.add_argument("--writers", type=int, default=4, help="ingest client threads (4)")
    parser.add_argument("--readers", type=int, default=10, help="view query clients (10)")
    parser.add_argument("--run-rows", type=int, default=5000, help="rows per run (5000)")
    parser.add_argument("--late", type=float, default=0.3, help="share of late runs (0.3)")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds per sample (30)")
    parser.add_argument("--think", type=float, default=0.2, help="seconds between queries (0.2)")
    parser.add_argument("--seed", type=int, default=2024, help="random seed (2024)")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
