"""Late data read while it is folded: a commit that brings late rows wakes the reducer and
the repairer at once, so the windows it reopened read like a plain table again after one
fold or repair, not after the workers' next interval. Meanwhile, and during
the folds and repairs, every view kind equals its batch query over the raw rows in every
snapshot a reader takes.

The workers' intervals here are an hour: whatever they fold or repair during the test,
they do because a commit woke them."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pyspark.sql import SparkSession

from server.workers.serial import Materializer
from tests.conftest import Strata, strata_client
from tests.oracle import START, SnapshotReader, execute, late_runs, ndjson, same

EPOCH = "timestamptz 'epoch'"
STREAMS = {
    # Tumbling, with the aggregates of every state kind (sums, a set, exact moments).
    "per_minute": (
        "SELECT campaign, count(*) AS n, sum(price) AS revenue, avg(price) AS mean, "
        "count(DISTINCT user_id) AS users, var_samp(price) AS spread, window_end AS t "
        "FROM TUMBLE(clicks, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    ),
    # Sliding: 3-minute windows every minute.
    "sliding": (
        "SELECT campaign, count(*) AS n, window_start FROM HOP(clicks, t, INTERVAL '1 minute', "
        "INTERVAL '3 minutes') GROUP BY campaign, window_start"
    ),
    # A roll-up onto the partials of per_minute.
    "per_five": (
        "SELECT campaign, sum(n) AS n, sum(revenue) AS revenue, window_end AS t "
        "FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') GROUP BY campaign, window_end"
    ),
    # Serial: MAX over COUNT, materialized and repaired.
    "busiest": (
        "SELECT max(n) AS top, count(*) AS campaigns, window_end AS t "
        "FROM TUMBLE(per_minute, t, INTERVAL '5 minutes') GROUP BY window_end"
    ),
    # Sketches.
    "sketched": (
        "SELECT campaign, approx_count_distinct(user_id) AS users, "
        "approx_percentile(price, 0.5) AS median, window_end AS t "
        "FROM TUMBLE(clicks, t, INTERVAL '10 minutes') GROUP BY campaign, window_end"
    ),
    # Sessions.
    "visits": (
        "SELECT campaign, count(*) AS n, window_start, window_end "
        "FROM SESSION(clicks, t, INTERVAL '40 seconds') GROUP BY campaign, window_start"
    ),
    # Top-N over an aggregate stream's rows.
    "leaders": (
        "SELECT campaign, n, t FROM (SELECT campaign, n, t, ROW_NUMBER() OVER (PARTITION BY t "
        "ORDER BY n DESC, campaign) AS rn FROM per_minute) x WHERE rn <= 2"
    ),
    # DISTINCT ON over an aggregate stream's rows: each minute's busiest campaign.
    "busiest_campaign": (
        "SELECT DISTINCT ON (t) t, campaign, n FROM per_minute ORDER BY t, n DESC, campaign"
    ),
    # An aggregate joined with a table.
    "by_owner": (
        "SELECT o.owner, sum(c.price) AS spent, count(*) AS n, window_start "
        "FROM TUMBLE(clicks, t, INTERVAL '1 minute') c JOIN owners o ON o.campaign = c.campaign "
        "GROUP BY o.owner, window_start"
    ),
    # Running totals over an aggregate stream's rows.
    "running": (
        "SELECT campaign, t, sum(n) OVER (PARTITION BY campaign ORDER BY t) AS total "
        "FROM per_minute"
    ),
}

# per_minute as a batch GROUP BY over the raw rows.
MINUTES = (
    f"SELECT campaign, count(*) AS n, sum(price) AS revenue, avg(price) AS mean, "
    f"count(DISTINCT user_id) AS users, var_samp(price) AS spread, "
    f"date_bin('1 minute', t, {EPOCH}) + interval '1 minute' AS t FROM clicks GROUP BY 1, 7"
)
# Each view and its batch query: the same rows in every snapshot.
ORACLES = {
    "SELECT * FROM per_minute": MINUTES,
    "SELECT * FROM sliding": (
        "SELECT campaign, count(*), w FROM clicks CROSS JOIN LATERAL generate_series("
        f"date_bin('1 minute', t, {EPOCH}) - interval '2 minutes', date_bin('1 minute', t, "
        f"{EPOCH}), interval '1 minute') AS w GROUP BY 1, 3"
    ),
    "SELECT * FROM per_five": (
        f"SELECT campaign, count(*)::numeric, sum(price), date_bin('5 minutes', t, {EPOCH}) "
        "+ interval '5 minutes' FROM clicks GROUP BY 1, 4"
    ),
    "SELECT * FROM busiest": (
        f"SELECT max(n), count(*), date_bin('5 minutes', t - interval '1 minute', {EPOCH}) "
        f"+ interval '5 minutes' FROM ({MINUTES}) m GROUP BY 3"
    ),
    # KMV counts exactly below 1,024 distinct values; the percentile from the same DDSketch
    # buckets, counted in PostgreSQL.
    "SELECT * FROM sketched": (
        "WITH buckets AS (SELECT campaign, date_bin('10 minutes', t, "
        f"{EPOCH}) + interval '10 minutes' AS t, strata_ddsketch_bucket(price::float8) AS b, "
        "count(*) AS n FROM clicks GROUP BY 1, 2, 3), "
        "medians AS (SELECT campaign, t, strata_ddsketch_quantile(jsonb_object_agg(b::text, n), "
        "0.5) AS median FROM buckets GROUP BY 1, 2) "
        "SELECT u.campaign, u.users, m.median, u.t FROM (SELECT campaign, count(DISTINCT "
        f"user_id) AS users, date_bin('10 minutes', t, {EPOCH}) + interval '10 minutes' AS t "
        "FROM clicks GROUP BY 1, 3) u JOIN medians m ON m.campaign IS NOT DISTINCT FROM "
        "u.campaign AND m.t = u.t"
    ),
    # A session starts at a row 40 seconds or more after the one before in its campaign.
    "SELECT * FROM visits": (
        "SELECT campaign, count(*), min(t), max(t) + interval '40 seconds' FROM (SELECT "
        "campaign, t, sum(starts) OVER (PARTITION BY campaign ORDER BY t ROWS UNBOUNDED "
        "PRECEDING) AS visit FROM (SELECT campaign, t, CASE WHEN lag(t) OVER (PARTITION BY "
        "campaign ORDER BY t) > t - interval '40 seconds' THEN 0 ELSE 1 END AS starts "
        "FROM clicks) s) v GROUP BY campaign, visit"
    ),
    "SELECT * FROM leaders": (
        "SELECT campaign, n, t FROM (SELECT campaign, n, t, ROW_NUMBER() OVER (PARTITION BY t "
        f"ORDER BY n DESC, campaign) AS rn FROM ({MINUTES}) m) x WHERE rn <= 2"
    ),
    "SELECT * FROM busiest_campaign": (
        "SELECT t, campaign, n FROM (SELECT t, campaign, n, ROW_NUMBER() OVER (PARTITION BY t "
        f"ORDER BY n DESC, campaign) AS rn FROM ({MINUTES}) m) x WHERE rn = 1"
    ),
    "SELECT * FROM by_owner": (
        f"SELECT o.owner, sum(c.price), count(*), date_bin('1 minute', c.t, {EPOCH}) "
        "FROM clicks c JOIN owners o ON o.campaign = c.campaign GROUP BY 1, 4"
    ),
    "SELECT * FROM running": (
        f"SELECT campaign, t, sum(n) OVER (PARTITION BY campaign ORDER BY t) FROM ({MINUTES}) m"
    ),
}
# Where the woken workers' work waits: partial rows not yet folded, windows not yet repaired.
WAITING = (
    "SELECT (SELECT count(*) FROM strata_internal.per_minute__partial) + (SELECT count(*) "
    "FROM strata_internal.sliding__partial) + (SELECT count(*) FROM "
    "strata_internal.per_five__partial) + (SELECT count(*) FROM "
    "strata_internal.sketched__partial) + (SELECT count(*) FROM strata_catalog.corrections)"
)


@pytest.fixture
def strata(fresh_db: str, spark: SparkSession, tmp_path) -> Iterator[Strata]:  # type: ignore[no-untyped-def]
    """Strata with the reducer and the repairer running, on intervals of an hour."""
    with strata_client(
        fresh_db,
        spark,
        tmp_path,
        workers=("backfill", "reducer", "repair"),
        reduce_interval=3600,
        serial_interval=3600,
    ) as instance:
        yield instance


def _clicks(rng: random.Random, first: float, last: float, count: int) -> str:
    """``count`` clicks at times between ``first`` and ``last`` seconds after START."""
    return ndjson(
        [
            {
                "campaign": rng.choice(["a", "b", "c", None]),
                "user_id": rng.randrange(40),
                "price": f"{rng.randrange(1, 2000) / 100:.2f}",
                "t": (START + timedelta(seconds=rng.uniform(first, last))).isoformat(),
            }
            for _ in range(count)
        ]
    )


def _settled(strata: Strata, timeout: float = 120) -> float:
    """Seconds until nothing waits for the reducer or the repairer."""
    started = time.monotonic()
    while strata.query(WAITING)[0][0]:
        assert time.monotonic() - started < timeout, "the woken workers left work waiting"
        time.sleep(0.05)
    return time.monotonic() - started


def test_every_view_kind_exact_while_late_runs_commit_and_wake_the_folds(
    strata: Strata,
) -> None:
    rng = random.Random(31)
    execute(strata, "CREATE TABLE owners (campaign text PRIMARY KEY, owner text)")
    execute(strata, "INSERT INTO owners VALUES ('a', 'ann'), ('b', 'bob'), ('c', 'ann')")
    strata.create(
        "CREATE STREAM clicks (campaign text, user_id bigint, price numeric(10,2), "
        "t timestamptz) WITH (event_time = 't')"
    )
    for name, query in STREAMS.items():
        strata.create(f"CREATE STREAM {name} AS {query}")
    # Forty minutes on time, in order: nothing late, so nothing woke the workers.
    for minute in range(0, 40, 10):
        strata.ingest("clicks", _clicks(rng, minute * 60, minute * 60 + 600, 50))
    waiting = strata.query(WAITING)[0][0]
    assert waiting > 0, "on-time runs wake nobody: their partial rows wait for the interval"
    # Fold and materialize everything, as the workers' intervals would have.
    reducer = strata.runtime.workers["reducer"]
    reducer.run_once()
    Materializer(strata.service.engine, strata.service.plans).run_once()
    assert strata.query("SELECT count(*) FROM strata_internal.busiest__serial")[0][0] > 0
    assert strata.query(WAITING)[0][0] == 0

    late_waits = []
    with SnapshotReader.of(strata.database_url, ORACLES, min_snapshots=10):
        for step in range(6):
            if step % 3 == 2:  # on time, moving the watermark on
                body = _clicks(rng, 2400 + step * 60, 2460 + step * 60, 20)
            else:  # minutes to half an hour late, into folded and materialized windows
                lateness = rng.choice([120, 600, 1800])
                body = _clicks(rng, 2400 - lateness, 2400 - lateness + 240, 25)
            strata.ingest("clicks", body)
            if step % 3 != 2:
                late_waits.append(_settled(strata))
        # Runs posted together, some late: commits wake workers already at work.
        posted = []
        for _ in range(3):
            first = rng.choice([0, 900, 2400])
            body = _clicks(rng, first, first + 300, 10)
            response = strata.post_run("clicks", body, wait=False)
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])
        for run_id in posted:
            run = strata.service.wait(strata.service.run(run_id), 120)  # type: ignore[arg-type]
            assert run.status == "committed", run
        _settled(strata)
    # The late runs were counted late, and the woken repairer revised serial windows.
    assert late_runs(strata, "clicks") >= 4
    serial = strata.client.get("/streams/busiest").json()["progress"]["serial"]
    assert serial["windows_revised"] > 0, serial
    for view, oracle in ORACLES.items():
        same(strata, view, oracle)
    # Woken, not waiting out an hour's interval: each late run's windows were folded and
    # repaired within seconds of its commit.
    assert max(late_waits) < 60, late_waits
    print(f"late run committed to nothing waiting: {sorted(late_waits)} s")
