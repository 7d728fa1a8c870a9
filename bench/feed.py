"""The change feed under ingest: how soon a subscriber sees a run's changes, how many changes
per second the feed carries, and what 1, 10 and 100 subscribers cost ingest.

    python -m bench.feed [--runs 30] [--run-rows 10000] [--subscribers 0,1,10,100] [--keep]

What it does, in one process tree:

1. generates ``--runs`` CSV bodies of ad impressions (bench.harness.impressions, a fifth of
   the runs late), before any timing, starts ``strata up`` (embedded PostgreSQL, local
   Spark) and posts the runs once, untimed, so that every phase meets a warm JVM;
2. one phase per entry of ``--subscribers``, each on a raw stream and derived streams of its
   own (the ingest benchmark's 1-minute count and revenue, 5-minute average and maximum):
   that many clients follow ``GET /streams/<raw>_1m/changes`` (Server-Sent Events, each its
   own HTTP connection and thread) and are connected (a progress event each) before 4
   clients post the same runs with ``wait=true``. The clock stops when every run is
   committed: ingest rows/s, against the phase without subscribers;
3. for each run, the first change event naming it at each subscriber, against the POST
   that sent it: the **change latency** (POST to event) beside the run's own freshness (POST
   to committed, the wait=true response); p50 and p99 over runs and subscribers;
4. **feed throughput**: the changes one subscriber received over the phase's seconds, and
   over all subscribers;
5. checks: every subscriber received every position once, in order, with no gap, and the
   changes applied to an empty table give the view (the last value of every key equals
   the view's row); the view equals its batch query over the raw archive.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg

from bench.harness.api import HTTP_TIMEOUT
from bench.harness.data import Dataset
from bench.harness.errors import BenchError
from bench.harness.impressions import create_streams, generate, oracle_problems
from bench.harness.percentile import percentile
from bench.harness.results import Result, Timing, check_scale, print_table
from bench.harness.server import Server, clean_up, start_server, start_timings, stop_server

POSTERS = 4


@dataclass
class Subscriber:
    """One SSE client of a stream's feed: every change it got, when, and its position."""

    url: str
    positions: list[int] = field(default_factory=list)
    rows: dict[tuple[str, datetime], dict[str, object] | None] = field(default_factory=dict)
    first_seen: dict[str, float] = field(default_factory=dict)  # run id -> monotonic time
    connected: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(10, read=None)) as client,
                client.stream("GET", self.url) as response,
            ):
                if response.status_code != 200:
                    raise BenchError(f"{self.url}: {response.status_code}")
                kind = None
                for line in response.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.startswith("event:"):
                        kind = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        data = json.loads(line.split(":", 1)[1], parse_float=Decimal)
                        self._event(kind, data)
                        kind = None
        except Exception as err:  # noqa: BLE001 - reported by the phase
            if not self.stop.is_set():
                self.error = repr(err)

    def _event(self, kind: str | None, data: dict[str, object]) -> None:
        if kind == "progress":
            self.connected.set()
            return
        now = time.monotonic()
        self.positions.append(int(str(data["position"])))
        key = data["key"]
        assert isinstance(key, dict), data
        self.rows[(key["campaign"], datetime.fromisoformat(key["t"]))] = data["new"]  # type: ignore[assignment]
        for run in data.get("runs") or []:  # type: ignore[attr-defined]
            self.first_seen.setdefault(str(run), now)


@dataclass
class Phase:
    subscribers: int
    raw: str
    ingest: Timing
    posted: dict[str, tuple[float, float]]  # run id -> (POST sent, response) monotonic
    followers: list[Subscriber]


def post_all(
    server: Server, data: Dataset, raw: str
) -> tuple[Timing, dict[str, tuple[float, float]]]:
    """Every body as a run of ``raw``, ``POSTERS`` clients, wait=true; the POST times."""
    posted: dict[str, tuple[float, float]] = {}
    local = threading.local()

    def post(index: int) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT)
        run_id = f"{raw}-{index:04d}"
        sent = time.monotonic()
        response = client.post(
            f"/streams/{raw}/runs",
            params={"wait": "true", "run_id": run_id},
            content=data.bodies[index],
            headers={"content-type": "text/csv"},
        )
        if response.status_code != 200:
            raise BenchError(f"run {run_id}: {response.status_code} {response.text}")
        posted[run_id] = (sent, time.monotonic())

    started = time.monotonic()
    with ThreadPoolExecutor(POSTERS) as pool:
        list(pool.map(post, range(len(data.bodies))))
    seconds = time.monotonic() - started
    return Timing("ingest", data.rows, seconds, f"{len(data.bodies)} runs"), posted


