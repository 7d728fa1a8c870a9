"""The ad-impression workload that several benchmarks share (ingest, peer_sss, soak): its
rows, runs of them (late as a profile of bench.harness.lateness says), its streams in
Strata, and the batch queries that check those streams.

A row is ``campaign,user_id,price,t``: one of 100 campaigns, a user id, a price of 0.0001
to 4.9999 with 4 decimals, and an event time.
"""

from __future__ import annotations

import math
import random

import httpx
import psycopg

from bench.harness.api import create_stream
from bench.harness.data import DAY_MS, Dataset, day_timestamp
from bench.harness.lateness import MIXED, Lateness, arrival_order, pick_late

RAW = "impsns"
PLAIN = "impsns_plain"  # the baselines' plain table of the same rows
COLUMNS = "campaign text, user_id bigint, price numeric(12,4), t timestamptz"
HEADER = "campaign,user_id,price,t\n"
CAMPAIGNS = [f"campaign_{i:03d}" for i in range(100)]


def impression(rng: random.Random, t: str) -> str:
    """One CSV line of an impression at the event time ``t``, the rest drawn from ``rng``."""
    cents = rng.randrange(1, 50_000)  # price in 1/10000: 0.0001 .. 4.9999
    campaign = rng.choice(CAMPAIGNS)
    user_id = rng.randrange(1, 10_000_000)
    return f"{campaign},{user_id},{cents // 10_000}.{cents % 10_000:04d},{t}\n"


# ---- runs of them, some late -------------------------------------------------------------


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
    late = pick_late(rng, runs, lateness)
    late_set = set(late)
    mixed = lateness.delay_ms is None
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
            lines.append(impression(rng, day_timestamp(ms)))
        bodies.append("".join(lines).encode())
        counts.append(n)
    if mixed and not lateness.jitter_ms:
        return Dataset(bodies, counts, late)
    order = arrival_order([(run + 1) * slice_ms for run in range(runs)], late_set, lateness, rng)
    return Dataset(
        [bodies[run] for run in order],
        [counts[run] for run in order],
        [index for index, run in enumerate(order) if run in late_set],
    )


# ---- streams and their oracles -----------------------------------------------------------

STREAMS = [
    f"CREATE STREAM {{raw}} ({COLUMNS}) WITH (event_time = 't'{{options}})",
    "CREATE STREAM {raw}_1m AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
    "window_end AS t FROM TUMBLE({raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
    "CREATE STREAM {raw}_5m AS SELECT campaign, avg(price) AS avg_price, "
    "max(price) AS max_price, window_end AS t "
    "FROM TUMBLE({raw}, t, INTERVAL '5 minutes') GROUP BY campaign, window_end",
]
# A third derived stream: an hourly roll-up of the 1-minute stream (its partial rows come
# from the 1-minute stream's, in the same Spark batch).
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
# The roll-up's oracle: a roll-up places each lower window by its start (docs/sql/rollups.md),
# so every row counts in the hour it falls in.
ROLLUP_ORACLE = {
    "_1h": (
        "campaign, c, revenue, t",
        "SELECT campaign, count(*), sum(price), "
        "date_bin('1 hour', t, '1970-01-01 00:00:00+00') + interval '1 hour' "
        "FROM {source} GROUP BY 1, 4",
    ),
}


def create_streams(
    client: httpx.Client, raw: str, delay: str | None = None, *, rollup: bool = False
) -> None:
    """The raw stream ``raw`` (with the watermark delay ``delay``, e.g. '10 minutes') and its
    two derived streams, and with ``rollup`` the hourly roll-up of the first."""
    options = f", delay = '{delay}'" if delay else ""
    for template in [*STREAMS, ROLLUP] if rollup else STREAMS:
        create_stream(client, template.format(raw=raw, options=options))


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