def run_phase(server: Server, data: Dataset, subscribers: int, raw: str | None = None) -> Phase:
    raw = raw or f"feed{subscribers}"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        create_streams(client, raw)
    url = f"{server.url}/streams/{raw}_1m/changes"
    followers = [Subscriber(url) for _ in range(subscribers)]
    threads = [threading.Thread(target=f.run, daemon=True) for f in followers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    for follower in followers:
        if not follower.connected.wait(max(0.0, deadline - time.monotonic())):
            raise BenchError(f"a subscriber of {raw}_1m did not connect: {follower.error}")
    ingest, posted = post_all(server, data, raw)
    ingest.name = f"ingest, {subscribers} subscribers"
    # Every subscriber gets every run's changes (the last run's first change at least).
    deadline = time.monotonic() + 300
    while any(set(posted) - set(f.first_seen) for f in followers):
        if time.monotonic() > deadline:
            raise BenchError(f"{raw}: subscribers still missing runs' changes after 300 s")
        time.sleep(0.1)
    time.sleep(2.0)  # the tail of the last commit's changes
    for follower in followers:
        follower.stop.set()
    return Phase(subscribers, raw, ingest, posted, followers)


def check_phase(database_url: str, phase: Phase) -> list[str]:
    problems = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        problems += oracle_problems(conn, phase.raw)
        view = {
            (c, t): (n, r)
            for c, n, r, t in conn.execute(
                f"SELECT campaign, c, revenue, t FROM {phase.raw}_1m"  # type: ignore[arg-type]
            )
        }
    for number, follower in enumerate(phase.followers):
        if follower.error:
            problems.append(f"{phase.raw} subscriber {number}: {follower.error}")
        first = follower.positions[0] if follower.positions else 0
        expected = list(range(first, first + len(follower.positions)))
        if follower.positions != expected:
            problems.append(f"{phase.raw} subscriber {number}: positions not 1 by 1 in order")
        applied = {
            k: (int(str(v["c"])), Decimal(str(v["revenue"])))
            for k, v in follower.rows.items()
            if v is not None
        }
        if applied != view:
            differ = len(set(applied.items()) ^ set(view.items()))
            problems.append(f"{phase.raw} subscriber {number}: {differ} rows differ from the view")
    return problems


def latencies(phase: Phase) -> tuple[list[float], list[float]]:
    """(POST to first change event, over runs and subscribers; POST to committed, per run)."""
    events = [
        f.first_seen[run] - sent
        for f in phase.followers
        for run, (sent, _) in phase.posted.items()
        if run in f.first_seen
    ]
    fresh = [done - sent for sent, done in phase.posted.values()]
    return events, fresh


def run_benchmark(args: argparse.Namespace) -> tuple[int, list[Result]]:
    started = time.monotonic()
    data = generate(args.runs * args.run_rows, args.run_rows, args.seed)
    timings = [Timing("generate CSV", 0, time.monotonic() - started, f"{len(data.bodies)} runs")]
    data_dir = Path(tempfile.mkdtemp(prefix="strata-bench-"))
    server: Server | None = None
    exit_code = 0
    results: list[Result] = []
    try:
        server = start_server(data_dir)
        timings += start_timings(server, server.database_url)
        # An untimed pass of the same runs first: the phases compared all meet a warm JVM.
        warm = run_phase(server, data, 0, "feedwarm")
        timings.append(Timing("warm-up (untimed)", 0, warm.ingest.seconds))
        phases = [run_phase(server, data, n) for n in args.subscribers]
        timings += [p.ingest for p in phases]
        problems = [p for phase in phases for p in check_phase(server.database_url, phase)]
        code, seconds = stop_server(server)
        timings.append(Timing("stop (SIGTERM)", 0, seconds, f"exit code {code}"))
        print_table(timings, phase_width=26)
        base = next((p for p in phases if p.subscribers == 0), phases[0])
        print(
            f"\n{'subscribers':>11} {'rows/s':>9} {'ratio':>6} {'event p50':>10} "
            f"{'p99':>7} {'fresh p50':>10} {'p99':>7} {'changes/s':>10} {'all subs':>10}"
        )
        for phase in phases:
            events, fresh = latencies(phase)
            changes = len(phase.followers[0].positions) if phase.followers else 0
            per_s = changes / phase.ingest.seconds
            ratio = phase.ingest.rows_per_s / base.ingest.rows_per_s
            print(
                f"{phase.subscribers:>11} {phase.ingest.rows_per_s:>9,.0f} {ratio:>6.2f} "
                + (
                    f"{percentile(events, 0.5):>10.3f} {percentile(events, 0.99):>7.3f} "
                    if events
                    else f"{'':>10} {'':>7} "
                )
                + f"{percentile(fresh, 0.5):>10.3f} {percentile(fresh, 0.99):>7.3f} "
                + f"{per_s:>10,.0f} {per_s * phase.subscribers:>10,.0f}"
            )
            if phase is not base:
                results.append(
                    Result(
                        f"ingest with {phase.subscribers} change-feed subscriber"
                        f"{'s' if phase.subscribers != 1 else ''} (4 clients, wait=true)",
                        phase.ingest.rows_per_s,
                        base.ingest.rows_per_s,
                        "the same runs with no subscriber",
                        "rows/s",
                        "higher",
                        context={"changes_per_s_per_subscriber": round(per_s)},
                    )
                )
            if events and phase.subscribers == 1:
                for q in (0.5, 0.99):
                    results.append(
                        Result(
                            f"change latency p{round(q * 100)}: POST of a run to its first "
                            "change at a subscriber",
                            percentile(events, q),
                            percentile(fresh, q),
                            "the run's own freshness (POST to committed, wait=true)",
                            "s",
                            "lower",
                            context={"changes": changes, "changes_per_s": round(per_s)},
                        )
                    )
        problems += [] if code == 0 else [f"the server exited with {code}"]
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
    "smoke": ["--runs", "6", "--run-rows", "500", "--subscribers", "0,1,3"],
    "full": [],
}


def benchmark(scale: str) -> list[Result]:
    """bench/run.py's entry (see bench.harness.results)."""
    code, results = run_benchmark(_parser().parse_args(SCALES[check_scale(scale)]))
    if code:
        raise BenchError("the change feed benchmark failed (see above)")
    return results


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(_parser().parse_args(argv))[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30, help="runs per phase (30)")
    parser.add_argument("--run-rows", type=int, default=10_000, help="rows per run (10000)")
    parser.add_argument(
        "--subscribers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[0, 1, 10, 100],
        help="subscribers of each phase (0,1,10,100)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="random seed (2024)")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    return parser


if __name__ == "__main__":
    sys.exit(main())
